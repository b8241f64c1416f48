//! Deliberately broken locks, to prove the matrix catches them: each backend's testbed
//! offers thin wrappers over its real client (on the same servers and links) that
//! re-create one classic anti-pattern each ([`BrokenVariant`]). `tenure matrix --backends
//! broken:NAME` runs one, judged by its real backend's row of expected verdicts; `tenure
//! matrix --list-broken` lists them. Never use them for anything else.
//!
//! Here, what the variants of several backends share: [`Retokened`] (a lease handed out
//! under a token of the wrapper's own), [`FlawedExtend`] (the real client but for its
//! extend), [`untouched`] and [`unavailable`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tenure_api::{
    async_trait, AcquireOptions, Capabilities, DistributedLock, FencingToken, HolderInfo, Lease,
    LockError, LockKey, OwnerId, ReleaseOutcome,
};

/// Wraps `inner`, a real client of the URL given, in a variant's flaw; any connection
/// of the variant's own goes to that URL too (through the same proxies).
pub type WrapFn = fn(
    String,
    Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>>;

/// One deliberately broken variant of a backend.
#[derive(Clone, Copy)]
pub struct BrokenVariant {
    /// The name after `broken:`.
    pub name: &'static str,
    /// Whether the flaw is in the holder's clock rather than its client: the fault suite
    /// then times the holder's guard on a clock that cannot tell suspends
    /// ([`FaultTarget::with_stopping_clock`](crate::faults::FaultTarget::with_stopping_clock)).
    pub stops_the_clock: bool,
    /// Wraps a real client in the flaw.
    pub wrap: WrapFn,
}

impl BrokenVariant {
    /// The variant `name`, its flaw in its client: `wrap` wraps a real client in it.
    pub const fn new(name: &'static str, wrap: WrapFn) -> Self {
        Self {
            name,
            stops_the_clock: false,
            wrap,
        }
    }

    /// This variant, its flaw in the holder's clock (see
    /// [`stops_the_clock`](Self::stops_the_clock)).
    pub const fn stopping_the_clock(self) -> Self {
        Self {
            stops_the_clock: true,
            ..self
        }
    }
}

impl fmt::Debug for BrokenVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokenVariant")
            .field("name", &self.name)
            .field("stops_the_clock", &self.stops_the_clock)
            .finish_non_exhaustive()
    }
}

/// A [`WrapFn`] that hands the real client back untouched (a flaw in the clock).
pub fn untouched(
    _url: String,
    inner: Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
    Box::pin(async move { Ok(inner) })
}

/// A broken lock's request that failed, as [`LockError::Unavailable`].
pub fn unavailable(what: &str, error: impl fmt::Display) -> LockError {
    LockError::Unavailable {
        message: format!("broken lock: {what}: {error}"),
        source: None,
    }
}

/// Where a [`Retokened`] lock takes its tokens from.
#[async_trait]
pub trait TokenSource: Send + Sync + fmt::Debug + 'static {
    /// The token for a grant of `key`.
    ///
    /// # Cancel safety
    /// As the source's.
    async fn token(&self, key: &LockKey) -> Result<FencingToken, LockError>;

    /// Called after each release (a source that holds a transaction commits it).
    ///
    /// # Cancel safety
    /// As the source's.
    async fn released(&self) {}
}

/// The real client's leases, handed out under tokens of `source` instead of the real
/// ones: extends and releases go to the real lease behind each.
#[derive(Debug)]
pub struct Retokened<S> {
    inner: Arc<dyn DistributedLock>,
    source: S,
    /// The real lease behind each lease handed out.
    real: Mutex<HashMap<OwnerId, Lease>>,
}

impl<S: TokenSource> Retokened<S> {
    /// `inner`'s leases under `source`'s tokens.
    pub fn new(inner: Arc<dyn DistributedLock>, source: S) -> Self {
        Self {
            inner,
            source,
            real: Mutex::new(HashMap::new()),
        }
    }

    /// A [`WrapFn`]: `inner`'s leases under a default source's tokens.
    pub fn wrap(
        _url: String,
        inner: Arc<dyn DistributedLock>,
    ) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>>
    where
        S: Default,
    {
        let broken: Arc<dyn DistributedLock> = Arc::new(Self::new(inner, S::default()));
        Box::pin(async move { Ok(broken) })
    }

    fn reals(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerId, Lease>> {
        self.real.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands out `real` under a token of the source's.
    async fn retoken(&self, real: Lease) -> Result<Lease, LockError> {
        let token = match self.source.token(real.key()).await {
            Ok(token) => token,
            Err(e) => {
                let _ = self.inner.release(real).await;
                return Err(e);
            }
        };
        self.reals().insert(real.owner(), real.clone());
        Ok(real.with_token(token))
    }
}

#[async_trait]
impl<S: TokenSource> DistributedLock for Retokened<S> {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        match self.inner.try_acquire(key, ttl).await? {
            Some(lease) => self.retoken(lease).await.map(Some),
            None => Ok(None),
        }
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let lease = self.inner.acquire(key, opts).await?;
        self.retoken(lease).await
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let real = self.reals().get(&lease.owner()).cloned();
        let Some(mut real) = real else {
            return Err(LockError::lost("broken lock: no such lease"));
        };
        self.inner.extend(&mut real, ttl).await?;
        *lease = real.clone().with_token(lease.token());
        self.reals().insert(real.owner(), real);
        Ok(())
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let real = self.reals().remove(&lease.owner()).unwrap_or(lease);
        let released = self.inner.release(real).await;
        self.source.released().await;
        released
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    fn capabilities(&self) -> Capabilities {
        // Broken in its exclusive grants only: no shared mode.
        Capabilities {
            shared: false,
            ..self.inner.capabilities()
        }
    }
}

/// How a [`FlawedExtend`] lock extends.
#[async_trait]
pub trait ExtendFlaw: Send + Sync + fmt::Debug + 'static {
    /// Extends `lease` by `ttl` through the real client `inner`, flawed.
    ///
    /// # Cancel safety
    /// As `inner`'s `extend`.
    async fn extend(
        &self,
        inner: &dyn DistributedLock,
        lease: &mut Lease,
        ttl: Duration,
    ) -> Result<(), LockError>;
}

/// The real client, but for how it extends.
#[derive(Debug)]
pub struct FlawedExtend<F> {
    inner: Arc<dyn DistributedLock>,
    flaw: F,
}

impl<F: ExtendFlaw> FlawedExtend<F> {
    /// `inner`, extending with `flaw`.
    pub fn new(inner: Arc<dyn DistributedLock>, flaw: F) -> Self {
        Self { inner, flaw }
    }
}

impl<F: ExtendFlaw + Default> FlawedExtend<F> {
    /// A [`WrapFn`]: `inner` extending with the flaw's default.
    pub fn wrap(
        _url: String,
        inner: Arc<dyn DistributedLock>,
    ) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
        let broken: Arc<dyn DistributedLock> = Arc::new(Self::new(inner, F::default()));
        Box::pin(async move { Ok(broken) })
    }
}

#[async_trait]
impl<F: ExtendFlaw> DistributedLock for FlawedExtend<F> {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(key, ttl).await
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.inner.acquire(key, opts).await
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        self.flaw.extend(self.inner.as_ref(), lease, ttl).await
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    fn capabilities(&self) -> Capabilities {
        // Broken in its exclusive grants only: no shared mode.
        Capabilities {
            shared: false,
            ..self.inner.capabilities()
        }
    }
}
