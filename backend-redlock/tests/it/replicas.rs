//! `?wait_replicas=N` on Redlock: each node's grant counts only once `WAIT` says N of
//! that node's replicas have it (see `backend-redis/tests/it/replicas.rs` for a primary with
//! a replica).

use std::time::{Duration, Instant};

use tenure_api::{DistributedLock, LockKey};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redis::RedisLock;
use tenure_redlock::Redlock;

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("replicas/{name}")).unwrap()
}

/// On Redlock every node is a primary of its own: a node whose grant no replica confirms
/// does not count toward the majority (never a silently ignored option).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_nodes_without_replicas_grant_nothing_that_needs_one() {
    let cluster = RedisCluster::start(RedisOptions::default().nodes(3))
        .await
        .unwrap();
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    let url = format!(
        "redlock://{}?wait_replicas=1&wait_timeout_ms=50",
        hosts.join(",")
    );
    let lock = Redlock::connect(&url).await.unwrap();
    let k = key("redlock");
    let refused = lock.try_acquire(&k, TTL).await;
    assert!(
        matches!(refused, Err(ref e) if e.is_retryable()),
        "no majority of confirmed grants: {refused:?}"
    );
    // Each node's task releases its refused grant, also after the round has answered.
    let plain = RedisLock::connect(&cluster.nodes()[0].url()).await.unwrap();
    let lock_key = plain.lock_key(&k);
    let started = Instant::now();
    for node in cluster.nodes() {
        loop {
            let held = node.command(&["GET", &lock_key]).await.unwrap();
            if held.is_nil() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "every refused grant released: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
