//! The suite's FIFO scenario proves each waiter queued in the server before it starts the
//! next, so a waiter slow to reach the server cannot be overtaken and fail the scenario
//! for a reason that is not the backend's order; and what that count reads.

use crate::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey};
use tenure_conformance::proxy::ProxyMode;
use tenure_conformance::{suite, Ctx, Harness, Links, UrlHarness};
use tenure_postgres::lab::Postgres;
use tenure_postgres::PgLock;

const TTL: Duration = Duration::from_secs(10);

/// The suite's harness, except that the second client it makes — the scenario's first
/// waiter — reaches the server through a proxy that holds each chunk it sends for
/// [`SLOW`].
#[derive(Debug)]
struct SlowFirstWaiter {
    inner: UrlHarness,
    made: AtomicUsize,
    links: Mutex<Vec<Links>>,
}

/// Longer than the pause the scenario makes between waiters where it cannot count the
/// queue (150 ms), so without a count the second waiter queues first.
const SLOW: Duration = Duration::from_millis(400);

#[async_trait]
impl Harness for SlowFirstWaiter {
    fn name(&self) -> String {
        self.inner.name()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        if self.made.fetch_add(1, Ordering::SeqCst) != 1 {
            return self.inner.client().await;
        }
        let (lock, links) = self
            .inner
            .proxied_client(self.inner.query_options())
            .await?;
        for proxy in links.proxies() {
            proxy.set_mode(ProxyMode::Delay {
                up: SLOW,
                down: Duration::ZERO,
            });
        }
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(links);
        Ok(lock)
    }

    async fn queued(&self, key: &LockKey) -> Option<Result<usize, LockError>> {
        self.inner.queued(key).await
    }
}

async fn fifo_with_a_slow_first_waiter(options: &str) {
    let harness = SlowFirstWaiter {
        inner: harness::suite_harness(options, tenure_conformance::testbed::TestbedOptions::PLAIN)
            .await
            .unwrap(),
        made: AtomicUsize::new(0),
        links: Mutex::new(Vec::new()),
    };
    let ctx = Ctx::new(&harness, format!("slow-first-waiter{options}"));
    suite::waiters_are_served_fifo(&ctx).await.unwrap();
    let links = harness.links.lock().unwrap_or_else(PoisonError::into_inner);
    let delayed = links[0].proxies()[0].stats();
    assert!(
        delayed.bytes_up > 0,
        "the slow waiter sent nothing through its proxy: {delayed:?}"
    );
}

#[tokio::test]
async fn a_waiter_slow_to_queue_is_still_served_first_row_locks() {
    fifo_with_a_slow_first_waiter("").await;
}

#[tokio::test]
async fn a_waiter_slow_to_queue_is_still_served_first_advisory_locks() {
    fifo_with_a_slow_first_waiter("&locking=advisory").await;
}

/// [`PgLock::queued`] counts one key's holder and waiters, not its tries nor other keys.
async fn queued_counts_one_keys_holder_and_waiters(options: &str) {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?pool_size=2{options}", server.url());
    let connect = || async { PgLock::connect(&url).await.unwrap() };
    let (holder, waiter, other) = (connect().await, connect().await, connect().await);
    let key = |name: &str| LockKey::new(name).unwrap();
    let (hot, cold, unused) = (key("hot"), key("cold"), key("unused"));
    let held = holder.try_acquire(&hot, TTL).await.unwrap().unwrap();
    let cold_held = other.try_acquire(&cold, TTL).await.unwrap().unwrap();
    let waiting = tokio::spawn({
        let (waiter, hot) = (waiter.clone(), hot.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
            waiter.acquire(&hot, &opts).await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while holder.queued(&hot).await.unwrap() < 2 {
        assert!(Instant::now() < deadline, "the waiter was never counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(other.try_acquire(&hot, TTL).await.unwrap().is_none());
    assert_eq!(holder.queued(&hot).await.unwrap(), 2, "{options}: hot");
    assert_eq!(holder.queued(&cold).await.unwrap(), 1, "{options}: cold");
    assert_eq!(
        holder.queued(&unused).await.unwrap(),
        0,
        "{options}: unused"
    );

    holder.release(held).await.unwrap();
    let granted = waiting.await.unwrap().unwrap();
    assert_eq!(
        holder.queued(&hot).await.unwrap(),
        1,
        "{options}: hot, handed over"
    );
    waiter.release(granted).await.unwrap();
    other.release(cold_held).await.unwrap();
    assert_eq!(
        holder.queued(&hot).await.unwrap(),
        0,
        "{options}: hot, released"
    );
    assert_eq!(
        holder.queued(&cold).await.unwrap(),
        0,
        "{options}: cold, released"
    );
}

#[tokio::test]
async fn queued_counts_one_keys_holder_and_waiters_row_locks() {
    queued_counts_one_keys_holder_and_waiters("").await;
}

#[tokio::test]
async fn queued_counts_one_keys_holder_and_waiters_advisory_locks() {
    queued_counts_one_keys_holder_and_waiters("&locking=advisory").await;
}

/// `pg_locks` shows an advisory lock's 64-bit id in two unsigned halves: a key whose id is
/// negative is counted as well as one whose id is positive.
#[tokio::test]
async fn queued_reads_advisory_ids_of_either_sign() {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?pool_size=2&locking=advisory", server.url());
    let lock = PgLock::connect(&url).await.unwrap();
    let mut signs = Vec::new();
    for i in 0..8 {
        let key = LockKey::new(format!("sign-{i}")).unwrap();
        let held = lock.try_acquire(&key, TTL).await.unwrap().unwrap();
        assert_eq!(lock.queued(&key).await.unwrap(), 1, "{key}");
        lock.release(held).await.unwrap();
        assert_eq!(lock.queued(&key).await.unwrap(), 0, "{key}");
        let id = server
            .psql(&format!(
                "SELECT hashtextextended('\"public\".\"tenure_locks\":' || '{}', 0) < 0",
                lock.row_key(&key)
            ))
            .await
            .unwrap();
        signs.push(id);
    }
    assert!(
        signs.iter().any(|s| s == "t") && signs.iter().any(|s| s == "f"),
        "the keys' advisory ids cover both signs: {signs:?}"
    );
}
