//! A semaphore's permits are tried in one statement: `FOR UPDATE SKIP LOCKED` over the
//! permits' rows (row locking), or one `CASE` over `pg_try_advisory_xact_lock` calls that
//! stops at the first granted (advisory locking). Counted in the server's statement log.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey, Semaphore};
use tenure_postgres::lab::Postgres;
use tenure_postgres::PgLock;

const TTL: Duration = Duration::from_secs(10);
const PERMITS: u32 = 4;

/// The lock statements (`FOR UPDATE` or `pg_try_advisory_xact_lock`) the clients sent after
/// `mark`, from the server's statement log.
fn lock_statements_after(server: &Postgres, mark: &str) -> Vec<String> {
    let log = std::fs::read_to_string(server.dir().join("postgres.log")).unwrap();
    let (_, after) = log
        .rsplit_once(&format!("statement: {mark}"))
        .expect("the marker statement is in the server log");
    after
        .lines()
        .filter(|line| line.starts_with("app=tenure LOG:  statement:"))
        .filter(|line| line.contains("FOR UPDATE") || line.contains("pg_try_advisory_xact_lock"))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn every_permit_is_tried_in_one_statement() {
    let server = Postgres::start().await.unwrap();
    server.log_statements().await.unwrap();
    for locking in ["row", "advisory"] {
        let url = format!("{}?pool_size=2&locking={locking}", server.url());
        let connect = || async { PgLock::connect(&url).await.unwrap() };
        let (holder, other) = (connect().await, connect().await);
        let semaphore = |lock: PgLock| Semaphore::new(Arc::new(lock), PERMITS).unwrap();
        let (holder, other) = (semaphore(holder), semaphore(other));
        let name = LockKey::new(format!("uploads-{locking}")).unwrap();
        let mut held = Vec::new();
        for _ in 0..PERMITS {
            held.push(holder.try_acquire(&name, TTL).await.unwrap().unwrap());
        }

        let mark = format!("SELECT 'all {locking} permits held'");
        server.psql(&mark).await.unwrap();
        let next_xid = "SELECT txid_snapshot_xmax(txid_current_snapshot())";
        let before = server.psql(next_xid).await.unwrap();
        assert!(other.try_acquire(&name, TTL).await.unwrap().is_none());
        let sent = lock_statements_after(&server, &mark);
        assert_eq!(
            sent.len(),
            1,
            "{locking}: a full semaphore's try: {sent:#?}"
        );
        if locking == "advisory" {
            // As a single key's `NOWAIT`: a busy try assigns no transaction id.
            let after = server.psql(next_xid).await.unwrap();
            assert_eq!(before, after, "a busy advisory try spent a transaction id");
        }

        // Two permits come back: the next try takes one of them, in one statement again.
        let freed: Vec<_> = held.drain(1..3).collect();
        let freed_keys: Vec<LockKey> = freed.iter().map(|l| l.key().clone()).collect();
        for lease in freed {
            holder.release(lease).await.unwrap();
        }
        let mark = format!("SELECT 'two {locking} permits free'");
        server.psql(&mark).await.unwrap();
        let lease = other.try_acquire(&name, TTL).await.unwrap().unwrap();
        assert!(freed_keys.contains(lease.key()), "{locking}: a free permit");
        let sent = lock_statements_after(&server, &mark);
        assert_eq!(
            sent.len(),
            1,
            "{locking}: a try with two permits free: {sent:#?}"
        );
        // Only the permit it reported is held: once the holder lets the others go, a
        // third client gets every other permit.
        for lease in held {
            holder.release(lease).await.unwrap();
        }
        let third = semaphore(connect().await);
        let now = AcquireOptions::new(TTL).wait(Duration::ZERO);
        let mut again = Vec::new();
        for _ in 1..PERMITS {
            again.push(third.acquire(&name, &now).await.unwrap());
        }
        match third.acquire(&name, &now).await {
            Err(LockError::Timeout { .. }) => {}
            other => panic!("{locking}: a permit past the count: {other:?}"),
        }
        other.release(lease).await.unwrap();
        for lease in again {
            third.release(lease).await.unwrap();
        }
    }
}

/// A key's row is made by the first attempt that names it, so several keys of a fresh
/// name are tried in order from their first attempt on.
#[tokio::test]
async fn fresh_keys_are_taken_in_order() {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?pool_size=2", server.url());
    let (holder, other) = (
        PgLock::connect(&url).await.unwrap(),
        PgLock::connect(&url).await.unwrap(),
    );
    let keys: Vec<LockKey> = ["a", "b", "c"]
        .iter()
        .map(|k| LockKey::new(format!("fresh/{k}")).unwrap())
        .collect();
    let first = holder.try_acquire(&keys[0], TTL).await.unwrap().unwrap();
    let rows = || async {
        server
            .psql("SELECT count(*) FROM tenure_locks WHERE key LIKE 'fresh/%'")
            .await
            .unwrap()
    };
    assert_eq!(rows().await, "1", "only the held key has a row");
    let now = AcquireOptions::new(TTL).wait(Duration::ZERO);
    let second = other.acquire_any(&keys, &now).await.unwrap();
    assert_eq!(second.key(), &keys[1], "the first free key, in order");
    assert_eq!(rows().await, "3", "every key tried has its row");
    match other.acquire_any(&keys[..2], &now).await {
        Err(LockError::Timeout { .. }) => {}
        busy => panic!("both keys are held: {busy:?}"),
    }
    holder.release(first).await.unwrap();
    other.release(second).await.unwrap();
}
