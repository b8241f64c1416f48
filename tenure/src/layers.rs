//! Wrappers that implement [`DistributedLock`] around any backend, so cross-cutting
//! concerns compose without touching backends.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::async_trait;
use tenure_api::{
    AcquireOptions, Capabilities, DistributedLock, HolderInfo, Lease, LockError, LockKey,
    ReleaseOutcome,
};

/// Subtracts an extra clock-drift allowance from the local deadline of every lease it
/// hands out or extends (on top of the backend's own), so holders presume their lease lost
/// earlier. Configured by [`crate::Config::drift`].
#[derive(Debug, Clone)]
pub struct DriftMargin {
    inner: Arc<dyn DistributedLock>,
    margin: Duration,
}

impl DriftMargin {
    /// Wraps `inner`, tightening every deadline by `margin`.
    pub fn new(inner: Arc<dyn DistributedLock>, margin: Duration) -> Self {
        Self { inner, margin }
    }

    fn tightened(&self, mut lease: Lease) -> Lease {
        lease.tighten(self.margin);
        lease
    }
}

#[async_trait]
impl DistributedLock for DriftMargin {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        Ok(self
            .inner
            .try_acquire(key, ttl)
            .await?
            .map(|l| self.tightened(l)))
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        Ok(self.tightened(self.inner.acquire(key, opts).await?))
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        self.inner.extend(lease, ttl).await?;
        lease.tighten(self.margin);
        Ok(())
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_api::MemoryLock;

    #[tokio::test]
    async fn deadlines_move_earlier_by_the_margin() {
        let inner: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let plain = inner.clone();
        let lock = DriftMargin::new(inner, Duration::from_millis(300));
        let ttl = Duration::from_secs(2);
        let key = LockKey::new("k").unwrap();
        let mut lease = lock.try_acquire(&key, ttl).await.unwrap().unwrap();
        let budget = lease.valid_until() - lease.acquired_at();
        assert!(budget <= ttl - Duration::from_millis(300), "{budget:?}");
        lock.extend(&mut lease, ttl).await.unwrap();
        assert!(
            lease.valid_until() - std::time::Instant::now() <= ttl - Duration::from_millis(300)
        );
        let other = plain
            .try_acquire(&LockKey::new("o").unwrap(), ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(
            other.valid_until() - other.acquired_at() > budget,
            "the margin is extra"
        );
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
}
