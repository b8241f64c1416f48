//! Waiters share one subscriber connection per client, which subscribes a key's release
//! channel while someone waits for it and unsubscribes it after the last waiter left.

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockKey};
use tenure_redis::lab::{RedisCluster, RedisNode, RedisOptions};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("waiters/{name}")).unwrap()
}

/// The ids of the connections in subscriber mode on `node` (`CLIENT LIST TYPE pubsub`).
async fn subscriber_connections(node: &RedisNode) -> Vec<String> {
    let list = node
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .await
        .unwrap();
    list.as_text()
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            line.split(' ')
                .find(|f| f.starts_with("id="))
                .map(String::from)
        })
        .collect()
}

/// Channels someone is subscribed to on `node` (`PUBSUB CHANNELS`).
async fn subscribed_channels(node: &RedisNode) -> usize {
    match node.command(&["PUBSUB", "CHANNELS"]).await.unwrap() {
        tenure_redis::lab::Resp::Array(Some(items)) => items.len(),
        other => panic!("{other:?}"),
    }
}

/// Polls `cond` for up to 5 s.
async fn eventually<F: std::future::Future<Output = bool>>(mut cond: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscriber_connection_and_leave_no_channel() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let holder = RedisLock::connect(&node.url()).await.unwrap();
    let waiter = RedisLock::connect(&node.url()).await.unwrap();
    let keys: Vec<LockKey> = (0..8).map(|i| key(&format!("shared/{i}"))).collect();
    let mut leases = Vec::new();
    for k in &keys {
        leases.push(holder.try_acquire(k, TTL).await.unwrap().unwrap());
    }
    // Two waiters per key, on one client.
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(20));
    let waits: Vec<_> = keys
        .iter()
        .chain(&keys)
        .map(|k| {
            let (waiter, k, opts) = (waiter.clone(), k.clone(), opts.clone());
            tokio::spawn(async move {
                let lease = waiter.acquire(&k, &opts).await?;
                waiter.release(lease).await
            })
        })
        .collect();
    assert!(
        eventually(|| async { subscribed_channels(node).await == keys.len() }).await,
        "every waited-for key's channel subscribed"
    );
    let subscriber = subscriber_connections(node).await;
    assert_eq!(
        subscriber.len(),
        1,
        "16 waiters on 8 keys, one subscriber connection: {subscriber:?}"
    );
    for lease in leases {
        holder.release(lease).await.unwrap();
    }
    for wait in waits {
        wait.await
            .unwrap()
            .expect("each waiter got the lock once released");
    }
    assert!(
        eventually(|| async { subscribed_channels(node).await == 0 }).await,
        "the last waiter of each key unsubscribed it"
    );

    // A later wait reuses the connection (with no channel left it was no longer in
    // subscriber mode; it is again, under the same id).
    let k = &keys[0];
    let held = holder.try_acquire(k, TTL).await.unwrap().unwrap();
    let wait = {
        let (waiter, k, opts) = (waiter.clone(), k.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&k, &opts).await })
    };
    assert!(
        eventually(|| async { subscribed_channels(node).await == 1 }).await,
        "the later waiter subscribed"
    );
    assert_eq!(
        subscriber_connections(node).await,
        subscriber,
        "the same connection"
    );
    holder.release(held).await.unwrap();
    waiter.release(wait.await.unwrap().unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_subscriber_connection_is_killed_still_gets_the_lock() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let holder = RedisLock::connect(&node.url()).await.unwrap();
    let waiter = RedisLock::connect(&node.url()).await.unwrap();
    let k = key("killed");
    let held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    let wait = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(20));
            waiter.acquire(&k, &opts).await
        })
    };
    assert!(
        eventually(|| async { subscribed_channels(node).await == 1 }).await,
        "the waiter subscribed"
    );
    let killed = node
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    assert_eq!(killed.as_int(), Some(1), "the fault fired: {killed:?}");
    // The waiter opens a new subscriber connection and subscribes again.
    assert!(
        eventually(|| async { subscribed_channels(node).await == 1 }).await,
        "the waiter subscribed again"
    );
    let started = Instant::now();
    holder.release(held).await.unwrap();
    let lease = wait.await.unwrap().expect("the waiter got the lock");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the release, not by the holder's 30 s TTL: {:?}",
        started.elapsed()
    );
    waiter.release(lease).await.unwrap();
}
