//! Wrappers that implement [`DistributedLock`] around any backend, so cross-cutting
//! concerns compose without touching backends: [`LockLayer`]s, stacked by [`LockStack`].
//!
//! A wrapper forwards every method it can, [`DistributedLock::acquire_any`] and
//! [`DistributedLock::holder_changes`] included: without them, the provided methods run
//! over the wrapper's own per-key calls or say there is no feed, which is correct but
//! gives up what the backend does better (Redis: one script call per attempt over all
//! the keys; etcd: a watch instead of readings).

use std::fmt;
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

    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        Ok(self.tightened(self.inner.acquire_shared(key, opts).await?))
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

    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        Ok(self.tightened(self.inner.acquire_any(keys, opts).await?))
    }

    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        self.inner.inspect_each(keys).await
    }

    fn holder_changes(&self, key: &LockKey) -> Option<tenure_api::HolderFeed> {
        self.inner.holder_changes(key)
    }
}

/// Wraps a lock in another [`DistributedLock`] — tower's `Layer`, for locks — so that
/// concerns such as a drift allowance, tracing and metrics compose in the order the
/// caller picks ([`LockStack`]). A closure from lock to lock is a layer too.
pub trait LockLayer: Send + Sync {
    /// `inner`, wrapped.
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock>;
}

impl<F> LockLayer for F
where
    F: Fn(Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> + Send + Sync,
{
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        self(inner)
    }
}

/// Layers in the order they were added: the first wraps the backend, the last is what the
/// caller calls. [`crate::Config::layers`] builds the one a configuration asks for.
///
/// ```
/// # async fn demo() -> Result<(), tenure::LockError> {
/// use std::time::Duration;
/// use tenure::layers::{DriftMarginLayer, LockStack};
/// use tenure::observe::MeteredLayer;
///
/// let stack = LockStack::new()
///     .layer(DriftMarginLayer(Duration::from_millis(200)))
///     .layer(MeteredLayer);
/// let lock = stack.wrap(tenure::connect("memory://").await?);
/// assert!(format!("{lock:?}").starts_with("Metered"));
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct LockStack {
    layers: Vec<Arc<dyn LockLayer>>,
}

impl LockStack {
    /// No layers: [`wrap`](Self::wrap) returns the lock it is given.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `layer` outside the ones added before.
    pub fn layer(mut self, layer: impl LockLayer + 'static) -> Self {
        self.layers.push(Arc::new(layer));
        self
    }

    /// `lock` wrapped in every layer, the first added innermost.
    pub fn wrap(&self, lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        self.layers
            .iter()
            .fold(lock, |inner, layer| layer.layer(inner))
    }
}

impl fmt::Debug for LockStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockStack")
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// [`DriftMargin`] as a layer: every lease's local deadline moves earlier by the margin.
#[derive(Debug, Clone, Copy)]
pub struct DriftMarginLayer(pub Duration);

impl LockLayer for DriftMarginLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(DriftMargin::new(inner, self.0))
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
        let keys = [LockKey::new("a").unwrap(), LockKey::new("b").unwrap()];
        let any = lock
            .acquire_any(&keys, &AcquireOptions::new(ttl))
            .await
            .unwrap();
        let budget = any.valid_until() - any.acquired_at();
        assert!(budget <= ttl - Duration::from_millis(300), "{budget:?}");
    }

    #[tokio::test]
    async fn a_stack_wraps_in_the_order_layers_were_added() {
        let marker = |name: &'static str| {
            move |inner: Arc<dyn DistributedLock>| -> Arc<dyn DistributedLock> {
                Arc::new(DriftMargin::new(
                    inner,
                    Duration::from_millis(name.len() as u64),
                ))
            }
        };
        let lock = LockStack::new()
            .layer(marker("a"))
            .layer(DriftMarginLayer(Duration::from_millis(7)))
            .layer(marker("abc"))
            .wrap(Arc::new(MemoryLock::new()));
        let shown = format!("{lock:?}");
        let at = |margin: &str| shown.find(&format!("margin: {margin}")).unwrap();
        // Debug shows a layer's margin after its inner lock: innermost first.
        assert!(at("1ms") < at("7ms") && at("7ms") < at("3ms"), "{shown}");
        let key = LockKey::new("k").unwrap();
        let ttl = Duration::from_secs(2);
        let lease = lock.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert!(lease.valid_until() - lease.acquired_at() <= ttl - Duration::from_millis(11));
        let empty = LockStack::new().wrap(Arc::new(MemoryLock::new()));
        assert!(format!("{empty:?}").starts_with("MemoryLock"), "{empty:?}");
    }
}
