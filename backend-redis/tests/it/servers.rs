//! Live-server tests for the Redis launchers (`tenure_redis::lab`), and for the lab's
//! fault proxy and clock shim on redis-server.
//!
//! Each test starts real servers from the installed binaries and asserts real effects.
//! Start-up times are printed as `STARTUP <kind>: <ms> ms` (run with `--nocapture`).

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tenure_conformance::proxy::ProxyMode;
use tenure_conformance::servers::{pid_alive, spawned_pids, ServerError};
use tenure_redis::lab::{
    self as redis, Persistence, RedisCluster, RedisOptions, RedisReplicaPair, Resp, RespConnection,
};

/// A test failure that prints its message readably (multi-line server logs included).
struct Failure(String);

impl<E: fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

type TestResult = Result<(), Failure>;

fn startup(kind: &str, since: Instant) {
    eprintln!("STARTUP {kind}: {} ms", since.elapsed().as_millis());
}

/// `PING` bounded by `ms`; `Err` describes a timeout or a connection error.
async fn ping_within(addr: SocketAddr, ms: u64) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_millis(ms), redis::ping(addr)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(_) => Err("timeout".into()),
    }
}

fn is_timeout(r: &Result<(), String>) -> bool {
    matches!(r, Err(e) if e == "timeout")
}

async fn get(addr: SocketAddr, key: &str) -> Result<Resp, Failure> {
    Ok(tokio::time::timeout(Duration::from_secs(5), redis::command(addr, &["GET", key])).await??)
}

async fn set(addr: SocketAddr, args: &[&str]) -> TestResult {
    let mut cmd = vec!["SET"];
    cmd.extend_from_slice(args);
    let r = tokio::time::timeout(Duration::from_secs(5), redis::command(addr, &cmd)).await??;
    assert!(r.is_ok(), "SET {args:?} answered {r:?}");
    Ok(())
}

/// Poll `cond` every 20 ms for up to `within`.
async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_single_node_starts() -> TestResult {
    let t = Instant::now();
    let c = RedisCluster::start(RedisOptions::default()).await?;
    startup("redis x1", t);
    assert_eq!(c.nodes().len(), 1);
    let node = &c.nodes()[0];
    ping_within(node.addr(), 2000).await?;
    assert!(node.url().starts_with("redis://127.0.0.1:"));
    // Clock offsets need the shim.
    assert!(matches!(
        node.set_clock_offset(1000),
        Err(ServerError::Unsupported { .. })
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_three_nodes_kill_restart_pause() -> TestResult {
    let t = Instant::now();
    let c = RedisCluster::start(RedisOptions::default().nodes(3)).await?;
    startup("redis x3", t);
    let [n0, n1, n2] = c.nodes() else {
        panic!("expected 3 nodes")
    };
    let ports: std::collections::HashSet<u16> = c.nodes().iter().map(|n| n.addr().port()).collect();
    assert_eq!(ports.len(), 3, "distinct ports");
    for n in c.nodes() {
        ping_within(n.addr(), 2000).await?;
    }
    set(n0.addr(), &["k", "v"]).await?;

    // Kill: PING fails on n0, others fine; the process is gone.
    let pid = n0.pid().expect("running");
    n0.kill().await?;
    n0.kill().await?; // idempotent
    assert!(!n0.is_running());
    assert_eq!(n0.pid(), None);
    assert!(!pid_alive(pid), "pid {pid} survived SIGKILL");
    let r = ping_within(n0.addr(), 1000).await;
    assert!(
        r.is_err() && !is_timeout(&r),
        "PING on a killed node: {r:?}"
    );
    ping_within(n1.addr(), 2000).await?;
    ping_within(n2.addr(), 2000).await?;
    assert!(matches!(n0.pause(), Err(ServerError::NotRunning { .. })));

    // Restart: same port, answers again, and without persistence the data is gone.
    n0.restart().await?;
    assert!(n0.is_running());
    assert_ne!(n0.pid(), Some(pid));
    ping_within(n0.addr(), 2000).await?;
    assert!(
        get(n0.addr(), "k").await?.is_nil(),
        "data survived a restart without persistence"
    );

    // Pause: PING times out (no error); resume: it works again.
    n1.pause()?;
    assert!(n1.is_paused() && n1.is_running());
    let r = ping_within(n1.addr(), 300).await;
    assert!(is_timeout(&r), "PING on a paused node: {r:?}");
    n1.resume()?;
    assert!(!n1.is_paused());
    ping_within(n1.addr(), 2000).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_aof_always_survives_restart() -> TestResult {
    let c =
        RedisCluster::start(RedisOptions::default().persistence(Persistence::AofAlways)).await?;
    let n = &c.nodes()[0];
    set(n.addr(), &["durable", "yes"]).await?;
    n.restart().await?;
    assert_eq!(
        get(n.addr(), "durable").await?.as_text().as_deref(),
        Some("yes")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults() -> TestResult {
    let c = RedisCluster::start(RedisOptions::default()).await?;
    let n = &c.nodes()[0];
    let proxy = n.proxy();
    let via = n.proxied_addr();
    assert_ne!(via, n.addr());
    assert_eq!(proxy.target(), n.addr());
    assert!(n.proxied_url().ends_with(&via.port().to_string()));

    // Pass.
    ping_within(via, 2000).await?;
    let mut existing = RespConnection::connect(via).await?;
    assert_eq!(
        existing.command(&["PING"]).await?,
        Resp::Simple("PONG".into())
    );
    let s = proxy.stats();
    assert!(
        s.accepted >= 2 && s.bytes_up > 0 && s.bytes_down > 0,
        "{s:?}"
    );

    // Blackhole: new and existing connections time out; direct still works.
    proxy.set_mode(ProxyMode::Blackhole);
    assert_eq!(proxy.mode(), ProxyMode::Blackhole);
    let r = ping_within(via, 300).await;
    assert!(is_timeout(&r), "PING through a black hole: {r:?}");
    let r = tokio::time::timeout(Duration::from_millis(300), existing.command(&["PING"])).await;
    assert!(
        r.is_err(),
        "existing connection through a black hole: {r:?}"
    );
    ping_within(n.addr(), 2000).await?;
    assert!(proxy.stats().bytes_blackholed > 0, "{:?}", proxy.stats());

    // Reset: existing connections get RST, new ones too.
    proxy.set_mode(ProxyMode::Pass);
    let mut existing = RespConnection::connect(via).await?;
    assert_eq!(
        existing.command(&["PING"]).await?,
        Resp::Simple("PONG".into())
    );
    let resets_before = proxy.stats().resets;
    proxy.set_mode(ProxyMode::Reset);
    let r = tokio::time::timeout(Duration::from_secs(2), existing.command(&["PING"])).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "existing connection after reset: {r:?}"
    );
    let r = ping_within(via, 1000).await;
    assert!(r.is_err() && !is_timeout(&r), "PING through reset: {r:?}");
    assert!(
        proxy.stats().resets >= resets_before + 2,
        "{:?}",
        proxy.stats()
    );

    // Delay up 200 ms: a round trip takes at least that.
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::from_millis(200),
        down: Duration::ZERO,
    });
    let t = Instant::now();
    ping_within(via, 2000).await?;
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "delayed PING took {took:?}"
    );

    // Back to pass: fast again.
    proxy.set_mode(ProxyMode::Pass);
    let t = Instant::now();
    ping_within(via, 2000).await?;
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );

    // Strand: the connections open now go silent for good (replies included), new
    // ones pass.
    let mut stranded = RespConnection::connect(via).await?;
    assert_eq!(
        stranded.command(&["PING"]).await?,
        Resp::Simple("PONG".into())
    );
    let dropped_before = proxy.stats().bytes_blackholed;
    proxy.strand();
    let r = tokio::time::timeout(Duration::from_millis(300), stranded.command(&["PING"])).await;
    assert!(r.is_err(), "a stranded connection: {r:?}");
    ping_within(via, 2000).await?;
    let r = tokio::time::timeout(Duration::from_millis(300), stranded.command(&["PING"])).await;
    assert!(r.is_err(), "still stranded after a new connection: {r:?}");
    assert!(
        proxy.stats().bytes_blackholed > dropped_before,
        "{:?}",
        proxy.stats()
    );

    // Stall: what the connections open now send reaches the server late, in order;
    // new connections pass at once.
    let mut stalled = RespConnection::connect(via).await?;
    assert_eq!(
        stalled.command(&["PING"]).await?,
        Resp::Simple("PONG".into())
    );
    proxy.stall(Duration::from_millis(1500));
    let sent = Instant::now();
    let (late, fresh) = tokio::join!(stalled.command(&["ECHO", "late"]), async {
        let mut fresh = RespConnection::connect(via).await?;
        let pong = fresh.command(&["PING"]).await?;
        Ok::<_, tenure_conformance::servers::ServerError>((pong, sent.elapsed()))
    });
    let (pong, answered) = fresh?;
    assert_eq!(pong, Resp::Simple("PONG".into()));
    assert!(
        answered < Duration::from_millis(1500),
        "a new connection passes at once ({answered:?})"
    );
    assert_eq!(late?, Resp::Bulk(Some(b"late".to_vec())), "delivered, late");
    assert!(
        sent.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        sent.elapsed()
    );
    let stats = proxy.stats();
    assert!(stats.bytes_stalled > 0, "{stats:?}");
    assert_eq!(
        stats.bytes_stalled_delivered, stats.bytes_stalled,
        "every stalled byte was delivered"
    );
    proxy.stall(Duration::ZERO);
    let sent = Instant::now();
    stalled.command(&["PING"]).await?;
    assert!(
        sent.elapsed() < Duration::from_millis(1500),
        "the stall lifted"
    );

    // The proxy is stable across a restart of its node.
    n.restart().await?;
    ping_within(via, 2000).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_shim_expires_keys() -> TestResult {
    let c = RedisCluster::start(RedisOptions::default().clock_shim(true)).await?;
    let n = &c.nodes()[0];
    set(n.addr(), &["k", "v", "PX", "10000"]).await?;
    let pttl = n.command(&["PTTL", "k"]).await?.as_int().unwrap_or(-9);
    assert!(pttl > 5000, "PTTL before the jump: {pttl}");

    n.set_clock_offset(20_000)?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let (expired, last) = loop {
        let r = get(n.addr(), "k").await?;
        if r.is_nil() || Instant::now() >= deadline {
            break (r.is_nil(), r);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(expired, "key still there after a +20 s jump: {last:?}");
    assert_eq!(n.command(&["PTTL", "k"]).await?.as_int(), Some(-2));

    // The server is alive and responsive under the shim (no libfaketime-style hang).
    assert!(n.is_running());
    ping_within(n.addr(), 2000).await?;
    set(n.addr(), &["k2", "v", "PX", "10000"]).await?;
    let pttl = n.command(&["PTTL", "k2"]).await?.as_int().unwrap_or(-9);
    assert!(pttl > 5000, "PTTL after the jump: {pttl}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replica_failover_loses_unreplicated_write() -> TestResult {
    let t = Instant::now();
    let pair = RedisReplicaPair::start().await?;
    startup("redis pair", t);
    let (p, r) = (pair.primary(), pair.replica());
    assert_eq!(
        r.info_field("replication", "role").await?.as_deref(),
        Some("slave")
    );

    set(p.addr(), &["replicated", "1"]).await?;
    pair.wait_synced().await?;
    assert_eq!(
        get(r.addr(), "replicated").await?.as_text().as_deref(),
        Some("1")
    );

    // Cut replication, write, lose the primary, promote the replica.
    pair.replication_link().set_mode(ProxyMode::Blackhole);
    set(p.addr(), &["unreplicated", "2"]).await?;
    // The write was sent towards the replica and dropped on the way.
    let dropped = eventually(Duration::from_secs(2), || async {
        pair.replication_link().stats().bytes_blackholed > 0
    })
    .await;
    assert!(dropped, "{:?}", pair.replication_link().stats());
    p.kill().await?;
    r.promote().await?;
    assert_eq!(
        r.info_field("replication", "role").await?.as_deref(),
        Some("master")
    );
    assert!(
        get(r.addr(), "unreplicated").await?.is_nil(),
        "an unreplicated write survived failover"
    );
    assert_eq!(
        get(r.addr(), "replicated").await?.as_text().as_deref(),
        Some("1")
    );
    set(r.addr(), &["after", "promotion"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_processes_outlive_their_handles() -> TestResult {
    // Plain drop.
    let c = RedisCluster::start(RedisOptions::default().nodes(2)).await?;
    let pids: Vec<u32> = c.nodes().iter().filter_map(|n| n.pid()).collect();
    assert_eq!(pids.len(), 2);
    let live = spawned_pids();
    assert!(
        pids.iter().all(|p| live.contains(p)),
        "{pids:?} not in {live:?}"
    );
    // A paused node is killed too.
    c.nodes()[1].pause()?;
    drop(c);
    for p in &pids {
        assert!(!pid_alive(*p), "pid {p} outlived its cluster");
        assert!(!spawned_pids().contains(p));
    }

    // A task that panics while holding a cluster.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let c = RedisCluster::start(RedisOptions::default())
            .await
            .expect("redis starts");
        tx.send(c.nodes()[0].pid().expect("running"))
            .expect("send pid");
        panic!("deliberate panic while holding a cluster");
    });
    let pid = rx.await?;
    assert!(task.await.is_err_and(|e| e.is_panic()));
    assert!(!pid_alive(pid), "pid {pid} outlived a panicking task");

    // catch_unwind around a synchronous body that panics while holding a pair.
    let pair = RedisReplicaPair::start().await?;
    let pids = [pair.primary().pid(), pair.replica().pid()];
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _pair = pair;
        panic!("deliberate panic in catch_unwind");
    }));
    assert!(caught.is_err());
    for p in pids.into_iter().flatten() {
        assert!(!pid_alive(p), "pid {p} outlived a panic");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_moves_when_its_port_is_taken() -> TestResult {
    let c = RedisCluster::start(RedisOptions::default().nodes(1)).await?;
    let n = &c.nodes()[0];
    let old = n.addr();
    n.kill().await?;
    let squatter = std::net::TcpListener::bind(old)?;
    n.restart().await?;
    assert_ne!(n.addr(), old, "moved off the taken port");
    assert_eq!(squatter.local_addr()?, old);
    ping_within(n.addr(), 5000).await?;
    ping_within(n.proxied_addr(), 5000).await?;
    let log = std::fs::read_to_string(n.log_path())?;
    assert!(
        log.contains("Address already in use"),
        "the fault fired:\n{log}"
    );
    Ok(())
}

/// Evidence a clock jump fired comes from the shimmed server itself: the offset it read,
/// recorded with its own pid — not from the harness having written the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_shim_records_the_offset_it_applies() -> TestResult {
    let c = RedisCluster::start(RedisOptions::default().clock_shim(true)).await?;
    let n = &c.nodes()[0];
    let applied = |want: i64| async move {
        eventually(Duration::from_secs(10), || async {
            let _ = ping_within(n.addr(), 2000).await; // the server reads its clock
            n.clock_applied() == Some((want, n.pid().expect("running")))
        })
        .await
    };
    assert!(
        applied(0).await,
        "no record of the initial offset: {:?}",
        n.clock_applied()
    );
    n.set_clock_offset(20_000)?;
    assert!(
        applied(20_000).await,
        "jump not recorded: {:?}",
        n.clock_applied()
    );
    n.set_clock_offset(0)?;
    assert!(
        applied(0).await,
        "undo not recorded: {:?}",
        n.clock_applied()
    );
    // A restarted server records for itself (its own pid).
    let before = n.pid();
    n.restart().await?;
    assert_ne!(n.pid(), before);
    assert!(
        applied(0).await,
        "no record from the new process: {:?}",
        n.clock_applied()
    );
    // Without the shim there is no evidence.
    let plain = RedisCluster::start(RedisOptions::default()).await?;
    assert_eq!(plain.nodes()[0].clock_applied(), None);
    Ok(())
}

/// `pause` returns once the server is stopped, and `resume` once it runs again: SIGSTOP and
/// SIGCONT are delivered asynchronously, and a request sent right after `pause` returned
/// could otherwise still be served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_return_once_they_took_effect() -> TestResult {
    let c = RedisCluster::start(RedisOptions::default()).await?;
    let n = &c.nodes()[0];
    let pid = n.pid().expect("running");
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
    };
    for i in 0..300 {
        n.pause()?;
        assert_eq!(state(), Some('T'), "round {i}: still running after pause()");
        n.resume()?;
        assert_ne!(
            state(),
            Some('T'),
            "round {i}: still stopped after resume()"
        );
    }
    Ok(())
}
