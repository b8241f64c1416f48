//! `locking=lease`: leases are rows, not connections — a client holds far more than
//! `max_held` on its few pool connections — and a release wakes a waiter through
//! `NOTIFY`, long before the holder's TTL or the waiter's fallback re-check (5 s).

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockKey};
use tenure_postgres::lab::Postgres;
use tenure_postgres::PgLock;

const TTL: Duration = Duration::from_secs(60);

async fn lease_client(server: &Postgres) -> PgLock {
    let url = format!(
        "{}?locking=lease&max_held=4&pool_size=2&application_name=lease-test",
        server.url()
    );
    PgLock::connect(&url).await.unwrap()
}

#[tokio::test]
async fn leases_hold_no_connection_each() {
    let server = Postgres::start().await.unwrap();
    let lock = lease_client(&server).await;
    let mut held = Vec::new();
    for i in 0..200 {
        let key = LockKey::new(format!("jobs/{i}")).unwrap();
        let lease = lock.try_acquire(&key, TTL).await.unwrap();
        held.push(lease.unwrap_or_else(|| panic!("jobs/{i} is free")));
    }
    let connections = server
        .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lease-test'")
        .await
        .unwrap();
    let connections: usize = connections.trim().parse().unwrap();
    assert!(
        (1..=2).contains(&connections),
        "200 leases (max_held=4) on {connections} connections"
    );
    let live = server
        .psql("SELECT count(*) FROM tenure_locks_leases WHERE expires_at > clock_timestamp()")
        .await
        .unwrap();
    assert_eq!(live.trim(), "200", "one live row per lease");
    let listed = tenure_api::LockAdmin::holders(&lock, "jobs/")
        .await
        .unwrap();
    assert_eq!(listed.len(), 200, "holders lists every lease");
    assert!(listed
        .iter()
        .all(|(_, h)| h.remaining.is_some_and(|r| r <= TTL)));
    assert!(tenure_api::LockAdmin::doctor(&lock)
        .await
        .unwrap()
        .is_empty());
    for lease in held {
        lock.release(lease).await.unwrap();
    }
}

#[tokio::test]
async fn a_release_wakes_the_waiter() {
    let server = Postgres::start().await.unwrap();
    let (holder, waiter) = (lease_client(&server).await, lease_client(&server).await);
    let key = LockKey::new("nightly").unwrap();
    let first = holder.try_acquire(&key, TTL).await.unwrap().expect("free");
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
            let lease = waiter.acquire(&key, &opts).await;
            (Instant::now(), lease)
        }
    });
    // Let the waiter try, find the key held for a minute, and start listening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter returned while the key was held"
    );
    let released = Instant::now();
    holder.release(first).await.unwrap();
    let (granted, lease) = waiting.await.unwrap();
    let lease = lease.expect("the waiter gets the released key");
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_millis(2500),
        "granted {after:?} after the release: not woken by it (the re-check is 5 s)"
    );
    assert_eq!(
        holder.inspect(&key).await.unwrap().map(|h| h.owner),
        Some(lease.owner())
    );
}
