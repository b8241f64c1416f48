//! The launcher (`tenure_postgres::lab::Postgres`) on a live server: a crash restart keeps
//! what was committed, moves off a taken port and kills busy backends that left the
//! postmaster's process group; a pause stops every process; nothing is left behind in
//! shared memory.

use std::time::{Duration, Instant};

use tenure_conformance::servers::{pid_alive, poll_until, spawned_pids, Node, ServerError};
use tenure_postgres::lab::{PgServerOptions, Postgres};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_restart_keeps_commits() -> TestResult {
    let pg = Postgres::start().await?;
    assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:"));
    assert_eq!(pg.psql("select 1").await?, "1");
    pg.psql("create table t (v int); insert into t values (42)")
        .await?;

    let pid = pg.pid().expect("running");
    pg.restart().await?;
    assert!(!pid_alive(pid), "old postmaster or its backends survived");
    assert_ne!(pg.pid(), Some(pid));
    assert_eq!(pg.psql("select v from t").await?, "42");
    let log = std::fs::read_to_string(pg.log_path())?;
    assert!(
        log.contains("not properly shut down") || log.contains("redo"),
        "no crash recovery in the log"
    );

    // Through the proxy the port answers too.
    tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(pg.proxied_addr()),
    )
    .await??;

    drop(pg);
    assert!(!pid_alive(pid));
    Ok(())
}

/// A postmaster's dynamic shared-memory segments outlive a `SIGKILL`: as POSIX segments
/// (`/dev/shm/PostgreSQL.*`, the default) each server the suite started left one behind in
/// RAM-backed `/dev/shm`, about 880 (some 450 MB) per `./x test`. None may survive the handle, across
/// a crash restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_no_shared_memory_behind() -> TestResult {
    let pg = Postgres::start().await?;
    let mut found = shared_memory(&pg).await?;
    pg.restart().await?;
    found.extend(shared_memory(&pg).await?);
    assert!(!found.is_empty(), "no shared-memory segment found to check");
    drop(pg);
    let left: Vec<&String> = found
        .iter()
        .filter(|s| std::path::Path::new(s).exists())
        .collect();
    assert!(left.is_empty(), "shared memory left behind: {left:?}");
    Ok(())
}

/// The shared-memory segments `pg` uses: those its postmaster maps (readable where the
/// tests may trace another user's process) and the files in its `pg_dynshmem`.
async fn shared_memory(pg: &Postgres) -> Result<Vec<String>, ServerError> {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", pg.pid().expect("running")))
        .unwrap_or_default();
    let mut found: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|path| path.starts_with("/dev/shm/") || path.contains("/pg_dynshmem/"))
        .map(str::to_owned)
        .collect();
    let data = pg.psql("show data_directory").await?;
    let files = pg.psql("select pg_ls_dir('pg_dynshmem')").await?;
    found.extend(files.lines().map(|f| format!("{data}/pg_dynshmem/{f}")));
    Ok(found)
}

/// Postgres backends call `setsid()`, so killing the postmaster's process group misses
/// them; a busy backend (a CPU-bound query does not check for postmaster death) then
/// outlives its postmaster with the shared memory attached, and the restarted postmaster
/// refuses to start ("pre-existing shared memory block … is still in use"). This is what
/// made the matrix's Postgres restart fault leave the server down under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_kills_busy_backends() -> TestResult {
    let pg = std::sync::Arc::new(Postgres::start().await?);
    let busy = tokio::spawn({
        let pg = pg.clone();
        async move {
            pg.psql("select count(*) from generate_series(1, 4000000000)")
                .await
        }
    });
    let find = "select pid from pg_stat_activity where state = 'active' \
                and query like '%generate_series(1, 4%' and pid <> pg_backend_pid()";
    let deadline = Instant::now() + Duration::from_secs(30);
    let backend = loop {
        let found = pg.psql(find).await.unwrap_or_default();
        if !found.is_empty() {
            break found;
        }
        assert!(Instant::now() < deadline, "the busy query never showed up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let backend: u32 = backend.parse()?;
    assert!(pid_alive(backend));
    assert!(
        spawned_pids().contains(&backend),
        "a backend that left the postmaster's group is still listed as spawned"
    );
    let postmaster = pg.pid().expect("running");
    pg.restart().await?;
    assert!(
        !pid_alive(backend),
        "the busy backend outlived its postmaster"
    );
    assert_ne!(
        pg.pid(),
        Some(postmaster),
        "the fault fired: a new postmaster"
    );
    assert_eq!(pg.psql("select 1").await?, "1");
    assert!(busy.await?.is_err(), "the busy query was cut off");
    Ok(())
}

/// Between the kill and the start of a restart, the server's port is free and any process
/// may bind it (an outgoing connection, another test's server, a fault proxy): the restart
/// then moves the server to a fresh port, and its proxy follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_moves_when_its_port_is_taken() -> TestResult {
    let pg = Postgres::start().await?;
    pg.psql("create table t (v int); insert into t values (7)")
        .await?;
    let old = pg.addr();
    let pid = pg.pid().expect("running");
    pg.kill().await?;
    let squatter = std::net::TcpListener::bind(old)?;
    pg.restart().await?;
    assert!(!pid_alive(pid));
    assert_ne!(pg.addr(), old, "moved off the taken port");
    assert_eq!(squatter.local_addr()?, old, "the squatter kept its port");
    assert_eq!(pg.psql("select v from t").await?, "7", "same data dir");
    assert!(pg.url().contains(&pg.addr().to_string()));
    assert_eq!(pg.proxy().target(), pg.addr(), "the proxy follows");
    let log = std::fs::read_to_string(pg.log_path())?;
    assert!(
        log.contains("Address already in use"),
        "the fault fired:\n{log}"
    );
    Ok(())
}

/// A paused server is observed stopped (state `T`) — Postgres backends included, which left
/// the postmaster's process group — and running again after resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_the_postmaster_and_its_backends() -> TestResult {
    let pg = Postgres::start().await?;
    let backends = pg
        .psql("select pid from pg_stat_activity where backend_type <> 'client backend'")
        .await?;
    let backends: Vec<u32> = backends.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(!backends.is_empty(), "postgres runs helper processes");
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
    };
    // Signals are delivered asynchronously: wait for the stop to show.
    let all_in = |stopped: bool| {
        let (backends, pg) = (&backends, &pg);
        poll_until(
            Duration::from_secs(10),
            Duration::from_millis(20),
            move || async move {
                let is = |s: Option<char>| (s == Some('T')) == stopped;
                let helpers: Vec<Option<char>> = backends.iter().map(|&b| state(b)).collect();
                match is(Node::state(pg)) && helpers.iter().all(|&s| is(s)) {
                    true => Ok(()),
                    false => Err((Node::state(pg), helpers)),
                }
            },
            move |(postmaster, helpers)| {
                format!(
                    "every process {} (postmaster {postmaster:?}, helpers {helpers:?})",
                    if stopped { "stopped" } else { "running" }
                )
            },
        )
    };
    Node::pause(&pg)?;
    all_in(true).await?;
    Node::resume(&pg)?;
    all_in(false).await?;
    Node::probe(&pg).await?;
    Ok(())
}

/// Under the clock shim every server process reads the shifted wall clock — the session's
/// backend that answers `clock_timestamp()` too — and the shim's evidence names the
/// postmaster; without the shim an offset is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_shim_shifts_every_backend() -> TestResult {
    let plain = Postgres::start().await?;
    assert!(
        matches!(
            plain.set_clock_offset(1000),
            Err(ServerError::Unsupported { .. })
        ),
        "a server without the shim took an offset"
    );
    drop(plain);
    let pg = Postgres::start_with(PgServerOptions {
        clock_shim: true,
        ..PgServerOptions::default()
    })
    .await?;
    let skew = || async {
        let ms = pg
            .psql("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint")
            .await?
            .parse::<i64>()?;
        let here = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        Ok::<i64, Box<dyn std::error::Error>>(ms - i64::try_from(here.as_millis())?)
    };
    assert!(
        skew().await?.abs() < 5_000,
        "unshifted: {} ms",
        skew().await?
    );
    pg.set_clock_offset(3_600_000)?;
    // A fresh backend (each psql is one) reads the new offset on its first clock read.
    let shifted = skew().await?;
    assert!(
        (3_595_000..3_605_000).contains(&shifted),
        "shifted by {shifted} ms, not an hour"
    );
    let postmaster = pg.pid().expect("running");
    // Some process the postmaster forked and that still runs (a background worker) has
    // recorded the offset.
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            match pg.clock_applied() {
                Some(applied) if applied == (3_600_000, postmaster) => Ok(()),
                other => Err(other),
            }
        },
        |last| format!("the shim's evidence naming the postmaster, last {last:?}"),
    )
    .await?;
    pg.set_clock_offset(0)?;
    assert!(skew().await?.abs() < 5_000, "undone: {} ms", skew().await?);
    Ok(())
}
