//! Redis under real faults. Each test asserts its expected outcome — including the
//! unsafe ones, which must be *observed* — and that its fault really fired.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, DistributedLock, Lease, LockError, LockExt, LockKey, ReleaseOutcome,
};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_conformance::servers::redis::{
    Persistence, RedisCluster, RedisOptions, RedisReplicaPair,
};
use tenure_conformance::{FencedRegister, History};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

async fn connect(url: &str) -> RedisLock {
    RedisLock::connect(url).await.unwrap()
}

/// Retries `try_acquire` for up to `limit` while the client reconnects.
async fn acquire_eventually(lock: &RedisLock, key: &LockKey, limit: Duration) -> Option<Lease> {
    let started = Instant::now();
    loop {
        match lock.try_acquire(key, TTL).await {
            Ok(lease) => return lease,
            Err(e) if e.is_retryable() && started.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("acquire failed: {e}"),
        }
    }
}

/// Grants and releases `n` times so the fence counter is well above 1.
async fn advance_fence(lock: &RedisLock, key: &LockKey, n: usize) {
    for _ in 0..n {
        let lease = lock.try_acquire(key, TTL).await.unwrap().unwrap();
        lock.release(lease).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_while_held_is_unavailable_then_usable_after_restart() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let lock = connect(&node.url()).await;
    let k = key("killed");
    let mut lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();

    node.kill().await.unwrap();
    assert!(!node.is_running(), "the fault fired: server is down");
    let err = lock.extend(&mut lease, TTL).await.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "extend: {err}"
    );
    let err = lock.try_acquire(&k, TTL).await.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "never a false 'held': {err}"
    );

    node.restart().await.unwrap();
    let lease = acquire_eventually(&lock, &k, Duration::from_secs(5)).await;
    assert!(
        lease.is_some(),
        "usable again after restart (the lock died with the data)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_grants_twice_and_the_fence_regresses() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let (a, b) = (connect(&node.url()).await, connect(&node.url()).await);
    let k = key("amnesia");
    let history = History::new();
    advance_fence(&a, &k, 5).await;

    let invoked = Instant::now();
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    let completed = Instant::now();
    let pid_before = node.pid();
    node.restart().await.unwrap();
    assert_ne!(
        node.pid(),
        pid_before,
        "the fault fired: a new server process"
    );

    let b_invoked = Instant::now();
    let stolen = acquire_eventually(&b, &k, Duration::from_secs(5))
        .await
        .expect("UNSAFE (expected): the restarted node forgot the lock");
    let b_completed = Instant::now();
    history.record(1, &stolen, b_invoked, b_completed, Instant::now());
    history.record(0, &held, invoked, completed, Instant::now());
    let report = history.check();
    eprintln!("restart without persistence: {report}");
    assert!(report.overlaps() >= 1, "double grant observed: {report}");
    assert!(
        stolen.token() < held.token(),
        "fence regressed: {} after {}",
        stolen.token(),
        held.token()
    );
    assert!(
        report.token_violations() >= 1,
        "checker reports the regression: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_aof_always_keeps_the_lock_and_the_fence() {
    let options = RedisOptions::default().persistence(Persistence::AofAlways);
    let cluster = RedisCluster::start(options).await.unwrap();
    let node = &cluster.nodes()[0];
    let (a, b) = (connect(&node.url()).await, connect(&node.url()).await);
    let k = key("durable");
    advance_fence(&a, &k, 5).await;
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    let pid_before = node.pid();
    node.restart().await.unwrap();
    assert_ne!(
        node.pid(),
        pid_before,
        "the fault fired: a new server process"
    );

    let after = acquire_eventually(&b, &k, Duration::from_secs(5)).await;
    assert!(after.is_none(), "SAFE: the lock survived the restart");
    assert_eq!(
        a.release(held.clone()).await.unwrap(),
        ReleaseOutcome::Released
    );
    let next = b.try_acquire(&k, TTL).await.unwrap().unwrap();
    assert!(
        next.token() > held.token(),
        "fence kept: {} after {}",
        next.token(),
        held.token()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_an_async_replica_grants_twice() {
    let pair = RedisReplicaPair::start().await.unwrap();
    let (primary, replica) = (pair.primary(), pair.replica());
    let a = connect(&primary.url()).await;
    let k = key("failover");
    advance_fence(&a, &k, 3).await;
    pair.wait_synced().await.unwrap();

    // The replica falls behind: frozen, and cut off from the primary.
    replica.pause().unwrap();
    let killed = primary
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .await
        .unwrap();
    assert!(
        killed.as_int().unwrap_or(0) >= 1,
        "the fault fired: replication link cut"
    );
    let invoked = Instant::now();
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    let completed = Instant::now();
    primary.kill().await.unwrap();
    replica.resume().unwrap();
    replica.promote().await.unwrap();

    let b = connect(&replica.url()).await;
    let b_invoked = Instant::now();
    let stolen = acquire_eventually(&b, &k, Duration::from_secs(5))
        .await
        .expect("UNSAFE (expected): the promoted replica never saw the lock");
    let b_completed = Instant::now();
    assert!(
        b_completed < held.valid_until(),
        "A still believes it holds the lock"
    );
    let history = History::new();
    history.record(1, &stolen, b_invoked, b_completed, Instant::now());
    history.record(0, &held, invoked, completed, Instant::now());
    let report = history.check();
    eprintln!(
        "failover: {report}; tokens {} then {}",
        held.token(),
        stolen.token()
    );
    assert!(report.overlaps() >= 1, "double grant observed: {report}");
    // The counter lived on the primary too: the promoted replica hands out the same or a
    // lower token, so fencing cannot tell the two holders apart.
    assert!(stolen.token() <= held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_jump_expires_early_and_fencing_contains_it() {
    let cluster = RedisCluster::start(RedisOptions::default().clock_shim(true))
        .await
        .unwrap();
    let node = &cluster.nodes()[0];
    let (a, b) = (connect(&node.url()).await, connect(&node.url()).await);
    let k = key("clock");
    let register = FencedRegister::new();
    let history = History::new();

    let invoked = Instant::now();
    let held = a.try_acquire(&k, TTL).await.unwrap().unwrap();
    let completed = Instant::now();
    let seen_by_a = register.read(held.token()).unwrap();
    node.set_clock_offset(2 * TTL.as_millis() as i64).unwrap();

    // Within a few shim refreshes the server sees the key as expired.
    let b_invoked = Instant::now();
    let mut stolen = None;
    while stolen.is_none() && b_invoked.elapsed() < Duration::from_secs(3) {
        stolen = b.try_acquire(&k, TTL).await.unwrap();
        if stolen.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let stolen = stolen.expect("UNSAFE (expected): the clock jump expired the lock early");
    let b_completed = Instant::now();
    assert!(
        b_completed < held.valid_until(),
        "A still believes it holds the lock"
    );
    history.record(1, &stolen, b_invoked, b_completed, Instant::now());
    history.record(0, &held, invoked, completed, Instant::now());
    assert!(history.check().overlaps() >= 1, "double grant observed");

    let seen_by_b = register.read(stolen.token()).unwrap();
    register.write(stolen.token(), seen_by_b + 1).unwrap();
    assert!(
        register.write(held.token(), seen_by_a + 1).is_err(),
        "fencing contains it: the stale holder's write is rejected"
    );
    assert_eq!(register.rejected(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_paused_past_its_ttl_is_fenced_off() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let k = key("paused-holder");
    let register = FencedRegister::new();
    let ttl = Duration::from_millis(300);

    let stale = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let seen_by_stale = register.read(stale.token()).unwrap();
    // A "GC pause": the holder does nothing while its TTL runs out.
    tokio::time::sleep(ttl * 2).await;
    assert!(
        Instant::now() > stale.valid_until(),
        "the fault fired: paused past the deadline"
    );
    let fresh = b
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("expired lock taken over");
    let seen = register.read(fresh.token()).unwrap();
    register.write(fresh.token(), seen + 1).unwrap();
    // The holder wakes and writes as if nothing happened.
    assert!(register.write(stale.token(), seen_by_stale + 1).is_err());
    assert_eq!(register.value(), 1, "only the fresh holder's update landed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_reports_loss_before_the_server_frees_the_key() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let proxy = FaultProxy::start(node.addr()).await.unwrap();
    let holder: Arc<RedisLock> =
        Arc::new(connect(&format!("redis://{}?command_timeout_ms=300", proxy.addr())).await);
    let observer = connect(&node.url()).await;
    let k = key("blackhole");
    let ttl = Duration::from_secs(2);
    let guard = holder.lock(&k, &AcquireOptions::new(ttl)).await.unwrap();

    proxy.set_mode(ProxyMode::Blackhole);
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the guard reports the loss");
    assert!(
        proxy.stats().bytes_blackholed > 0,
        "the fault fired: renewals were dropped"
    );
    let info = observer.inspect(&k).await.unwrap();
    assert!(
        info.is_some_and(|h| h.remaining.is_some_and(|r| r > Duration::ZERO)),
        "loss was reported while the server still held the key for us"
    );
}
