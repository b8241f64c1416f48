//! One lock with redis-py's `Lock` (Debian's `python3-redis`, the real client): tenure's
//! lock key for `job` is `{tenure:job}`, a string holding its owner, which redis-py's
//! `Lock("{tenure:job}")` sets with `SET NX PX` and deletes with a script — publishing no
//! release message, and with no expiry at all unless given a timeout.

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockAdmin, LockError, LockKey, ReleaseOutcome};
use tenure_conformance::foreign::ForeignClient;
use tenure_redis::lab::{RedisCluster, RedisNode, RedisOptions};
use tenure_redis::RedisLock;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(30);

/// redis-py's `Lock(name, timeout=…)` (none for `None`) on `node`.
async fn redis_py(node: &RedisNode, name: &str, timeout: Option<Duration>) -> ForeignClient {
    tenure_redis::lab::redis_py(&node.url(), name, timeout)
        .await
        .unwrap()
}

fn waiter(lock: &RedisLock, k: &LockKey) -> JoinHandle<Instant> {
    let (lock, k) = (lock.clone(), k.clone());
    tokio::spawn(async move {
        let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
        let lease = lock.acquire(&k, &opts).await.unwrap();
        let granted = Instant::now();
        lock.release(lease).await.unwrap();
        granted
    })
}

/// A tenure waiter behind a redis-py holder is granted soon after redis-py releases,
/// though no release message comes, and does not spin meanwhile on a lock without
/// expiry (PTTL -1). Before, a waiter slept until the holder's TTL ran out (here a
/// minute: the wait for the grant timed out), and spun on a lock without one (an
/// acquire script every millisecond).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_release_is_seen_by_tenures_waiters() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let lock = RedisLock::connect(&node.url()).await.unwrap();
    for (job, timeout) in [
        ("job-ttl", Some(Duration::from_secs(60))),
        ("job-forever", None),
    ] {
        let k = LockKey::new(job).unwrap();
        let mut redis_py = redis_py(node, &lock.lock_key(&k), timeout).await;
        assert!(
            redis_py.acquire(Duration::from_secs(1)).await,
            "{job}: free"
        );
        assert!(
            lock.try_acquire(&k, TTL).await.unwrap().is_none(),
            "{job}: tenure granted beside redis-py"
        );
        let before = node.command_calls("evalsha").await.unwrap();
        let waiter = waiter(&lock, &k);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!waiter.is_finished(), "{job}: redis-py holds");
        let scripts = node.command_calls("evalsha").await.unwrap() - before;
        assert!(
            scripts <= 10,
            "{job}: {scripts} acquire scripts in 2 s of waiting"
        );
        redis_py.release().await;
        let released = Instant::now();
        let granted = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("granted")
            .unwrap();
        let after = granted.duration_since(released);
        assert!(
            after < Duration::from_secs(5),
            "{job}: granted {after:?} after"
        );
    }
}

/// redis-py and tenure exclude each other both ways, each release wakes the other side
/// (redis-py polls), and a killed redis-py's lock is freed for tenure at its TTL.
/// `inspect`, `holders` and `doctor` show redis-py's hold as a foreign holder — before,
/// `inspect` failed with "malformed lock value" and `doctor` called it malformed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_tenure_share_a_lock() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let lock = RedisLock::connect(&node.url()).await.unwrap();
    let k = LockKey::new("job").unwrap();
    assert_eq!(lock.lock_key(&k), "{tenure:job}");
    let timeout = Duration::from_secs(3);
    let mut redis_py = redis_py(node, "{tenure:job}", Some(timeout)).await;

    let ours = lock
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("a free key");
    assert!(
        !redis_py.acquire(Duration::from_secs(1)).await,
        "redis-py granted beside tenure's holder"
    );
    redis_py.send("acquire 30000").await;
    assert_eq!(lock.release(ours).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(redis_py.line(Duration::from_secs(30)).await, "acquired");
    let holder = lock.inspect(&k).await.unwrap().expect("redis-py holds");
    assert!(holder.foreign && holder.token.is_none(), "{holder:?}");
    let token = holder.label.clone().expect("its token");
    assert!(
        token.len() == 32,
        "redis-py's token, 32 hex digits: {token}"
    );
    assert!(holder.remaining.is_some_and(|left| left <= timeout));
    let holders = lock.holders("").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(holders[0].1.foreign && holders[0].1.owner == holder.owner);
    assert_eq!(
        lock.doctor().await.unwrap(),
        [],
        "a foreign holder is no finding"
    );

    let started = Instant::now();
    redis_py.kill().await;
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
    let lease = lock.acquire(&k, &opts).await.unwrap();
    assert!(
        started.elapsed() >= timeout / 2,
        "held until redis-py's lock expired"
    );
    lock.release(lease).await.unwrap();
}

/// Redisson's `RLock` keeps a hash at the lock's name (field `<client id>:<thread id>`):
/// tenure does not share it, and says so rather than report a bare `WRONGTYPE`; `doctor`
/// names the hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_hash_at_the_lock_key_is_a_clear_error() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let lock = RedisLock::connect(&node.url()).await.unwrap();
    let k = LockKey::new("job").unwrap();
    let redisson = [
        "HSET",
        "{tenure:job}",
        "8743c9c0-0795-4907-87fd-6c719a6b4586:1",
        "1",
    ];
    node.command(&redisson).await.unwrap();
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(10));
    let started = Instant::now();
    for error in [
        lock.try_acquire(&k, TTL).await.unwrap_err(),
        lock.acquire(&k, &opts).await.unwrap_err(),
        lock.inspect(&k).await.unwrap_err(),
    ] {
        assert!(matches!(error, LockError::Backend { .. }), "{error:?}");
        let shown = error.to_string();
        assert!(shown.contains("Redisson's RLock hash"), "{shown}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "not retried");
    let findings = lock.doctor().await.unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert!(findings[0].detail.contains("a hash"), "{findings:?}");
}
