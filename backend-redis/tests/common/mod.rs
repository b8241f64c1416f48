//! What the Sentinel, Cluster and replica tests check: after a replica took over, and
//! when `wait_replicas` refuses a grant.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use tenure_api::{DistributedLock, Lease, LockError, LockKey, ReleaseOutcome};
use tenure_conformance::retrying;
use tenure_redis::lab::RedisNode;
use tenure_redis::RedisLock;

/// Long enough for a promotion on a loaded machine.
pub(crate) const FAILOVER: Duration = Duration::from_secs(60);
/// Outlives a failover, however slow: a lease lost to its TTL would prove nothing.
pub(crate) const TTL: Duration = Duration::from_secs(120);

/// The same client, once it follows the failover, extends `lease` there.
pub(crate) async fn extended(holder: &RedisLock, lease: &Lease) -> Lease {
    let (extended, _) = retrying(FAILOVER, || {
        let mut lease = lease.clone();
        async move { holder.extend(&mut lease, TTL).await.map(|()| lease) }
    })
    .await;
    extended.expect("the lease extends on the promoted replica")
}

/// `lease` (on `k`, held by `holder`'s owner) outlived the failover: another client is
/// refused, the holder releases it, and the next grant's token is larger.
pub(crate) async fn still_held_then_handed_on(
    holder: &RedisLock,
    other: &RedisLock,
    k: &LockKey,
    lease: Lease,
) {
    let (held, _) = retrying(FAILOVER, || other.try_acquire(k, TTL)).await;
    assert!(held.unwrap().is_none(), "the lock is still held");
    assert_eq!(
        holder.release(lease.clone()).await.unwrap(),
        ReleaseOutcome::Released
    );
    let next = other.try_acquire(k, TTL).await.unwrap().unwrap();
    assert!(
        next.token() > lease.token(),
        "tokens keep increasing across the failover: {:?} after {:?}",
        next.token(),
        lease.token()
    );
    other.release(next).await.unwrap();
}

/// `lock` (once the failover settles) is granted `k`, and the grant is on `primary`.
pub(crate) async fn granted_on(lock: &RedisLock, k: &LockKey, primary: &RedisNode) {
    let (granted, _) = retrying(FAILOVER, || lock.try_acquire(k, TTL)).await;
    let lease = granted
        .unwrap()
        .expect("the key is free on the new primary");
    let on_new = primary.command(&["GET", &lock.lock_key(k)]).await.unwrap();
    assert!(
        on_new.as_text().is_some(),
        "the grant is on the new primary"
    );
    lock.release(lease).await.unwrap();
}

/// `refused` is `wait_replicas`'s refusal of a grant that 0 of 1 replicas confirmed.
pub(crate) fn refused_unconfirmed<T: std::fmt::Debug>(refused: &Result<T, LockError>) {
    match refused {
        Err(LockError::Unavailable { message, .. }) => assert!(
            message.contains("0 of the 1 replicas wait_replicas asks for")
                && message.contains("grant refused and released"),
            "{message}"
        ),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
