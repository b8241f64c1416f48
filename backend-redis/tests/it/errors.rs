//! Error classes on a real server (issue 15, defect 8): an authentication failure is a
//! configuration error that no wait retries; a read-only replica is unavailability that
//! an `acquire` waits out.

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey};
use tenure_redis::lab::{RedisCluster, RedisOptions, RedisReplicaPair};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(10);
/// Far longer than any of these calls may take.
const LONG_WAIT: Duration = Duration::from_secs(30);
/// "Quickly": well under `LONG_WAIT`, generous for a loaded machine.
const QUICK: Duration = Duration::from_secs(8);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("errors/{name}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_failures_are_config_errors_and_never_retried() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let reply = node
        .command(&["CONFIG", "SET", "requirepass", "s3cret"])
        .await
        .unwrap();
    assert!(
        reply.is_ok(),
        "the fault fired: a password is required ({reply:?})"
    );
    let denied = node.command(&["GET", "x"]).await.unwrap();
    assert!(
        matches!(&denied, tenure_redis::lab::Resp::Error(e) if e.starts_with("NOAUTH")),
        "the server refuses unauthenticated clients: {denied:?}"
    );
    let opts = AcquireOptions::new(TTL).wait(LONG_WAIT);

    // The right password works.
    let good = RedisLock::connect(&format!("redis://:s3cret@{}", node.addr()))
        .await
        .unwrap();
    let lease = good.acquire(&key("auth"), &opts).await.unwrap();
    good.release(lease).await.unwrap();

    // A wrong password: the client's AUTH fails (WRONGPASS).
    let started = Instant::now();
    let result = RedisLock::connect(&format!("redis://:wrong@{}", node.addr())).await;
    let err = match result {
        Ok(lock) => lock.acquire(&key("auth"), &opts).await.unwrap_err(),
        Err(e) => e,
    };
    eprintln!("wrong password: {err}");
    assert!(matches!(err, LockError::Config(_)), "wrong password: {err}");
    assert!(
        !err.to_string().contains("wrong@"),
        "no secret shown: {err}"
    );
    assert!(
        started.elapsed() < QUICK,
        "not retried: {:?}",
        started.elapsed()
    );

    // No password at all: the server answers NOAUTH.
    let started = Instant::now();
    let result = RedisLock::connect(&node.url()).await;
    let err = match result {
        Ok(lock) => lock.acquire(&key("auth"), &opts).await.unwrap_err(),
        Err(e) => e,
    };
    eprintln!("no password: {err}");
    assert!(matches!(err, LockError::Config(_)), "no password: {err}");
    assert!(
        started.elapsed() < QUICK,
        "not retried: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_is_unavailable_and_acquire_waits_it_out() {
    let pair = RedisReplicaPair::start().await.unwrap();
    let replica = pair.replica();
    let role = replica.info_field("replication", "role").await.unwrap();
    assert_eq!(role.as_deref(), Some("slave"), "the fault fired: a replica");
    let lock = RedisLock::connect(&replica.url()).await.unwrap();
    let k = key("replica");

    let err = lock.try_acquire(&k, TTL).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Unavailable { message, .. } if message.contains("READONLY")),
        "one attempt: {err}"
    );

    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let err = lock
        .acquire(&k, &AcquireOptions::new(TTL).wait(wait))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(&err, LockError::Unavailable { message, .. } if message.contains("READONLY")),
        "after waiting: {err}"
    );
    assert!(waited >= wait, "waited the whole bound: {waited:?}");
    assert!(waited < wait + QUICK, "and not much longer: {waited:?}");
}
