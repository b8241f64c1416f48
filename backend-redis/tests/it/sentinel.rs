//! `redis+sentinel://`: the client finds the primary through Sentinel and follows it
//! through a real failover (the primary killed, the sentinels promote a replica).

use std::time::Duration;

use tenure_api::{DistributedLock, LockError, LockKey};
use tenure_redis::lab::sentinel::RedisSentinels;
use tenure_redis::lab::{RedisNode, Resp};
use tenure_redis::RedisLock;

use crate::common;
use common::{extended, granted_on, still_held_then_handed_on, FAILOVER, TTL};

/// How long the sentinels wait before they call the primary down: long enough that a
/// loaded machine does not cause a failover of its own.
const DOWN_AFTER: Duration = Duration::from_secs(3);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("sentinel/{name}")).unwrap()
}

/// The first word of the node's `ROLE` answer (`master`, `slave`).
async fn role(node: &RedisNode) -> Option<String> {
    match node.command(&["ROLE"]).await.ok()? {
        Resp::Array(Some(parts)) => parts.first()?.as_text(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_both_replicas_survives_a_real_failover() {
    let group = RedisSentinels::start(DOWN_AFTER).await.unwrap();
    let holder = RedisLock::connect(&group.url()).await.unwrap();
    let k = key("held");
    let lease = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    // Both replicas have the grant before the primary dies, so whichever is promoted
    // has it (a grant only some replica has is the window wait_replicas narrows).
    for replica in &group.data_nodes()[1..] {
        let deadline = tokio::time::Instant::now() + FAILOVER;
        while replica
            .command(&["GET", &holder.lock_key(&k)])
            .await
            .unwrap()
            .is_nil()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "replication stalled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let old = group.primary().await.unwrap();
    old.kill().await.unwrap();
    let new = group.wait_failover(old.addr()).await.unwrap();
    assert_ne!(
        new.addr(),
        old.addr(),
        "the fault fired: another node is primary"
    );

    // The same client finds the new primary on its own, and the lease is still there.
    let lease = extended(&holder, &lease).await;
    let on_new = new.command(&["GET", &holder.lock_key(&k)]).await.unwrap();
    let value = on_new.as_text().expect("the new primary has the lock key");
    assert!(value.starts_with(&lease.owner().to_string()), "{value}");

    // A client that connects now is sent to the new primary, and finds the lock held.
    let other = RedisLock::connect(&group.url()).await.unwrap();
    still_held_then_handed_on(&holder, &other, &k, lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_new_one() {
    let group = RedisSentinels::start(DOWN_AFTER).await.unwrap();
    let lock = RedisLock::connect(&group.url()).await.unwrap();
    let k = key("demoted");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    lock.release(lease).await.unwrap();

    // A manual failover: the sentinels promote a replica and turn the old primary into
    // a replica of it, which stays up (and drops its clients' connections).
    let old = group.primary().await.unwrap();
    let reply = group.sentinels()[0]
        .command(&["SENTINEL", "FAILOVER", "tenure"])
        .await
        .unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    let new = group.wait_failover(old.addr()).await.unwrap();
    let deadline = tokio::time::Instant::now() + FAILOVER;
    while role(&old).await.as_deref() != Some("slave") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fault fired: the old primary became a replica (ROLE {:?})",
            role(&old).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    granted_on(&lock, &k, &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_stops_answering_is_replaced_after_a_timeout() {
    let group = RedisSentinels::start(DOWN_AFTER).await.unwrap();
    let url = format!("{}?request_timeout_ms=500", group.url());
    let lock = RedisLock::connect(&url).await.unwrap();
    let lease = lock
        .try_acquire(&key("before"), TTL)
        .await
        .unwrap()
        .unwrap();
    lock.release(lease).await.unwrap();

    // Frozen, not dead: its connections stay open and calls time out instead of failing.
    let old = group.primary().await.unwrap();
    old.pause().unwrap();
    assert_eq!(
        old.state(),
        Some('T'),
        "the fault fired: the primary is stopped"
    );
    let e = lock.try_acquire(&key("during"), TTL).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let new = group.wait_failover(old.addr()).await.unwrap();

    // The call after a timeout asks the sentinels first, and goes to the new primary.
    let k = key("after");
    granted_on(&lock, &k, &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sentinel_first_in_the_list_is_passed_over() {
    let group = RedisSentinels::start(DOWN_AFTER).await.unwrap();
    // A port nothing listens on (bound, then closed).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut hosts = vec![dead.to_string()];
    hosts.extend(group.sentinel_addrs().iter().map(ToString::to_string));
    let url = format!("redis+sentinel://{}/tenure", hosts.join(","));
    let lock = RedisLock::connect(&url).await.unwrap();
    let lease = lock.try_acquire(&key("dead"), TTL).await.unwrap().unwrap();
    lock.release(lease).await.unwrap();
}

#[tokio::test]
async fn a_name_no_sentinel_monitors_is_a_config_error() {
    let group = RedisSentinels::start(Duration::from_secs(15))
        .await
        .unwrap();
    let hosts: Vec<String> = group
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    let url = format!("redis+sentinel://{}/no-such-primary", hosts.join(","));
    let e = RedisLock::connect(&url).await.unwrap_err();
    assert!(matches!(e, LockError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("monitors no primary named"), "{e}");
}
