//! Deadlines on a real server behind a fault proxy (issue 15): a grant whose reply comes
//! after the lease's deadline is refused (defect 2), and `acquire` keeps to its wait
//! (defect 9).

use std::time::{Duration, Instant};

use tenure_api::{DistributedLock, LockError, LockKey};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_redis::RedisLock;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("deadlines/{name}")).unwrap()
}

/// Loads the scripts on the server through `lock` (so that a later call is one round
/// trip, not `EVALSHA` + `NOSCRIPT` + `EVAL`).
async fn warm_up(lock: &RedisLock) {
    let lease = lock
        .try_acquire(&key("warm-up"), Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    lock.release(lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_comes_after_the_lease_deadline_is_refused_and_released() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let proxy = FaultProxy::start(node.addr()).await.unwrap();
    let lock = RedisLock::connect(&format!(
        "redis://{}?command_timeout_ms=30000",
        proxy.addr()
    ))
    .await
    .unwrap();
    let observer = RedisLock::connect(&node.url()).await.unwrap();
    warm_up(&lock).await;
    let k = key("late-grant");
    let ttl = Duration::from_secs(3);
    // The request reaches the server this late: the server's key lives until at least
    // `delay + ttl` after sending, but the holder's deadline (sent + ttl − drift) has
    // passed when the reply arrives.
    let delay = Duration::from_millis(3500);

    // A trial counts only if its fault fired: the request was held by the proxy.
    for trial in 1..=3 {
        proxy.set_mode(ProxyMode::Delay {
            up: delay,
            down: Duration::ZERO,
        });
        let started = Instant::now();
        let attempt = {
            let (lock, k) = (lock.clone(), k.clone());
            tokio::spawn(async move { lock.try_acquire(&k, ttl).await })
        };
        // Once the request sits in the proxy's queue, let everything else (the release
        // of a refused grant) through at once.
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set_mode(ProxyMode::Pass);
        let result = attempt.await.unwrap();
        let replied = started.elapsed();
        if replied < delay {
            eprintln!("trial {trial}: the request was not delayed ({replied:?}); again");
            if let Ok(Some(lease)) = result {
                lock.release(lease).await.unwrap();
            }
            continue;
        }
        let holder = observer.inspect(&k).await.unwrap();
        let checked = started.elapsed();
        match result {
            Ok(Some(lease)) => panic!(
                "a lease past its deadline was handed out: valid_until is {:?} before the reply",
                replied.saturating_sub(lease.valid_until() - started)
            ),
            Ok(None) => panic!("reported as held by another"),
            Err(LockError::Unavailable { message, .. }) => {
                assert!(message.contains("deadline"), "says why: {message}");
            }
            Err(e) => panic!("expected Unavailable, got {e}"),
        }
        assert!(
            holder.is_none(),
            "the refused grant was released, not left held: {holder:?}"
        );
        assert!(
            checked < delay + ttl,
            "checked ({checked:?}) before the key could have expired by itself"
        );
        return;
    }
    panic!("the delay never applied to the acquire request");
}
