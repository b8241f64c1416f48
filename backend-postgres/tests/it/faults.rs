//! Postgres under real faults, beyond the fault suite every backend runs
//! (`tests/suite.rs`, `faults::`): terminated backends, crash recovery of the fence sequence,
//! connection slots, migrations, the fenced table. Each test asserts its expected
//! outcome and that its fault really fired.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, DistributedLock, FencingToken, Lease, LockError, LockExt, LockKey,
    ReleaseOutcome,
};
use tenure_conformance::History;
use tenure_postgres::lab::PgBouncer;
use tenure_postgres::lab::Postgres;
use tenure_postgres::{FencedTable, FencedWrite, PgLock};

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

async fn connect(server: &Postgres) -> PgLock {
    PgLock::connect(&format!("{}?pool_size=2", server.url()))
        .await
        .unwrap()
}

/// A client reaching the server through its fault proxy.
async fn connect_proxied(server: &Postgres) -> PgLock {
    PgLock::connect(&format!("{}?pool_size=2", server.proxied_url()))
        .await
        .unwrap()
}

/// Retries `try_acquire` for up to `limit` while the client reconnects.
async fn acquire_eventually(
    lock: &dyn DistributedLock,
    key: &LockKey,
    limit: Duration,
) -> Option<Lease> {
    let started = Instant::now();
    loop {
        match lock.try_acquire(key, TTL).await {
            Ok(lease) => return lease,
            Err(e) if e.is_retryable() && started.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire failed: {e}"),
        }
    }
}

/// `lock` recorded as `client` in `history`.
fn recorded(history: &History, client: usize, lock: PgLock) -> Arc<dyn DistributedLock> {
    history.recorded(client, Arc::new(lock))
}

/// Checks `history` and asserts it is safe: one holder at a time, tokens increasing,
/// nobody believing past what the server promised.
fn assert_safe(history: &History) {
    let report = history.check();
    assert!(report.is_safe(), "{report}");
}

async fn backend_alive(server: &Postgres, pid: i64) -> bool {
    let count = server
        .psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .await
        .unwrap();
    count == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_holder_loses_its_lease_and_the_next_client_acquires() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let pg_a = Arc::new(connect(&server).await);
    let a = history.recorded(0, pg_a.clone());
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("terminated");
    let ttl = Duration::from_secs(1);

    // A guard-held lease: the watchdog's next tick reports the loss.
    let guard = a.lock(&k, &AcquireOptions::new(ttl)).await.unwrap();
    let loss = history.lost_on(0, guard.lost_signal());
    let first = guard.lease().await.unwrap();
    let pid = first.handle().id;
    assert!(backend_alive(&server, pid).await);
    let killed = server
        .psql(&format!("SELECT pg_terminate_backend({pid})"))
        .await
        .unwrap();
    assert_eq!(
        killed, "t",
        "the fault fired: the holder's backend was terminated"
    );
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the guard reports the loss on its next tick");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("lease lost"), "{reason}");
    loss.await.unwrap();

    // Another client gets it at once (the server freed the row with the session).
    let second = b
        .acquire(&k, &AcquireOptions::new(TTL).wait(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(second.token() > first.token());
    assert_eq!(b.inspect(&k).await.unwrap().unwrap().owner, second.owner());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    b.release(second.clone()).await.unwrap();

    // A plain lease: the next extend is LeaseLost, release is NotHeld.
    let mut plain = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    assert!(plain.token() > second.token());
    let killed = server
        .psql(&format!(
            "SELECT pg_terminate_backend({})",
            plain.handle().id
        ))
        .await
        .unwrap();
    assert_eq!(killed, "t", "the fault fired");
    let err = a.extend(&mut plain, TTL).await.unwrap_err();
    assert!(matches!(err, LockError::LeaseLost { .. }), "{err:?}");
    assert_eq!(
        a.release(plain.clone()).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    // The holder may hear of the termination (the server's FATAL) before the backend has
    // exited and freed the row: wait for it in the server's queue rather than race it.
    let third = b
        .acquire(&k, &AcquireOptions::new(TTL).wait(Duration::from_secs(10)))
        .await
        .expect("free again once the terminated backend exits");
    assert!(third.token() > plain.token());
    assert_eq!(pg_a.held_count(), 0);
    assert_eq!(history.holds().len(), 4, "two grants each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_holder_is_cut_off_by_the_server_after_its_ttl() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect(&server).await);
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("silent");
    // Long enough for the inspect below to see the holder on a loaded machine.
    let ttl = Duration::from_secs(2);

    let mut stale = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let info = b.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.owner, stale.owner());
    assert_eq!(info.token, Some(stale.token()));
    let remaining = info
        .remaining
        .expect("same role: remaining time is visible");
    assert!(
        remaining <= ttl && remaining > Duration::ZERO,
        "{remaining:?}"
    );

    // A says nothing; B queues in the server and is woken when the server ends A's session.
    let waited_from = Instant::now();
    let fresh = b
        .acquire(&k, &AcquireOptions::new(TTL).wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let got_at = Instant::now();
    assert!(
        got_at >= stale.valid_until(),
        "taken over {:?} before A's deadline",
        stale.valid_until() - got_at
    );
    assert!(got_at - waited_from < ttl + Duration::from_secs(2));
    assert!(fresh.token() > stale.token());
    assert!(
        !backend_alive(&server, stale.handle().id).await,
        "the fault fired: the server ended the silent holder's session"
    );
    assert!(
        server
            .log_tail(64 * 1024)
            .contains("idle-in-transaction timeout"),
        "the server logged the idle-in-transaction timeout"
    );
    let err = a.extend(&mut stale, ttl).await.unwrap_err();
    assert!(matches!(err, LockError::LeaseLost { .. }), "{err:?}");
    assert_eq!(a.release(stale).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(b.inspect(&k).await.unwrap().unwrap().owner, fresh.owner());
    assert_eq!(b.release(fresh).await.unwrap(), ReleaseOutcome::Released);
    assert!(b.inspect(&k).await.unwrap().is_none());
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_restart_while_held_keeps_tokens_increasing() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect(&server).await);
    let k = key("crash");
    let mut issued = Vec::new();
    // Cross a sequence WAL-logging boundary (nextval logs 32 values ahead).
    for _ in 0..40 {
        let lease = a.try_acquire(&k, TTL).await.unwrap().unwrap();
        issued.push(lease.token());
        a.release(lease).await.unwrap();
    }
    let mut held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    issued.push(held.token());
    let highest = *issued.iter().max().unwrap();

    let pid_before = server.pid();
    server.restart().await.unwrap(); // SIGKILL, then crash recovery on the same data dir
    assert_ne!(
        server.pid(),
        pid_before,
        "the fault fired: a new postmaster"
    );

    let err = a.extend(&mut held, TTL).await.unwrap_err();
    assert!(matches!(err, LockError::LeaseLost { .. }), "{err:?}");
    // The crash ended the holder's belief: it learns so by the extend above.
    a.release(held).await.unwrap();
    let b = recorded(&history, 1, connect(&server).await);
    let after = acquire_eventually(&*b, &k, Duration::from_secs(10))
        .await
        .expect("the crash freed the lock");
    assert!(
        after.token() > highest,
        "token {} after the crash, but {highest} was issued before it",
        after.token()
    );
    // The old client recovers too (stale pooled and cached connections are replaced).
    b.release(after.clone()).await.unwrap();
    let again = acquire_eventually(&*a, &k, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(again.token() > after.token());
    a.release(again).await.unwrap();
    assert_eq!(history.holds().len(), 43, "42 grants to a, one to b");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_blocking_waiters_each_get_it_without_polling() {
    const WAITERS: usize = 16;
    let server = Postgres::start().await.unwrap();
    // Every statement is logged with its session's application name: the test counts
    // what the clients send once they are queued. (Statements, not pg_stat_database's
    // transaction counters: a backend flushes those at most once a second, so how much
    // of the set-up they still hold back at any instant is a matter of timing.)
    server.log_statements().await.unwrap();
    let holder = connect(&server).await;
    let k = key("sixteen");
    let held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(Arc::new(connect(&server).await));
    }
    let history = History::new();
    let mut tasks = Vec::new();
    for (i, lock) in clients.iter().enumerate() {
        let (lock, k) = (history.recorded(i, lock.clone()), k.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
            let lease = lock.acquire(&k, &opts).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
        }));
    }
    // The fault: all sixteen are queued in the server behind the holder.
    wait_queued(&server, WAITERS).await;
    // From here on, every statement the clients send is counted. Hold on a while: polling
    // clients (5–200 ms backoff) would send over a hundred statements in 1.5 s.
    const MARK: &str = "SELECT 'sixteen: queued'";
    server.psql(MARK).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        holder.release(held).await.unwrap(),
        ReleaseOutcome::Released
    );
    for task in tasks {
        task.await.unwrap();
    }
    let report = history.check();
    assert!(report.is_safe(), "{report}");
    assert_eq!(history.holds().len(), WAITERS, "each waiter got the lock");

    for lock in &clients {
        lock.close().await;
    }
    holder.close().await;
    // Once their backends are gone, everything they sent is in the log.
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let left = server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tenure'")
            .await
            .unwrap();
        if left == "0" {
            break;
        }
        assert!(Instant::now() < by, "{left} client backends still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(server.dir().join("postgres.log")).unwrap();
    let (_, after) = log
        .split_once(&format!("statement: {MARK}"))
        .expect("the marker statement is in the server log");
    let sent: Vec<&str> = after
        .lines()
        .filter(|line| {
            // Simple-protocol statements, and prepared ones (sqlx binds parameters).
            line.starts_with("app=tenure LOG:  statement:")
                || line.starts_with("app=tenure LOG:  execute ")
        })
        .collect();
    eprintln!("{WAITERS} queued blocking waiters and their holder then sent:\n{sent:#?}");
    // Each waiter, once granted: the session settings of its lock transaction (a
    // prepared `set_config`), the fence (the prepared holders-row `INSERT`), the
    // `COMMIT`, and the `UNLISTEN *` its dedicated connection sends as it closes. The
    // holder, granted before the mark: its `COMMIT` and `UNLISTEN *`: 66 in all. A few
    // to spare for a retried statement; one poll by each waiter (its batch and the
    // `ROLLBACK`) would add 32.
    let bound = WAITERS * 4 + 2 + WAITERS / 2;
    assert!(sent.len() > WAITERS, "the log shows the waiters' commits");
    assert!(
        sent.len() <= bound,
        "{} statements after queueing, more than {bound}: busy polling?",
        sent.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_try_acquire_at_any_point_leaves_no_ghost() {
    let server = Postgres::start().await.unwrap();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let k = key("cancel");
    let mut cancelled = 0;
    for step in 0..40u64 {
        let limit = Duration::from_micros(400 * step);
        match tokio::time::timeout(limit, a.try_acquire(&k, TTL)).await {
            Ok(lease) => {
                let lease = lease.unwrap().expect("free");
                a.release(lease).await.unwrap();
            }
            Err(_) => cancelled += 1,
        }
        // Dropping the future dropped its connection: the server rolls back at once.
        let started = Instant::now();
        let lease = b
            .acquire(&k, &AcquireOptions::new(TTL).wait(Duration::from_secs(3)))
            .await
            .unwrap_or_else(|e| panic!("ghost lock after cancelling at {limit:?}: {e}"));
        assert!(started.elapsed() < Duration::from_secs(2));
        b.release(lease).await.unwrap();
    }
    assert!(
        cancelled >= 5,
        "the fault fired: {cancelled} acquires were cancelled"
    );
    assert_eq!(a.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_rejects_a_stale_holder() {
    let server = Postgres::start().await.unwrap();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let history = History::new();
    let (ra, rb) = (
        history.recorded(0, Arc::new(a.clone())),
        history.recorded(1, Arc::new(b.clone())),
    );
    let k = key("fenced");
    let orders = FencedTable::new("public", "order_state").unwrap();
    orders.create(&a).await.unwrap();
    orders.create(&b).await.unwrap(); // idempotent

    let ttl = Duration::from_millis(300);
    let mut stale = ra.try_acquire(&k, ttl).await.unwrap().unwrap();
    let write = orders
        .write(&a, "order-1001", stale.token(), "pending")
        .await;
    assert_eq!(write.unwrap(), FencedWrite::Accepted);
    let write = orders
        .write(&a, "order-1001", stale.token(), "checked")
        .await;
    assert_eq!(
        write.unwrap(),
        FencedWrite::Accepted,
        "same token writes again"
    );

    // A pauses past its TTL; B takes over and writes.
    tokio::time::sleep(ttl * 2).await;
    let fresh = rb
        .acquire(&k, &AcquireOptions::new(TTL).wait(Duration::from_secs(3)))
        .await
        .unwrap();
    assert!(fresh.token() > stale.token());
    let write = orders
        .write(&b, "order-1001", fresh.token(), "processing")
        .await;
    assert_eq!(write.unwrap(), FencedWrite::Accepted);

    // A wakes and writes as if nothing happened: the database refuses it.
    let err = ra.extend(&mut stale, ttl).await.unwrap_err();
    assert!(
        matches!(err, LockError::LeaseLost { .. }),
        "the fault fired: A's lease is gone ({err:?})"
    );
    // A believed only until its deadline, before B's grant.
    assert_safe(&history);
    let write = orders
        .write(&a, "order-1001", stale.token(), "shipped")
        .await;
    assert_eq!(
        write.unwrap(),
        FencedWrite::Rejected {
            last_fence: fresh.token()
        }
    );
    let (fence, value) = orders.read(&b, "order-1001").await.unwrap().unwrap();
    assert_eq!((fence, value.as_str()), (fresh.token(), "processing"));
    assert!(orders.read(&b, "order-9").await.unwrap().is_none());
    let _ = FencingToken(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_held_is_enforced_with_a_clear_error() {
    let server = Postgres::start().await.unwrap();
    let lock = PgLock::connect(&format!("{}?max_held=2", server.url()))
        .await
        .unwrap();
    let one = lock.try_acquire(&key("one"), TTL).await.unwrap().unwrap();
    let two = lock.try_acquire(&key("two"), TTL).await.unwrap().unwrap();
    let err = lock.try_acquire(&key("three"), TTL).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("max_held=2"), "{err}");
    assert!(!err.is_retryable());
    lock.release(one).await.unwrap();
    let three = lock.try_acquire(&key("three"), TTL).await.unwrap().unwrap();
    assert_eq!(lock.held_count(), 2);
    lock.release(two).await.unwrap();
    lock.release(three).await.unwrap();
    assert_eq!(lock.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_use_migrations_are_safe() {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?schema=tenure_app&table=leases", server.url());
    let connects: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgLock::connect(&url).await })
        })
        .collect();
    let mut locks = Vec::new();
    for c in connects {
        locks.push(c.await.unwrap().unwrap());
    }
    let k = key("migrated");
    let lease = locks[0].try_acquire(&k, TTL).await.unwrap().unwrap();
    assert!(locks[7].try_acquire(&k, TTL).await.unwrap().is_none());
    locks[0].release(lease).await.unwrap();
    let tables = server
        .psql(
            "SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = 'tenure_app' \
             AND relkind IN ('r', 'S')",
        )
        .await
        .unwrap();
    assert_eq!(tables, "leases,leases_fence,leases_holders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_and_bad_settings_are_typed_errors() {
    let server = Postgres::start().await.unwrap();
    // TLS is compiled in and attempted: this server does not offer it.
    let err = PgLock::connect(&format!(
        "postgres://postgres:hunter2@{}/postgres?sslmode=require&connect_timeout_ms=2000",
        server.addr()
    ))
    .await
    .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("tls")
            || err.to_string().to_lowercase().contains("ssl"),
        "{err}"
    );
    // Nothing listens here.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = PgLock::connect(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{port}/postgres?connect_timeout_ms=1000"
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    // Unknown database: configuration.
    let err = PgLock::connect(&format!("postgres://postgres@{}/nope", server.addr()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A lease long enough that only a pushed loss (not the guard's deadline or its next
/// renewal) can tell the holder in time.
const LONG_TTL: Duration = Duration::from_secs(30);

/// Waits until `n` sessions are queued on a lock in the server.
async fn wait_queued(server: &Postgres, n: usize) {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: usize = server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            .await
            .unwrap()
            .parse()
            .unwrap();
        if waiting >= n {
            return;
        }
        assert!(Instant::now() < by, "only {waiting} of {n} waiters queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a contender waiting for `k` on `lock`; it returns its lease, the instant it was
/// granted, and whether the holder's `lost` signal said "lost" at that instant.
fn contend_against(
    lock: Arc<dyn DistributedLock>,
    k: &LockKey,
    holder: tenure_api::LostSignal,
) -> tokio::task::JoinHandle<(Lease, Instant, bool)> {
    let k = k.clone();
    tokio::spawn(async move {
        let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
        let lease = lock.acquire(&k, &opts).await.unwrap();
        // On the holder's own clock: had it been told by the moment of the grant?
        let (granted_at, told) = (Instant::now(), holder.is_lost());
        (lease, granted_at, told)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backend_is_reported_before_the_contender_is_granted() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect(&server).await);
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("terminated-push");
    let guard = a.lock(&k, &AcquireOptions::new(LONG_TTL)).await.unwrap();
    let loss = history.lost_on(0, guard.lost_signal());
    let first = guard.lease().await.unwrap();
    let contender = contend_against(b, &k, guard.lost_signal());
    wait_queued(&server, 1).await;

    let pid = first.handle().id;
    let killed = server
        .psql(&format!("SELECT pg_terminate_backend({pid})"))
        .await
        .unwrap();
    assert_eq!(
        killed, "t",
        "the fault fired: the holder's backend was terminated"
    );
    let (second, granted_at, told) = contender.await.unwrap();
    assert!(
        told,
        "the contender was granted {:?} after the kill while the holder still believed \
         it held the lock (deadline {:?} away)",
        granted_at.elapsed(),
        guard.deadline().saturating_duration_since(granted_at)
    );
    assert!(second.token() > first.token());
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("connection"), "{reason}");
    assert!(!backend_alive(&server, pid).await);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    loss.await.unwrap();
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_reported_before_the_contender_is_granted() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect(&server).await);
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("restart-push");
    let guard = a.lock(&k, &AcquireOptions::new(LONG_TTL)).await.unwrap();
    let loss = history.lost_on(0, guard.lost_signal());
    let first = guard.lease().await.unwrap();
    let contender = contend_against(b, &k, guard.lost_signal());
    wait_queued(&server, 1).await;

    let pid_before = server.pid();
    server.restart().await.unwrap();
    assert_ne!(
        server.pid(),
        pid_before,
        "the fault fired: a new postmaster"
    );
    let (second, granted_at, told) = contender.await.unwrap();
    assert!(
        told,
        "the contender was granted while the holder still believed it held the lock \
         (deadline {:?} away)",
        guard.deadline().saturating_duration_since(granted_at)
    );
    assert!(second.token() > first.token());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    loss.await.unwrap();
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_is_not_freed_before_its_deadline() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect_proxied(&server).await);
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("blackhole");
    let ttl = Duration::from_secs(2);
    let guard = a.lock(&k, &AcquireOptions::new(ttl)).await.unwrap();
    let loss = history.lost_on(0, guard.lost_signal());
    let first = guard.lease().await.unwrap();
    server
        .proxy()
        .set_mode(tenure_conformance::proxy::ProxyMode::Blackhole);
    let contender = contend_against(b, &k, guard.lost_signal());
    let (second, granted_at, told) = contender.await.unwrap();
    assert!(
        told && granted_at >= guard.deadline(),
        "the server freed the lock {:?} before the holder's deadline",
        guard.deadline().saturating_duration_since(granted_at)
    );
    assert!(
        server.proxy().stats().bytes_blackholed > 0,
        "the fault fired: the holder's renewal went into the blackhole"
    );
    assert!(second.token() > first.token());
    server
        .proxy()
        .set_mode(tenure_conformance::proxy::ProxyMode::Pass);
    let _ = guard.release().await;
    loss.await.unwrap();
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_ended_leases_give_their_lock_and_slot_back() {
    let server = Postgres::start().await.unwrap();
    let a = PgLock::connect(&format!("{}?max_held=2", server.url()))
        .await
        .unwrap();
    let b = connect(&server).await;
    let (one, two) = (key("dropped-1"), key("dropped-2"));
    // Dropped without release, on a long TTL.
    drop(a.try_acquire(&one, LONG_TTL).await.unwrap().unwrap());
    drop(a.try_acquire(&two, LONG_TTL).await.unwrap().unwrap());
    let started = Instant::now();
    for k in [&one, &two] {
        let lease = b
            .acquire(k, &AcquireOptions::new(TTL).wait(Duration::from_secs(20)))
            .await
            .unwrap_or_else(|e| panic!("a dropped lease still holds {k}: {e}"));
        b.release(lease).await.unwrap();
    }
    assert!(
        started.elapsed() < LONG_TTL / 2,
        "freed by the TTL, not by the drop"
    );
    // Their slots are back: two more locks fit under max_held=2.
    let three = a.try_acquire(&key("dropped-3"), LONG_TTL).await.unwrap();
    let three = three.expect("free key");
    let four = a.try_acquire(&key("dropped-4"), LONG_TTL).await.unwrap();
    let four = four.expect("free key");
    let err = a.try_acquire(&key("dropped-5"), TTL).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(
        err.to_string().contains("too many held locks") && err.to_string().contains("max_held=2"),
        "{err}"
    );
    // A lease whose transaction the server ended gives its slot back too, unreleased.
    let killed = server
        .psql(&format!(
            "SELECT pg_terminate_backend({})",
            three.handle().id
        ))
        .await
        .unwrap();
    assert_eq!(killed, "t", "the fault fired");
    let by = Instant::now() + Duration::from_secs(10);
    while a.held_count() > 1 {
        assert!(Instant::now() < by, "the ended lease still holds its slot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let five = a.try_acquire(&key("dropped-5"), TTL).await.unwrap();
    assert!(five.is_some());
    a.release(five.unwrap()).await.unwrap();
    a.release(four).await.unwrap();
    assert_eq!(a.release(three).await.unwrap(), ReleaseOutcome::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_hot_key_leave_slots_for_other_keys() {
    const WAITERS: usize = 3;
    let server = Postgres::start().await.unwrap();
    let a = Arc::new(
        PgLock::connect(&format!("{}?max_held=2", server.url()))
            .await
            .unwrap(),
    );
    let b = connect(&server).await;
    let hot = key("hot");
    let held = b.try_acquire(&hot, TTL).await.unwrap().unwrap();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (a, hot) = (a.clone(), hot.clone());
            tokio::spawn(async move {
                let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
                let lease = a.acquire(&hot, &opts).await.unwrap();
                a.release(lease).await.unwrap();
            })
        })
        .collect();
    wait_queued(&server, WAITERS).await;
    // Three waiters on one key, yet both held slots are free for other keys.
    let cold: Vec<_> = ["cold-1", "cold-2"].iter().map(|n| key(n)).collect();
    let mut leases = Vec::new();
    for k in &cold {
        let lease = a
            .try_acquire(k, TTL)
            .await
            .unwrap_or_else(|e| panic!("waiters on `hot` used up the slots of `{k}`: {e}"));
        leases.push(lease.expect("free key"));
    }
    for lease in leases {
        a.release(lease).await.unwrap();
    }
    b.release(held).await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    // Waiters have their own bound, with a clear error.
    let c = PgLock::connect(&format!("{}?max_waiting=1", server.url()))
        .await
        .unwrap();
    let held = b.try_acquire(&hot, TTL).await.unwrap().unwrap();
    let first = tokio::spawn({
        let (c, hot) = (c.clone(), hot.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
            c.acquire(&hot, &opts).await
        }
    });
    wait_queued(&server, 1).await;
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(5));
    let err = c.acquire(&hot, &opts).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("max_waiting=1"), "{err}");
    b.release(held).await.unwrap();
    c.release(first.await.unwrap().unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_out_of_connection_slots_is_unavailable_and_names_the_setting() {
    let server = Postgres::start().await.unwrap();
    // Leave ordinary roles 4 of the server's connection slots (max_connections=300).
    server
        .psql("CREATE ROLE app LOGIN; GRANT CREATE, USAGE ON SCHEMA public TO app")
        .await
        .unwrap();
    server
        .psql("ALTER SYSTEM SET superuser_reserved_connections = 296")
        .await
        .unwrap();
    server.restart().await.unwrap();
    let url = format!(
        "postgres://app@{}/postgres?pool_size=1&connect_timeout_ms=1000",
        server.addr()
    );
    let lock = PgLock::connect(&url).await.unwrap();
    let mut held = Vec::new();
    let err = loop {
        assert!(held.len() < 10, "the server never ran out of slots");
        match lock
            .try_acquire(&key(&format!("slot-{}", held.len())), TTL)
            .await
        {
            Ok(lease) => held.push(lease.expect("free key")),
            Err(e) => break e,
        }
    };
    assert!(!held.is_empty());
    assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("max_connections"), "{err}");
    // A client without a connection yet: its pool only times out, then asks the server
    // why (not "pool timed out").
    let err = match PgLock::connect(&url).await {
        Ok(other) => other.inspect(&key("slot-0")).await.unwrap_err(),
        Err(e) => e,
    };
    assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("max_connections"), "{err}");
    for lease in held {
        lock.release(lease).await.unwrap();
    }
}

/// Every connection the autocommit pool may open is busy (its only one waits behind
/// another session's lock on the holder table): a second caller is told the pool stayed
/// busy, not sent to open a connection of its own to learn why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_connections_all_stay_busy_says_so() {
    use sqlx::Connection as _;
    let server = Postgres::start().await.unwrap();
    let url = format!(
        "{}?pool_size=1&connect_timeout_ms=1000&request_timeout_ms=30000",
        server.url()
    );
    let lock = Arc::new(PgLock::connect(&url).await.unwrap());
    let mut blocker = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("LOCK TABLE public.tenure_locks_holders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let first = tokio::spawn({
        let lock = lock.clone();
        async move { lock.inspect(&key("busy-a")).await }
    });
    // The first caller holds the pool's connection once its read waits on the lock.
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = sqlx::query_scalar(waiting)
            .fetch_one(&mut blocker)
            .await
            .unwrap();
        if n >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the first caller never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = lock.inspect(&key("busy-b")).await;
    sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
    let err = second.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("all 1 connections of the pool stayed busy"),
        "{err}"
    );
    let first = first.await.unwrap();
    assert!(first.is_ok(), "the first caller is answered: {first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_transaction_dies_before_the_lease_starts_is_retried_not_lost() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect(&server).await);
    let b = recorded(&history, 1, connect(&server).await);
    let k = key("dies-at-grant");
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    // The fault: the server terminates the next holder's lock backend as its grant is
    // recorded (once), between the grant and the statement that starts its lease.
    server
        .psql(
            "CREATE TABLE killed (pid int); \
             CREATE FUNCTION kill_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM killed) THEN \
                 INSERT INTO killed VALUES (NEW.pid); PERFORM pg_terminate_backend(NEW.pid); \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER kill_once AFTER INSERT OR UPDATE ON tenure_locks_holders \
               FOR EACH ROW EXECUTE FUNCTION kill_once()",
        )
        .await
        .unwrap();
    let ttl = Duration::from_secs(1);
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(20));
        b.acquire(&key("dies-at-grant"), &opts).await
    });
    wait_queued(&server, 1).await;
    // Queued for more than ttl/8, so the grant re-arms the lease before handing it out.
    tokio::time::sleep(ttl / 4).await;
    a.release(held).await.unwrap();
    let lease = waiter.await.unwrap();
    let killed = server.psql("SELECT count(*) FROM killed").await.unwrap();
    assert_eq!(
        killed, "1",
        "the fault fired: a granted backend was terminated"
    );
    let lease = lease.unwrap_or_else(|e| panic!("acquire returned {e:?}"));
    assert!(lease.token() > FencingToken(1));
    // The dead grant was never handed out: one grant each, b's after a's release.
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

/// Defect: a `try_acquire` slowed past an eighth of its TTL (a loaded machine, a slow
/// link) counted its lease from a refresh statement sent at the end of the call, so the
/// client believed past what the server was first asked for: the invocation plus the TTL
/// (the checker's `BelievedPastPromise`, seen under load in the recorded fault tests). A
/// single-attempt grant now counts from the call's start; only a grant that waited in the
/// server's lock queue is refreshed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_try_acquire_counts_its_lease_from_the_call() {
    let server = Postgres::start().await.unwrap();
    let history = History::new();
    let a = recorded(&history, 0, connect_proxied(&server).await);
    let k = key("slow-try-acquire");
    let ttl = Duration::from_millis(600);
    let delay = Duration::from_millis(40);
    server
        .proxy()
        .set_mode(tenure_conformance::proxy::ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
    let invoked = Instant::now();
    let lease = a.try_acquire(&k, ttl).await.unwrap().expect("free");
    let took = invoked.elapsed();
    server
        .proxy()
        .set_mode(tenure_conformance::proxy::ProxyMode::Pass);
    assert!(
        took > ttl / 8,
        "the fault fired: the grant took {took:?}, more than an eighth of the TTL"
    );
    assert!(
        lease.valid_until() <= invoked + ttl,
        "the lease runs {:?} past the call's start plus its TTL",
        lease.valid_until() - (invoked + ttl)
    );
    assert_safe(&history);
    assert_eq!(a.release(lease).await.unwrap(), ReleaseOutcome::Released);
}

/// A pool connection used moments ago is not pinged again before the fence (sqlx pinged it
/// as it went back to the pool). When the server has ended it in between, the fence is
/// taken again on a connection pinged first: the caller sees nothing but its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_connection_ended_between_uses_costs_no_failed_acquire() {
    let server = Postgres::start().await.unwrap();
    let a = connect(&server).await;
    let k = key("ended-pool-connection");
    for round in 0..3 {
        let lease = a.try_acquire(&k, TTL).await.unwrap().expect("free key");
        a.release(lease).await.unwrap();
        let killed = server
            .psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = 'tenure' AND state = 'idle'",
            )
            .await
            .unwrap();
        assert_ne!(
            killed, "0",
            "the fault fired: a's idle connections were ended"
        );
        let lease = a
            .try_acquire(&k, TTL)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"))
            .expect("nobody else holds it");
        assert!(a.inspect(&k).await.unwrap().is_some());
        a.release(lease).await.unwrap();
    }
}

/// A role's or database's defaults never end a lock transaction before its lease: a
/// `statement_timeout` would cancel the blocking lock wait, an
/// `idle_in_transaction_session_timeout` would end the held transaction early. A client
/// logged in as a role whose defaults are both 300 ms waits 1.2 s in the server's lock
/// queue and holds for 1.2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roles_timeouts_never_end_a_lock_transaction() {
    let server = Postgres::start().await.unwrap();
    server
        .psql(
            "CREATE ROLE impatient LOGIN SUPERUSER; \
             ALTER ROLE impatient SET statement_timeout = '300ms'; \
             ALTER ROLE impatient SET idle_in_transaction_session_timeout = '300ms'",
        )
        .await
        .unwrap();
    let impatient_url = server.url().replace("postgres@", "impatient@");
    // The fault is armed: a plain session of the role has its statements cut at 300 ms.
    let mut plain = <sqlx::PgConnection as sqlx::Connection>::connect(&impatient_url)
        .await
        .unwrap();
    let cut = sqlx::query("SELECT pg_sleep(1)")
        .execute(&mut plain)
        .await
        .unwrap_err();
    assert!(cut.to_string().contains("statement timeout"), "{cut}");
    let a = connect(&server).await;
    let b = PgLock::connect(&impatient_url).await.unwrap();
    let k = key("impatient-role");
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(20));
        let lease = b.acquire(&key("impatient-role"), &opts).await;
        (b, lease)
    });
    wait_queued(&server, 1).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    a.release(held).await.unwrap();
    let (b, lease) = waiter.await.unwrap();
    let mut lease = lease.unwrap_or_else(|e| panic!("the waiter got {e:?}"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let notice = lease
        .loss_notice()
        .expect("a Postgres lease carries its loss notice");
    assert!(!notice.is_fired(), "lost: {:?}", notice.reason());
    b.extend(&mut lease, Duration::from_secs(5)).await.unwrap();
    assert_eq!(b.release(lease).await.unwrap(), ReleaseOutcome::Released);
}

/// A fresh server on which a grant was taken and released: the lock tables exist, for
/// triggers to be put on them.
async fn with_lock_tables() -> Postgres {
    let server = Postgres::start().await.unwrap();
    let warm = connect(&server).await;
    let lease = warm.try_acquire(&key("tables"), TTL).await.unwrap();
    warm.release(lease.expect("free")).await.unwrap();
    server
}

/// Defect: a role's (or database's) `tcp_user_timeout`, which any user may set, applied
/// to the lock connection: the server would then drop the lock session, and free the
/// lock, as soon as its keepalive probes went unanswered for that long (a network blip
/// far shorter than the lease). The lock connection switches it off, as it does the
/// keepalives and statement timeouts. Seen by a trigger on the lock table, which logs
/// the setting each session inserting a lock row runs under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roles_tcp_user_timeout_never_applies_to_a_lock_connection() {
    let server = with_lock_tables().await;
    server
        .psql(
            "CREATE ROLE hasty LOGIN SUPERUSER; \
             ALTER ROLE hasty SET tcp_user_timeout = 300; \
             CREATE TABLE seen (pid integer, tcp_user_timeout text); \
             CREATE FUNCTION log_setting() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               INSERT INTO seen VALUES (pg_backend_pid(), current_setting('tcp_user_timeout')); \
               RETURN NEW; END $$; \
             CREATE TRIGGER log_setting BEFORE INSERT ON tenure_locks \
               FOR EACH ROW EXECUTE FUNCTION log_setting()",
        )
        .await
        .unwrap();
    let hasty_url = server.url().replace("postgres@", "hasty@");
    // The fault is armed: a plain session of the role runs with it.
    let mut plain = <sqlx::PgConnection as sqlx::Connection>::connect(&hasty_url)
        .await
        .unwrap();
    let armed: String = sqlx::query_scalar("SHOW tcp_user_timeout")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(armed, "300");
    let lock = PgLock::connect(&hasty_url).await.unwrap();
    let k = key("hasty-role");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    let seen = server
        .psql(
            "SELECT s.tcp_user_timeout FROM seen s JOIN tenure_locks_holders h \
             ON h.pid = s.pid WHERE h.key = 'faults/hasty-role'",
        )
        .await
        .unwrap();
    assert_eq!(seen, "0", "the lock connection's tcp_user_timeout");
    lock.release(lease).await.unwrap();
}

/// Defect: the fence's durability rested on a startup option (`synchronous_commit=on`
/// on the pool's connections), which a pooler may drop: behind PgBouncer (as commonly
/// configured, `ignore_startup_parameters = options`), a role whose default is
/// `synchronous_commit = off` had its fences acknowledged before they were flushed, so a
/// crash could hand a token out again. The fence's own statement now sets it for its
/// transaction. The lock session's `tcp_user_timeout` (a startup option too) is switched
/// off again as the session opens. Seen by triggers that log the settings each write
/// runs under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_pooler_that_drops_startup_options_the_fence_is_still_durable() {
    let server = with_lock_tables().await;
    server
        .psql(
            "CREATE ROLE hasty LOGIN SUPERUSER; \
             ALTER ROLE hasty SET synchronous_commit = off; \
             ALTER ROLE hasty SET tcp_user_timeout = 300; \
             CREATE TABLE seen (what text, setting text); \
             CREATE FUNCTION log_setting() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               INSERT INTO seen VALUES (TG_ARGV[0], current_setting(TG_ARGV[0])); \
               RETURN NEW; END $$; \
             CREATE TRIGGER log_lock BEFORE INSERT ON tenure_locks \
               FOR EACH ROW EXECUTE FUNCTION log_setting('tcp_user_timeout'); \
             CREATE TRIGGER log_fence BEFORE INSERT OR UPDATE ON tenure_locks_holders \
               FOR EACH ROW EXECUTE FUNCTION log_setting('synchronous_commit')",
        )
        .await
        .unwrap();
    let pooler = PgBouncer::start(&server, &["hasty"]).await.unwrap();
    // The fault is armed: through the pooler, a startup option does not arrive.
    let with_option = format!(
        "{}?options=-c%20synchronous_commit%3Don",
        pooler.url("hasty")
    );
    let mut plain = <sqlx::PgConnection as sqlx::Connection>::connect(&with_option)
        .await
        .unwrap();
    let dropped: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(dropped, "off", "the pooler dropped the startup option");
    let lock = PgLock::connect(&pooler.url("hasty")).await.unwrap();
    let lease = lock
        .try_acquire(&key("pooled"), TTL)
        .await
        .unwrap()
        .expect("free");
    let seen = server
        .psql("SELECT string_agg(DISTINCT what || '=' || setting, ' ' ORDER BY what || '=' || setting) FROM seen")
        .await
        .unwrap();
    assert_eq!(seen, "synchronous_commit=on tcp_user_timeout=0");
    lock.release(lease).await.unwrap();
}

/// Defect: a grant's record whose reply came too late (the statement committed after the
/// client gave up on it) failed the attempt: the record is sent once more, and that
/// second statement found the grant's own live transaction already recorded and wrote
/// nothing, so `try_acquire` returned "could not be recorded" for a lock it held. With
/// records sent together this would fail every grant of a slow statement at once. The
/// second statement now replaces a record of its own transaction (with a newer token,
/// the only one handed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_committed_after_its_timeout_still_grants() {
    // The slowed statement writes its row, then waits: the second waits for it, and
    // replaces it once it commits.
    a_late_record_leaves_the_leases_token_recorded("AFTER", "late-record").await;
}

/// The other order: the first statement, slowed before it writes, reaches the holder row
/// after the second committed and its token was handed out. It never replaces a record
/// (only the second may), so the row keeps the lease's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_record_never_replaces_the_one_sent_again() {
    a_late_record_leaves_the_leases_token_recorded("BEFORE", "late-first-record").await;
}

/// Slows the first record statement of a grant by 3 s (a trigger `when` its row is
/// written, once), past the client's 2 s bound, so the grant sends its record again
/// (a second that waits for the first's row is then bound by 2 s too: 3 s leaves either
/// bound a second of slack);
/// then checks that the grant succeeded and its holder row names the lease's token.
async fn a_late_record_leaves_the_leases_token_recorded(when: &str, name: &str) {
    let server = Postgres::start().await.unwrap();
    let lock = PgLock::connect(&format!("{}?request_timeout_ms=2000", server.url()))
        .await
        .unwrap();
    // Creates the tables, and opens connections, before the fault.
    let warm = lock.try_acquire(&key(&format!("{name}/warm")), TTL).await;
    lock.release(warm.unwrap().expect("free")).await.unwrap();
    server
        .psql(&format!(
            "CREATE SEQUENCE fired; \
             CREATE FUNCTION slow_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF nextval('fired') = 1 THEN PERFORM pg_sleep(3); END IF; \
               RETURN NEW; END $$; \
             CREATE TRIGGER slow_once {when} INSERT OR UPDATE ON tenure_locks_holders \
               FOR EACH ROW EXECUTE FUNCTION slow_once()"
        ))
        .await
        .unwrap();
    let lease = lock.try_acquire(&key(name), TTL).await;
    let lease = lease
        .unwrap_or_else(|e| panic!("try_acquire returned {e:?}"))
        .expect("a free key");
    // Until the slowed statement is over.
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'";
    let started = Instant::now();
    while server.psql(sleeping).await.unwrap() != "0" {
        assert!(started.elapsed() < Duration::from_secs(20), "still asleep");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fired: u64 = server
        .psql("SELECT last_value FROM fired")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        fired >= 2,
        "the fault fired: a record slowed, then sent again ({fired})"
    );
    let recorded = server
        .psql(&format!(
            "SELECT token FROM tenure_locks_holders WHERE key = 'faults/{name}'"
        ))
        .await
        .unwrap();
    assert_eq!(
        recorded,
        lease.token().0.to_string(),
        "the lease's token is recorded"
    );
    assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
}

/// Grants that come while the pool's connections are busy share one fence statement and
/// its flushed commit (a client-side group commit), each still recorded with its own
/// token. Through a proxy that delays every reply by 300 ms and a pool of one
/// connection, 8 concurrent grants were recorded in 8 statements (8 transaction ids on
/// the holder rows) before; now the records queued behind the first go out together (2
/// statements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_queued_behind_a_busy_pool_share_one_fence_statement() {
    use tenure_conformance::proxy::ProxyMode;
    let server = Postgres::start().await.unwrap();
    let lock = PgLock::connect(&format!("{}?pool_size=1", server.proxied_url()))
        .await
        .unwrap();
    // Opens the pool's connection and 8 lock connections (kept for reuse) before the
    // delay, so that the grants below reach their records together.
    let grant_all = |prefix: &'static str| {
        let mut grants = tokio::task::JoinSet::new();
        for i in 0..8 {
            let lock = lock.clone();
            grants.spawn(async move {
                let key = key(&format!("{prefix}/{i}"));
                lock.try_acquire(&key, TTL)
                    .await
                    .unwrap()
                    .expect("a free key")
            });
        }
        grants.join_all()
    };
    for lease in grant_all("warm").await {
        lock.release(lease).await.unwrap();
    }
    let delay = Duration::from_millis(300);
    server.proxy().set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: delay,
    });
    let started = Instant::now();
    let leases = grant_all("shared").await;
    let took = started.elapsed();
    server.proxy().set_mode(ProxyMode::Pass);
    assert!(
        took >= 2 * delay,
        "the fault fired: the grants took {took:?}"
    );
    let rows = server
        .psql(
            "SELECT key || ' ' || token || ' ' || xmin::text FROM tenure_locks_holders \
             WHERE key LIKE 'faults/shared/_' ORDER BY key",
        )
        .await
        .unwrap();
    let rows: Vec<Vec<&str>> = rows.lines().map(|r| r.split(' ').collect()).collect();
    assert_eq!(rows.len(), 8, "{rows:?}");
    for lease in &leases {
        let row = rows
            .iter()
            .find(|r| r[0] == lease.key().as_str())
            .expect("every grant recorded");
        assert_eq!(
            row[1],
            lease.token().0.to_string(),
            "{row:?}: its own token"
        );
    }
    let mut tokens: Vec<u64> = leases.iter().map(|l| l.token().0).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "distinct tokens: {tokens:?}");
    let mut statements: Vec<&str> = rows.iter().map(|r| r[2]).collect();
    statements.sort_unstable();
    statements.dedup();
    assert!(
        statements.len() <= 4,
        "8 grants recorded in {} statements: {rows:?}",
        statements.len()
    );
    for lease in leases {
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
}

/// Locks held at once, released, and taken again reuse the same connections (no new
/// session per lock, which is what makes 64 concurrent locks cost as much as 64 pooled
/// queries); once unused for `idle_timeout_ms` those connections are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_locks_reuses_its_connections_then_closes_them_when_unused() {
    const BURST: usize = 12;
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?pool_size=2&idle_timeout_ms=3000", server.url());
    let a = PgLock::connect(&url).await.unwrap();
    let burst = |round: usize| {
        let a = &a;
        async move {
            let leases = futures::future::join_all((0..BURST).map(|i| async move {
                let k = key(&format!("burst-{round}-{i}"));
                a.try_acquire(&k, TTL).await.unwrap().expect("free key")
            }))
            .await;
            let pids: std::collections::BTreeSet<i64> =
                leases.iter().map(|l| l.handle().id).collect();
            for lease in leases {
                a.release(lease).await.unwrap();
            }
            pids
        }
    };
    let first = burst(0).await;
    let second = burst(1).await;
    assert_eq!(first.len(), BURST, "one connection per held lock");
    assert_eq!(
        second, first,
        "the second burst reused the first one's connections"
    );
    let list = first
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let query = format!("SELECT count(*) FROM pg_stat_activity WHERE pid IN ({list})");
    let open = || server.psql(&query);
    assert_eq!(
        open().await.unwrap(),
        BURST.to_string(),
        "cached, not closed"
    );
    let by = Instant::now() + Duration::from_secs(30);
    while open().await.unwrap() != "0" {
        assert!(Instant::now() < by, "unused connections were never closed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `locking=advisory` holds a transaction-level advisory lock and inserts no lock row. A
/// row-mode client of the same table is never granted the key while it is held: it
/// takes the row lock, but the grant cannot be recorded over the live holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locking_takes_no_row_and_excludes_every_other_client() {
    let server = Postgres::start().await.unwrap();
    let advisory_url = format!("{}?pool_size=2&locking=advisory", server.url());
    let advisory = PgLock::connect(&advisory_url).await.unwrap();
    let other = PgLock::connect(&advisory_url).await.unwrap();
    let row = connect(&server).await;
    let k = key("advisory");
    let lease = advisory
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free key");
    let pid = lease.handle().id;
    let locks = server
        .psql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = {pid}"
        ))
        .await
        .unwrap();
    assert_eq!(locks, "1", "the holder's session holds one advisory lock");
    let rows = server
        .psql("SELECT count(*) FROM tenure_locks WHERE key = 'faults/advisory'")
        .await
        .unwrap();
    assert_eq!(rows, "0", "no lock row in advisory mode");
    assert!(other.try_acquire(&k, TTL).await.unwrap().is_none());
    match row.try_acquire(&k, TTL).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("a row-mode client was granted a key held in advisory mode"),
        Err(e) => assert!(e.to_string().contains("other locking mode"), "{e}"),
    }
    let holder = row.inspect(&k).await.unwrap().expect("the advisory holder");
    assert_eq!(holder.owner, lease.owner());
    assert_eq!(
        advisory.release(lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = other
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free again");
    other.release(lease).await.unwrap();
}

/// Without a fault, a held lease is never reported lost: the socket watch between
/// extends must not take a stale readiness wake-up (an event the runtime delivers after
/// the reply it reported was read) for the server's `FATAL`. Many leases extended every
/// few milliseconds on two worker threads make such wake-ups frequent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_leases_are_never_reported_lost() {
    let server = Postgres::start().await.unwrap();
    for mode in ["row", "advisory"] {
        let lock = Arc::new(
            PgLock::connect(&format!(
                "{}?pool_size=2&max_held=32&locking={mode}",
                server.url()
            ))
            .await
            .unwrap(),
        );
        let holders: Vec<_> = (0..32)
            .map(|i| {
                let lock = lock.clone();
                tokio::spawn(async move {
                    let k = key(&format!("healthy-{mode}-{i}"));
                    let mut lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
                    let until = Instant::now() + Duration::from_secs(3);
                    let mut extends = 0;
                    while Instant::now() < until {
                        if let Err(e) = lock.extend(&mut lease, TTL).await {
                            return Err(format!("{k} lost after {extends} extends: {e}"));
                        }
                        extends += 1;
                        tokio::time::sleep(Duration::from_millis(1 + (extends % 3))).await;
                    }
                    assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
                    Ok(extends)
                })
            })
            .collect();
        let mut total = 0;
        for holder in holders {
            total += holder.await.unwrap().unwrap();
        }
        assert!(total > 1000, "only {total} extends ran in {mode} mode");
    }
}

/// Opening a connection is bounded by `connect_timeout_ms`, not by the per-statement
/// `request_timeout_ms` (a TLS and password handshake takes several round trips): a server
/// that never answers is given up on after the connect timeout, with `migrate` on (it
/// connects first) and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_is_bounded_by_connect_timeout_not_request_timeout() {
    use tenure_conformance::proxy::ProxyMode;
    let server = Postgres::start().await.unwrap();
    server.proxy().set_mode(ProxyMode::Blackhole);
    for migrate in ["true", "false"] {
        let url = format!(
            "{}?request_timeout_ms=100&connect_timeout_ms=1500&migrate={migrate}",
            server.proxied_url()
        );
        let started = Instant::now();
        let error = PgLock::connect(&url).await.unwrap_err();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(1400) && waited < Duration::from_secs(10),
            "migrate={migrate}: gave up after {waited:?}, not the connect timeout: {error}"
        );
        assert!(error.is_retryable(), "{error}");
    }
    assert!(
        server.proxy().stats().accepted >= 2,
        "the fault fired: both clients reached the black hole"
    );
}
