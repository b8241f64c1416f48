//! [`LockGuard`]: a held lease renewed in the background that reports its own loss, and
//! the [`LockExt`] conveniences built on it.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    AcquireOptions, Clock, DistributedLock, FencingToken, Lease, LockError, LockKey,
    ReleaseOutcome, SystemClock,
};

/// Resolves when a guard's lease is lost. Cheap to clone; hand it to the code doing the
/// protected work so it can stop.
#[derive(Clone, Debug, Default)]
pub struct LostSignal {
    token: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl LostSignal {
    fn mark(&self, reason: String) {
        let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        self.token.cancel();
    }

    /// True once the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Why the lease was lost, once it has been.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Completes when the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        self.token.cancelled().await
    }
}

struct Shared<L: ?Sized> {
    lock: Arc<L>,
    lease: tokio::sync::Mutex<Option<Lease>>,
    stop: CancellationToken,
    lost: LostSignal,
    clock: Arc<dyn Clock>,
}

/// A held lock whose lease a background task renews every `ttl / 3`.
///
/// The first renewal that fails, or that does not complete before the lease's local
/// deadline (including one that wakes up late because the process was paused), marks
/// the lease lost: [`lost`](Self::lost) resolves and the guard never re-acquires.
/// [`release`](Self::release) is the normal end. Dropping the guard without releasing
/// spawns a best-effort release on the current tokio runtime (without blocking); with no
/// runtime, the TTL frees the lock.
pub struct LockGuard<L: DistributedLock + ?Sized + 'static = dyn DistributedLock> {
    shared: Arc<Shared<L>>,
    key: LockKey,
    token: FencingToken,
    watchdog: Option<JoinHandle<()>>,
}

impl<L: DistributedLock + ?Sized + 'static> fmt::Debug for LockGuard<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("lost", &self.shared.lost.is_lost())
            .finish()
    }
}

impl<L: DistributedLock + ?Sized + 'static> LockGuard<L> {
    /// Starts renewing `lease` on `lock`, timed by the system clock. Needs a tokio runtime.
    pub fn new(lock: Arc<L>, lease: Lease) -> Self {
        Self::with_clock(lock, lease, Arc::new(SystemClock))
    }

    /// As [`new`](Self::new), timed by `clock`.
    pub fn with_clock(lock: Arc<L>, lease: Lease, clock: Arc<dyn Clock>) -> Self {
        let key = lease.key().clone();
        let token = lease.token();
        let shared = Arc::new(Shared {
            lock,
            lease: tokio::sync::Mutex::new(Some(lease)),
            stop: CancellationToken::new(),
            lost: LostSignal::default(),
            clock,
        });
        let watchdog = tokio::spawn(watchdog(shared.clone()));
        Self {
            shared,
            key,
            token,
            watchdog: Some(watchdog),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of this grant: send it with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// True once the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_lost()
    }

    /// A handle that resolves on loss, to pass to the protected work.
    pub fn lost_signal(&self) -> LostSignal {
        self.shared.lost.clone()
    }

    /// Completes when the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        self.shared.lost.lost().await
    }

    /// A copy of the current lease (its deadline moves with each renewal).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lease(&self) -> Option<Lease> {
        self.shared.lease.lock().await.clone()
    }

    /// Stops renewing and releases the lock. Returns [`ReleaseOutcome::NotHeld`] if it was
    /// no longer ours.
    ///
    /// # Cancel safety
    /// If dropped, the lock is released in the background as by `Drop`.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.shared.stop.cancel();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.await;
        }
        let lease = self.shared.lease.lock().await.take();
        match lease {
            Some(lease) => self.shared.lock.release(lease).await,
            None => Ok(ReleaseOutcome::NotHeld),
        }
    }
}

impl<L: DistributedLock + ?Sized + 'static> Drop for LockGuard<L> {
    fn drop(&mut self) {
        self.shared.stop.cancel();
        let Some(watchdog) = self.watchdog.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the TTL frees the lock
        };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let _ = watchdog.await;
            let lease = shared.lease.lock().await.take();
            if let Some(lease) = lease {
                let _ = shared.lock.release(lease).await;
            }
        });
    }
}

async fn watchdog<L: DistributedLock + ?Sized>(shared: Arc<Shared<L>>) {
    let clock = &shared.clock;
    loop {
        let (valid_until, ttl, renewed_at) = {
            let lease = shared.lease.lock().await;
            let Some(lease) = lease.as_ref() else { return };
            (lease.valid_until(), lease.ttl(), clock.now())
        };
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock.sleep_until(renewed_at + renewal_interval(ttl)) => {}
        }
        if clock.now() >= valid_until {
            shared
                .lost
                .mark("renewal came too late: the lease deadline had already passed".into());
            return;
        }
        let mut slot = shared.lease.lock().await;
        let Some(lease) = slot.as_mut() else { return };
        let outcome = tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock.sleep_until(valid_until) => Err(LockError::lost(
                "renewal did not complete before the lease deadline",
            )),
            result = shared.lock.extend(lease, ttl) => result,
        };
        if let Err(error) = outcome {
            shared.lost.mark(format!("renewal failed: {error}"));
            return;
        }
    }
}

/// Conveniences on any shared lock: a renewing [`LockGuard`], and running a closure
/// under the lock.
pub trait LockExt {
    /// The lock type the guard holds.
    type Lock: DistributedLock + ?Sized + 'static;

    /// Acquires `key` (waiting up to `opts.wait`) and returns a renewing guard.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`].
    fn lock(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<LockGuard<Self::Lock>, LockError>> + Send;

    /// Acquires `key`, runs `work(token, lost)` under a renewing guard and releases.
    /// If the lease is lost first, `work` is cancelled (dropped) and the result is
    /// [`LockError::LeaseLost`].
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and releases the lock in the background.
    fn with_lock<F, Fut, T>(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        work: F,
    ) -> impl Future<Output = Result<T, LockError>> + Send
    where
        F: FnOnce(FencingToken, LostSignal) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;
}

impl<L: DistributedLock + ?Sized + 'static> LockExt for Arc<L> {
    type Lock = L;

    async fn lock(&self, key: &LockKey, opts: &AcquireOptions) -> Result<LockGuard<L>, LockError> {
        let lease = self.acquire(key, opts).await?;
        Ok(LockGuard::new(self.clone(), lease))
    }

    async fn with_lock<F, Fut, T>(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(FencingToken, LostSignal) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let guard = self.lock(key, opts).await?;
        let lost = guard.lost_signal();
        let result = tokio::select! {
            biased;
            _ = lost.lost() => None,
            value = work(guard.fencing_token(), lost.clone()) => Some(value),
        };
        match result {
            Some(value) => {
                guard.release().await?;
                Ok(value)
            }
            None => {
                let reason = lost.reason().unwrap_or_default();
                drop(guard);
                Err(LockError::lost(reason))
            }
        }
    }
}

/// How long the guard waits between renewals for a lease of `ttl`.
pub fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}
