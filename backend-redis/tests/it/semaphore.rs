//! A semaphore's permits on Redis: one script call tries every permit, one more reads the
//! others for the count's check, and a waiter is woken by the release of any of them.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockKey, Semaphore};
use tenure_redis::lab::{RedisCluster, RedisNode, RedisOptions, Resp};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(30);

/// How many script calls (`EVALSHA`) `node` has run since its statistics were reset.
async fn script_calls(node: &RedisNode) -> u64 {
    node.command_calls("evalsha").await.unwrap()
}

/// Whether each of `channels` has a subscriber on `node`.
async fn subscribed(node: &RedisNode, channels: &[String]) -> bool {
    let mut args = vec!["PUBSUB", "NUMSUB"];
    args.extend(channels.iter().map(String::as_str));
    let Resp::Array(Some(reply)) = node.command(&args).await.unwrap() else {
        panic!("PUBSUB NUMSUB answers an array");
    };
    // [channel, count, channel, count, …]
    reply.chunks(2).all(|pair| pair[1].as_int() == Some(1))
}

async fn reset_stats(node: &RedisNode) {
    let reply = node.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(script_calls(node).await, 0, "statistics reset");
}

/// A server and a semaphore of `permits` on it, its scripts loaded (so that each call
/// is one `EVALSHA`, not `EVALSHA` + `NOSCRIPT` + `EVAL`).
async fn semaphore(permits: u32) -> (RedisCluster, Semaphore) {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let lock = RedisLock::connect(&cluster.nodes()[0].url()).await.unwrap();
    let semaphore = Semaphore::new(Arc::new(lock), permits).unwrap();
    let warm_up = LockKey::new("warm-up").unwrap();
    let lease = semaphore.try_acquire(&warm_up, TTL).await.unwrap().unwrap();
    semaphore.release(lease).await.unwrap();
    (cluster, semaphore)
}

/// A grant is two script calls whatever the permits: the try, and the read of the other
/// permits that checks their count; a try on a full semaphore is one.
#[tokio::test]
async fn a_try_is_two_script_calls_whatever_the_permits() {
    let (cluster, jobs) = semaphore(8).await;
    let node = &cluster.nodes()[0];
    let name = LockKey::new("jobs").unwrap();
    let mut held = Vec::new();
    for taken in 0..8 {
        reset_stats(node).await;
        let permit = jobs.try_acquire(&name, TTL).await.unwrap();
        held.push(permit.unwrap_or_else(|| panic!("permit {taken} of 8 is free")));
        assert_eq!(script_calls(node).await, 2, "taking permit {taken}");
    }
    reset_stats(node).await;
    assert!(jobs.try_acquire(&name, TTL).await.unwrap().is_none());
    assert_eq!(
        script_calls(node).await,
        1,
        "a try on a full semaphore of 8"
    );
    let mut keys: Vec<_> = held.iter().map(|l| l.key().as_str().to_owned()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 8, "one lease per permit: {keys:?}");
    for lease in held {
        jobs.release(lease).await.unwrap();
    }
}

#[tokio::test]
async fn a_waiter_takes_whichever_permit_is_released() {
    let (cluster, jobs) = semaphore(3).await;
    let node = &cluster.nodes()[0];
    let name = LockKey::new("jobs").unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(jobs.try_acquire(&name, TTL).await.unwrap().unwrap());
    }
    reset_stats(node).await;
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
    let waiter = tokio::spawn({
        let (jobs, name) = (jobs.clone(), name.clone());
        async move { jobs.acquire(&name, &opts).await }
    });
    // Release a permit once the waiter listens on every permit's channel.
    let channels: Vec<String> = (0..3)
        .map(|i| format!("{{tenure:jobs#permit-{i}}}:released"))
        .collect();
    let listening = async {
        while !subscribed(node, &channels).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .expect("the waiter subscribes to every permit's channel");
    let freed = held.remove(1);
    let freed_key = freed.key().clone();
    jobs.release(freed).await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    assert_eq!(lease.key(), &freed_key, "the released permit");
    // Its attempts: one, the count's read of the held permits, one more as the wait
    // begins, one after subscribing to the three permits' channels, and one on the
    // release unless the one before came after it; the count's read after the grant;
    // and the release itself. Waiting on each permit apart costs 3 tries, then an
    // attempt per permit before and after subscribing to it: 9 before the release.
    let calls = script_calls(node).await;
    assert!(
        (6..=7).contains(&calls),
        "{calls} script calls while waiting"
    );
    for lease in held.into_iter().chain([lease]) {
        jobs.release(lease).await.unwrap();
    }
}

/// The acquire script run by hand over two locks: a retried attempt of an owner that
/// holds the second gets the second back, even with the first free.
#[tokio::test]
async fn the_script_gives_an_owner_the_lock_it_holds_never_a_second() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let owner = "0123456789abcdef0123456789abcdef";
    let set = node
        .command(&["SET", "{b}", &format!("{owner}:41"), "PX", "30000"])
        .await
        .unwrap();
    assert!(set.is_ok(), "{set:?}");
    let script = tenure_redis::scripts::ACQUIRE;
    let run = |owner: &'static str| {
        let args = [
            "EVAL",
            script,
            "4",
            "{a}",
            "{a}:fence",
            "{b}",
            "{b}:fence",
            owner,
            "30000",
            "clock",
        ];
        async move { node.command(&args).await.unwrap() }
    };
    let ints = |reply: Resp| -> Vec<i64> {
        let Resp::Array(Some(items)) = reply else {
            panic!("{reply:?}")
        };
        items.iter().map(|i| i.as_int().unwrap()).collect()
    };
    assert_eq!(ints(run(owner).await), [1, 41, 1], "the lock it holds");
    let a = node.command(&["EXISTS", "{a}"]).await.unwrap();
    assert_eq!(a.as_int(), Some(0), "the free lock was left free");
    let other = "fedcba9876543210fedcba9876543210";
    let granted = ints(run(other).await);
    assert_eq!(
        (granted[0], granted[2]),
        (1, 0),
        "another owner gets the free one"
    );
    let held = ints(run("00000000000000000000000000000000").await);
    assert_eq!(held[0], 0, "both held: {held:?}");
    assert!(
        (29_000..=30_000).contains(&held[1]),
        "shortest pttl: {held:?}"
    );
}
