//! What is MySQL's own: lock names the server would confuse, another program's
//! `GET_LOCK`, a session the server ends, server defaults that must not end a lock early,
//! and tokens across a restart.

use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};
use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey, ReleaseOutcome};
use tenure_mysql::lab::MariaDb;
use tenure_mysql::MySqlLock;

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// Keys the server's `GET_LOCK` would confuse (case, trailing space, accents under its
/// collation) or refuse (past 64 characters) are distinct locks; a plain key's lock name
/// is the key itself, which another session sees held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_server_would_confuse_are_distinct_locks() {
    let server = MariaDb::start().await.unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let long = "x".repeat(300);
    let keys = [
        "job",
        "Job",
        "JOB",
        "job ",
        "jöb",
        "#job",
        &long[..65],
        &long,
    ];
    let mut held = Vec::new();
    for name in keys {
        let lease = lock.try_acquire(&key(name), TTL).await.unwrap();
        held.push(lease.unwrap_or_else(|| panic!("{name:?} shares a lock with another key")));
    }
    for name in keys {
        assert!(
            lock.try_acquire(&key(name), TTL).await.unwrap().is_none(),
            "{name:?} granted twice"
        );
    }
    assert_eq!(lock.lock_name(&key("job")), "job");
    let mut other = MySqlConnection::connect(&server.url()).await.unwrap();
    for name in keys {
        let lock_name = lock.lock_name(&key(name));
        assert!(lock_name.chars().count() <= 64, "{lock_name}");
        let used: Option<i64> = sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
            .bind(&lock_name)
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert!(used.is_some(), "{name:?}: {lock_name} is not held");
    }
    for lease in held {
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
}

/// A session of another program holding the lock name (`GET_LOCK`) keeps tenure out, is
/// shown as a foreign holder, and its release wakes tenure's waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_programs_get_lock_is_a_foreign_holder() {
    let server = MariaDb::start().await.unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let k = key("shared-with-python");
    let mut other = MySqlConnection::connect(&server.url()).await.unwrap();
    let got: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(lock.lock_name(&k))
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(got, 1);
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_none());
    let holder = lock.inspect(&k).await.unwrap().expect("a holder");
    assert!(holder.foreign, "{holder:?}");
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(20));
            lock.acquire(&k, &opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted beside the other program");
    let released = Instant::now();
    sqlx::query("DO RELEASE_LOCK(?)")
        .bind(lock.lock_name(&k))
        .execute(&mut other)
        .await
        .unwrap();
    let lease = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release, not by polling: {:?}",
        released.elapsed()
    );
    let holder = lock.inspect(&k).await.unwrap().expect("tenure holds it");
    assert!(!holder.foreign);
    assert_eq!(holder.token, Some(lease.token()));
    lock.release(lease).await.unwrap();
}

/// A session the server ends (`KILL`) fires the lease's loss notice without a renewal:
/// the holder's socket is watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_is_a_loss_pushed_to_the_holder() {
    let server = MariaDb::start().await.unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let k = key("killed");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    let notice = lease.loss_notice().expect("a loss notice").clone();
    let session = server
        .sql(&format!("SELECT IS_USED_LOCK('{}')", lock.lock_name(&k)))
        .await
        .unwrap();
    server.sql(&format!("KILL {session}")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !notice.is_fired() {
        assert!(Instant::now() < deadline, "no loss notice after the KILL");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut lease = lease;
    assert!(matches!(
        lock.extend(&mut lease, TTL).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_some(), "freed");
}

/// Server defaults that would end a session or a statement early — a one-second
/// `wait_timeout`, a one-second `max_statement_time` — neither end a held lock before
/// its TTL nor a blocking acquire before its wait: each session sets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_defaults_do_not_end_a_lock_or_a_wait_early() {
    let server = MariaDb::start().await.unwrap();
    server
        .sql("SET GLOBAL wait_timeout = 1; SET GLOBAL max_statement_time = 1")
        .await
        .unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let k = key("defaults");
    let lease = lock
        .try_acquire(&k, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(20));
            lock.acquire(&k, &opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !lease.loss_notice().unwrap().is_fired(),
        "the server's default wait_timeout ended the holder's session"
    );
    assert!(!waiter.is_finished(), "the wait ended early: {waiter:?}");
    assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    let lease = waiter.await.unwrap().expect("granted after the release");
    lock.release(lease).await.unwrap();
}

/// Tokens keep rising across a crash restart: the counter was committed before each
/// grant was reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_restart() {
    let server = MariaDb::start().await.unwrap();
    let url = server.url();
    let k = key("restart");
    let lock = MySqlLock::connect(&url).await.unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
        last = lease.token().get();
        lock.release(lease).await.unwrap();
    }
    tenure_conformance::servers::Node::restart(&server)
        .await
        .unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    assert!(lease.token().get() > last, "{} after {last}", lease.token());
    lock.release(lease).await.unwrap();
}

/// A server whose default is `autocommit=0` still gets each grant's counter committed:
/// a holder whose session is killed leaves its token behind, and the next grant's is
/// larger. Before, the counter's increment stayed in the session's open transaction and
/// was rolled back with it, so the next holder got the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_committed_on_a_server_without_autocommit() {
    let server = MariaDb::start().await.unwrap();
    server.sql("SET GLOBAL autocommit = 0").await.unwrap();
    let lock = MySqlLock::connect(&server.url()).await.unwrap();
    let k = key("autocommit");
    let first = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    let session = server
        .sql(&format!("SELECT IS_USED_LOCK('{}')", lock.lock_name(&k)))
        .await
        .unwrap();
    server.sql(&format!("KILL {session}")).await.unwrap();
    let other = MySqlLock::connect(&server.url()).await.unwrap();
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(10));
    let second = other.acquire(&k, &opts).await.unwrap();
    assert!(
        second.token() > first.token(),
        "{} after {}: the first grant's counter was rolled back",
        second.token(),
        first.token()
    );
    other.release(second).await.unwrap();
}

/// With `locking=row`, the lock is the key's row: another program's `SELECT … FOR
/// UPDATE` of it keeps tenure out (shown as held, with the last grant recorded), and its
/// commit lets tenure's waiter in; `inspect` of a free row finds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_is_shared_with_another_programs_select_for_update() {
    let server = MariaDb::start().await.unwrap();
    let url = format!("{}?locking=row", server.url());
    let lock = MySqlLock::connect(&url).await.unwrap();
    let k = key("row-shared");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    let first = lease.token();
    assert_eq!(
        lock.inspect(&k).await.unwrap().map(|h| h.owner),
        Some(lease.owner())
    );
    lock.release(lease).await.unwrap();
    assert!(
        lock.inspect(&k).await.unwrap().is_none(),
        "a free row is not held"
    );
    let mut other = MySqlConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql(
        "START TRANSACTION; \
         SELECT 1 FROM tenure_locks_rows WHERE name = 'row-shared' FOR UPDATE",
    )
    .fetch_all(&mut other)
    .await
    .unwrap();
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_none());
    assert!(
        lock.inspect(&k).await.unwrap().is_some(),
        "held by the other program"
    );
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(20));
            lock.acquire(&k, &opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted beside the other program");
    sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    assert!(lease.token() > first);
    lock.release(lease).await.unwrap();
}

/// Clients racing for keys' first use (their rows not yet inserted) with `locking=row`:
/// one is granted each key, the others are told at once that it is held. Before, a
/// loser's insert of the row waited behind the winner's lock of it until the request
/// timeout, and `try_acquire` failed with `Unavailable` ("insert the lock row … no reply").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_keys_first_use_race_grants_one_and_refuses_the_rest_at_once() {
    let server = MariaDb::start().await.unwrap();
    let url = format!("{}?locking=row", server.url());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(MySqlLock::connect(&url).await.unwrap());
    }
    for round in 0..6 {
        let k = key(&format!("first-use-{round}"));
        let tries = clients.iter().map(|lock| {
            let (lock, k) = (lock.clone(), k.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let lease = lock.try_acquire(&k, TTL).await;
                (lock, lease, started.elapsed())
            })
        });
        let mut granted = Vec::new();
        for joined in futures::future::join_all(tries).await {
            let (lock, lease, took) = joined.unwrap();
            let lease = lease.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(
                took < Duration::from_millis(2500),
                "round {round}: {took:?}"
            );
            granted.extend(lease.map(|lease| (lock, lease)));
        }
        assert_eq!(granted.len(), 1, "round {round}: one grant");
        for (lock, lease) in granted {
            lock.release(lease).await.unwrap();
        }
    }
}
