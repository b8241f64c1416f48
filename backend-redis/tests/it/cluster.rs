//! `redis+cluster://`: locks on a Redis Cluster, each on the primary of its key's slot,
//! followed through a real failover (the primary killed, the cluster promotes its
//! replica).

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, Backoff, DistributedLock, Lease, LockError, LockKey, WaitKind};
use tenure_conformance::servers::poll_until;
use tenure_redis::lab::sharded::RedisShardedCluster;
use tenure_redis::lab::{RedisNode, Resp, RespConnection};
use tenure_redis::RedisLock;
use tokio::task::JoinHandle;

use crate::common;
use common::{extended, refused_unconfirmed, still_held_then_handed_on, FAILOVER, TTL};

/// How long the cluster waits before it fails a primary over: long enough that a loaded
/// machine does not cause a failover of its own.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("cluster/{name}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_the_replica_survives_a_real_failover() {
    let cluster = RedisShardedCluster::start(NODE_TIMEOUT).await.unwrap();
    let holder = RedisLock::connect(&cluster.url()).await.unwrap();
    let k = key("held");
    let lock_key = holder.lock_key(&k);
    let lease = holder.try_acquire(&k, TTL).await.unwrap().unwrap();

    // The lock and its fence live on the primary of the key's slot, and its replica has
    // them before the primary dies.
    let old = cluster.primary_of(&lock_key).await.unwrap();
    let fence_key = format!("{lock_key}:fence");
    assert_eq!(
        cluster.primary_of(&fence_key).await.unwrap().addr(),
        old.addr(),
        "the fence key is in the lock's slot"
    );
    replicated(&old).await;

    old.kill().await.unwrap();
    let new = cluster.wait_failover(&lock_key, old.addr()).await.unwrap();
    assert_ne!(
        new.addr(),
        old.addr(),
        "the fault fired: a replica took over"
    );

    // The same client follows the slot to the promoted replica; the lease is there.
    let lease = extended(&holder, &lease).await;

    let other = RedisLock::connect(&cluster.url()).await.unwrap();
    still_held_then_handed_on(&holder, &other, &k, lease).await;
}

/// Waits until `primary`'s replica acknowledged everything written to it so far.
async fn replicated(primary: &RedisNode) {
    let written = primary.replication_offset().await.unwrap();
    let acknowledged = || async {
        match primary.acknowledged_offset().await.unwrap() {
            Some(offset) if offset >= written => Ok(()),
            other => Err(other),
        }
    };
    poll_until(FAILOVER, Duration::from_millis(20), acknowledged, |at| {
        format!("the replica to acknowledge offset {written} (at {at:?})")
    })
    .await
    .unwrap();
}

/// How many clients `node` counts on the shard channel `channel` (`PUBSUB SHARDNUMSUB`).
async fn shard_subscribers(node: &RedisNode, channel: &str) -> i64 {
    match node.command(&["PUBSUB", "SHARDNUMSUB", channel]).await {
        Ok(Resp::Array(Some(reply))) if reply.len() == 2 => reply[1].as_int().unwrap(),
        other => panic!("PUBSUB SHARDNUMSUB {channel}: {other:?}"),
    }
}

/// Polls until `node` counts `count` subscribers of `channel`, for up to `within`.
async fn subscribed(node: &RedisNode, channel: &str, count: i64, within: Duration) -> bool {
    let counted = || async {
        match shard_subscribers(node, channel).await {
            n if n == count => Ok(()),
            n => Err(n),
        }
    };
    poll_until(within, Duration::from_millis(20), counted, |n| {
        n.to_string()
    })
    .await
    .is_ok()
}

/// `waiter` waits for `k` with `opts`, in a task of its own.
fn waiting(
    waiter: &RedisLock,
    k: &LockKey,
    opts: AcquireOptions,
) -> JoinHandle<Result<Lease, LockError>> {
    let (waiter, k) = (waiter.clone(), k.clone());
    tokio::spawn(async move { waiter.acquire(&k, &opts).await })
}

/// `holder` releases `held`; the `waiting` waiter gets the lock within 10 s (woken, not
/// left to `slower`), and gives it back.
async fn handed_on(
    holder: &RedisLock,
    held: Lease,
    waiter: &RedisLock,
    waiting: JoinHandle<Result<Lease, LockError>>,
    slower: &str,
) {
    let released = Instant::now();
    holder.release(held).await.unwrap();
    let lease = waiting.await.unwrap().expect("the waiter got the lock");
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken by the release, not by {slower}: {:?}",
        released.elapsed()
    );
    waiter.release(lease).await.unwrap();
}

/// Waiters on a Cluster are woken by the release: they subscribe the key's release
/// channel on its slot's primary (`SSUBSCRIBE`, which the release script's `SPUBLISH`
/// reaches), leave it when done, and subscribe again on the replica the cluster promotes
/// when that primary dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_sharded_pubsub_and_follow_a_failover() {
    let cluster = RedisShardedCluster::start(NODE_TIMEOUT).await.unwrap();
    let holder = RedisLock::connect(&cluster.url()).await.unwrap();
    // Patient: a subscription that failed on a loaded machine would leave it polling.
    let patient = format!(
        "{}?connect_timeout_ms=5000&request_timeout_ms=5000",
        cluster.url()
    );
    let waiter = RedisLock::connect(&patient).await.unwrap();
    assert_eq!(waiter.capabilities().wait, WaitKind::Push);
    let k = key("woken");
    let lock_key = holder.lock_key(&k);
    let channel = format!("{lock_key}:released");
    let primary = cluster.primary_of(&lock_key).await.unwrap();

    // A waiter that polled, or re-checked at its backoff ceiling, would not look again
    // for 30 s.
    let slow_polls = Backoff {
        initial: Duration::from_secs(30),
        max: Duration::from_secs(30),
        jitter: 0.0,
    };
    let held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    let opts = AcquireOptions::new(TTL).wait(FAILOVER).backoff(slow_polls);
    let wait = waiting(&waiter, &k, opts);
    assert!(
        subscribed(&primary, &channel, 1, Duration::from_secs(10)).await,
        "the waiter subscribed the release channel on the key's primary"
    );
    handed_on(&holder, held, &waiter, wait, "its next poll").await;
    assert!(
        subscribed(&primary, &channel, 0, Duration::from_secs(10)).await,
        "the last waiter left the channel"
    );

    // The primary dies under a waiter: it subscribes again where the slot went (its
    // failed attempts meanwhile back off as usual, so this part shows the new
    // subscription, and the hand-off, not that the message woke it).
    let held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    let wait = waiting(&waiter, &k, AcquireOptions::new(TTL).wait(FAILOVER * 2));
    assert!(
        subscribed(&primary, &channel, 1, Duration::from_secs(10)).await,
        "the waiter subscribed"
    );
    replicated(&primary).await;
    primary.kill().await.unwrap();
    let promoted = cluster
        .wait_failover(&lock_key, primary.addr())
        .await
        .unwrap();
    assert_ne!(
        promoted.addr(),
        primary.addr(),
        "the fault fired: a replica took over"
    );
    assert!(
        subscribed(&promoted, &channel, 1, FAILOVER).await,
        "the waiter subscribed again on the promoted replica"
    );
    let held = extended(&holder, &held).await;
    handed_on(&holder, held, &waiter, wait, "the holder's TTL").await;
}

/// A user whose ACL refuses `SSUBSCRIBE` (as a server before Redis 7 does) still gets
/// the lock once released: its waiters poll instead, and leave no subscription behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_refused_sharded_pubsub_poll_instead() {
    let cluster = RedisShardedCluster::start(Duration::from_secs(15))
        .await
        .unwrap();
    for node in cluster.nodes() {
        let rule = ["ACL", "SETUSER", "poller", "on", ">pw", "~*", "&*", "+@all"];
        let set = node.command(&[&rule[..], &["-ssubscribe"]].concat()).await;
        assert!(set.unwrap().is_ok(), "the user exists on every node");
    }
    let holder = RedisLock::connect(&cluster.url()).await.unwrap();
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://poller:pw@");
    let waiter = RedisLock::connect(&url).await.unwrap();
    let k = key("refused");
    let lock_key = holder.lock_key(&k);
    let channel = format!("{lock_key}:released");
    let primary = cluster.primary_of(&lock_key).await.unwrap();
    for round in 0..2 {
        let held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
        let wait = waiting(&waiter, &k, AcquireOptions::new(TTL).wait(FAILOVER));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            shard_subscribers(&primary, &channel).await,
            0,
            "round {round}"
        );
        handed_on(&holder, held, &waiter, wait, "the holder's TTL").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_the_primaries_and_permits_still_work() {
    let cluster = RedisShardedCluster::start(Duration::from_secs(15))
        .await
        .unwrap();
    let lock = RedisLock::connect(&cluster.url()).await.unwrap();
    let mut primaries = std::collections::HashSet::new();
    for i in 0..12 {
        let k = key(&format!("spread-{i}"));
        let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
        primaries.insert(cluster.primary_of(&lock.lock_key(&k)).await.unwrap().addr());
        lock.release(lease).await.unwrap();
    }
    assert_eq!(primaries.len(), 3, "12 keys land on all three primaries");

    // A primary that lost its scripts (restarted, promoted) gets them by EVAL, routed
    // to the key's slot.
    for node in cluster.nodes() {
        let flushed = node.command(&["SCRIPT", "FLUSH"]).await.unwrap();
        assert!(flushed.is_ok(), "{flushed:?}");
    }
    let k = key("after-flush");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let primary = cluster.primary_of(&lock.lock_key(&k)).await.unwrap();
    let sha = tenure_redis::scripts::SCRIPTS.acquire.get_hash().to_owned();
    let cached = primary.command(&["SCRIPT", "EXISTS", &sha]).await.unwrap();
    assert_eq!(
        format!("{cached:?}"),
        "Array(Some([Integer(1)]))",
        "EVAL cached the script on the key's primary"
    );
    lock.release(lease).await.unwrap();

    // A semaphore's permits sit in different slots: taken one by one.
    let permits: Vec<LockKey> = (0..3).map(|i| key(&format!("permit-{i}"))).collect();
    let opts = tenure_api::AcquireOptions::new(TTL).wait(Duration::ZERO);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(lock.acquire_any(&permits, &opts).await.unwrap());
    }
    let e = lock.acquire_any(&permits, &opts).await.unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");
    for lease in held {
        lock.release(lease).await.unwrap();
    }
}

/// `?wait_replicas=1` on a Cluster: `WAIT` goes to the slot's primary in the script's
/// pipeline, so a grant counts once that primary's replica has it, and one the replica
/// cannot confirm (frozen, its link closed) is refused and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_confirms_each_grant_on_its_slots_replica() {
    let cluster = RedisShardedCluster::start(Duration::from_secs(15))
        .await
        .unwrap();
    // Patient where a replica must confirm (it acks within a round trip, but on two loaded
    // cores that can take long), short where none can.
    let url = format!(
        "{}?wait_replicas=1&wait_timeout_ms=5000&request_timeout_ms=15000",
        cluster.url()
    );
    let lock = RedisLock::connect(&url).await.unwrap();
    let short = format!("{}?wait_replicas=1&wait_timeout_ms=300", cluster.url());
    let impatient = RedisLock::connect(&short).await.unwrap();

    let k = key("confirmed");
    let lock_key = lock.lock_key(&k);
    let primary = cluster.primary_of(&lock_key).await.unwrap();
    let replicas = cluster.replicas_of(&primary).await.unwrap();
    assert_eq!(replicas.len(), 1, "each primary has one replica");
    // A newly formed cluster's replica may still be syncing.
    let deadline = tokio::time::Instant::now() + FAILOVER;
    while !primary.replica_online(&replicas[0]).await.unwrap() {
        assert!(tokio::time::Instant::now() < deadline, "the replica synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    // Read on the replica right away: WAIT made the grant reach it before the reply.
    let mut on_replica = RespConnection::connect(replicas[0].addr()).await.unwrap();
    assert!(on_replica.command(&["READONLY"]).await.unwrap().is_ok());
    let value = on_replica.command(&["GET", &lock_key]).await.unwrap();
    let value = value.as_text().expect("the replica has the lock key");
    assert!(value.starts_with(&lease.owner().to_string()), "{value}");
    lock.release(lease).await.unwrap();

    primary.strand_replicas(&replicas).await.unwrap();
    assert_eq!(
        replicas[0].state(),
        Some('T'),
        "the fault fired: replica frozen"
    );
    let refused = impatient.try_acquire(&k, TTL).await;
    replicas[0].resume().unwrap();
    refused_unconfirmed(&refused);
    let on_primary = primary.command(&["GET", &lock_key]).await.unwrap();
    assert!(
        on_primary.is_nil(),
        "the refused grant was released: {on_primary:?}"
    );
}

#[tokio::test]
async fn cluster_urls_refuse_what_a_cluster_cannot_do() {
    for url in [
        "redis+cluster://h1,h2?prefix=",
        "redis+cluster://h1?prefix=}x",
        "redis+cluster://h1/2",
    ] {
        let e = RedisLock::connect(url).await.unwrap_err();
        assert!(matches!(e, LockError::Config(_)), "{url}: {e:?}");
    }
}
