//! The [`DistributedLock`] trait and the bounded polling loop shared by polling backends.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AcquireOptions, Capabilities, Clock, HolderInfo, Lease, LockError, LockKey, ReleaseOutcome,
};

/// A lock service: leases with a TTL, extension, and a fencing token per grant.
///
/// Object-safe, so the backend can be chosen at run time:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure_api::{DistributedLock, LockKey, MemoryLock};
///
/// # tokio_test_block_on(async {
/// let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let key = LockKey::new("reports/daily")?;
/// let lease = lock.try_acquire(&key, Duration::from_secs(10)).await?.expect("free");
/// assert!(lock.try_acquire(&key, Duration::from_secs(10)).await?.is_none());
/// lock.release(lease).await?;
/// # Ok::<(), tenure_api::LockError>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
///
/// Implementations convert their client errors into [`LockError`] and keep those client
/// types private. Every method is a single bounded operation: none retries forever (the
/// stream [`holder_changes`](Self::holder_changes) gives is a feed, not a method call).
#[async_trait]
pub trait DistributedLock: Send + Sync + Debug {
    /// One attempt to take `key` for `ttl`. `Ok(None)`: someone else holds it. Never waits.
    ///
    /// # Cancel safety
    /// Dropping the future may leave a grant on the server that nobody holds a [`Lease`]
    /// for; it is freed by the TTL (or session/connection end) at the latest. Backends
    /// document where they do better.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError>;

    /// Waits up to `opts.wait` for `key`, woken by the backend's push signal where it has
    /// one. [`LockError::Timeout`] when the wait ends with the lock still held elsewhere.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire); a dropped wait leaves no waiter behind.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError>;

    /// Waits up to `opts.wait` for `key` in shared mode, as one of its readers (the read
    /// side of an [`RwLock`](crate::RwLock)); a zero wait is one attempt. The key's plain
    /// lock ([`try_acquire`](Self::try_acquire), [`acquire`](Self::acquire)) is its
    /// writer: readers hold the key together, a writer holds it alone, and a writer
    /// waiting for the key holds back the readers that come after it, so a stream of
    /// readers never starves a writer. [`LockError::Timeout`] when the wait ends with a
    /// writer holding or ahead in line.
    ///
    /// The lease is [`shared`](Lease::is_shared); [`extend`](Self::extend),
    /// [`release`](Self::release) and guards take it as they take a writer's, and each
    /// reader's lease is its own (one ends, the others hold). Its token is larger than
    /// every token granted for the key before it, a writer's after it larger than every
    /// reader's: a store that keeps the highest token it has seen turns away a writer
    /// that lost its lease once a newer reader or writer has been there. Readers'
    /// tokens order readers among themselves too, but readers run at the same time:
    /// a reader's token promises only that no writer holds the key while its lease lasts.
    ///
    /// The provided method is [`LockError::Config`]: the backend has no shared mode
    /// ([`Capabilities::shared`] is false).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let _ = (key, opts);
        Err(LockError::Config(format!(
            "the {} backend has no shared (read) locks",
            self.capabilities().backend
        )))
    }

    /// Pushes the lease's deadline to now + `ttl`. [`LockError::LeaseLost`] if the lock is
    /// no longer ours — it never re-acquires.
    ///
    /// # Cancel safety
    /// Dropping the future leaves `lease` as it was; the server may or may not have
    /// applied the extension, which only ever lengthens our own grant.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError>;

    /// Releases the lock if it is still ours; never deletes another owner's lock.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lock held until its TTL expires.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError>;

    /// Who holds `key` now (owner, token, remaining time), or `None` if it is free.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError>;

    /// The guarantees this backend, in this configuration, declares.
    fn capabilities(&self) -> Capabilities;

    /// Takes whichever of `keys` is free first, waiting up to `opts.wait` as
    /// [`acquire`](Self::acquire) does, and returns its lease ([`Lease::key`] says which).
    /// Free keys are tried in the order given. What a [`Semaphore`](crate::Semaphore)'s
    /// permits are made of.
    ///
    /// [`LockError::Timeout`] when every key stayed held; when a key's last attempt failed
    /// with a retryable error instead, that error is returned, so that "unreachable" is
    /// never reported as "held". An empty `keys` is [`LockError::InvalidInput`].
    ///
    /// The provided method tries each key in turn (a labelled try is an `acquire` with a
    /// zero wait, as `try_acquire` takes no label), then waits on every key at once with
    /// [`acquire`](Self::acquire) and keeps the first grant. A backend overrides it where
    /// it can do better: Redis tries every key in one script call and wakes on any key's
    /// release; Postgres tries every key in one statement.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire), for each key: the waits not granted are dropped.
    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        acquire_each(self, keys, opts).await
    }

    /// Who holds each of `keys`, in order — what [`inspect`](Self::inspect) answers for
    /// each —, read at once. The provided method inspects the keys concurrently
    /// ([`inspect_concurrently`]); Redis reads them in one script call. What a
    /// [`Semaphore`](crate::Semaphore) reads its other permits with; a wrapper forwards it
    /// to keep a backend's one call.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        inspect_concurrently(self, keys).await
    }

    /// The holders of `key` as the backend pushes them: the current holder (`None`: free)
    /// first, then each later holder and vacancy in order, each once — every holder as
    /// the server saw it, including a grant its requester gave up on as it came (a wait
    /// that timed out at that moment): what [`inspect`](Self::inspect) would have
    /// answered at each step. `remaining` is `None` in these readings. A failed reading is
    /// an `Err` item and the feed goes on, resuming where it was (the backend documents
    /// what, if anything, a long break can hide, and how briefly a holder may hold and
    /// still be seen); the stream, unlike the methods, never ends by itself. `None` when
    /// the backend has no such feed — the provided method —, and callers read with
    /// [`inspect`](Self::inspect) instead; etcd (a watch on the key's queue: every holder)
    /// and ZooKeeper (a persistent watch on the key's directory: every holder whose node
    /// outlives one read) have one. What [`Election::observe`](crate::Election::observe)
    /// follows; a wrapper forwards it, or its users fall back to reading.
    ///
    /// # Cancel safety
    /// Read-only: dropping the stream ends the feed.
    fn holder_changes(&self, key: &LockKey) -> Option<HolderFeed> {
        let _ = key;
        None
    }
}

/// A stream of holders, from [`DistributedLock::holder_changes`].
pub type HolderFeed = futures::stream::BoxStream<'static, Result<Option<HolderInfo>, LockError>>;

/// What the provided [`DistributedLock::inspect_each`] does: every key's
/// [`inspect`](DistributedLock::inspect), concurrently, in order; the first error ends it.
///
/// # Cancel safety
/// Read-only: cancel-safe.
pub async fn inspect_concurrently<L: DistributedLock + ?Sized>(
    lock: &L,
    keys: &[LockKey],
) -> Result<Vec<Option<HolderInfo>>, LockError> {
    futures::future::try_join_all(keys.iter().map(|key| lock.inspect(key))).await
}

/// What the provided [`DistributedLock::acquire_any`] does, for a backend that overrides
/// it only in some configurations (Redis in a Cluster, where the keys sit in different
/// hash slots): tries each key in turn (a labelled try is an `acquire` with a zero
/// wait), then waits on every key at once with `acquire` and keeps the first grant.
///
/// # Cancel safety
/// As [`DistributedLock::acquire`], for each key: the waits not granted are dropped.
pub async fn acquire_each<L: DistributedLock + ?Sized>(
    lock: &L,
    keys: &[LockKey],
    opts: &AcquireOptions,
) -> Result<Lease, LockError> {
    opts.validate()?;
    let keys = validate_keys(keys)?;
    let started = std::time::Instant::now();
    let mut failed = None;
    for key in keys {
        let attempt = match opts.label {
            None => lock.try_acquire(key, opts.ttl).await,
            Some(_) => match lock.acquire(key, &opts.clone().wait(Duration::ZERO)).await {
                Ok(lease) => Ok(Some(lease)),
                Err(LockError::Timeout { .. }) => Ok(None),
                Err(e) => Err(e),
            },
        };
        match attempt {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) => {}
            Err(e) if e.is_retryable() => failed = Some(e),
            Err(e) => return Err(e),
        }
    }
    wait_for_any(lock, keys, opts, started, failed).await
}

/// The second half of [`acquire_each`], for a backend that tries every key its own way
/// first (Postgres: in one statement): what is left of `opts.wait` since `started`,
/// waiting on every key at once with [`DistributedLock::acquire`] and keeping the first
/// grant. With no wait left, `failed` (the tries' retryable error), or else
/// [`LockError::Timeout`].
///
/// # Cancel safety
/// As [`DistributedLock::acquire`], for each key: the waits not granted are dropped.
pub async fn wait_for_any<L: DistributedLock + ?Sized>(
    lock: &L,
    keys: &[LockKey],
    opts: &AcquireOptions,
    started: std::time::Instant,
    failed: Option<LockError>,
) -> Result<Lease, LockError> {
    let timeout = |started: std::time::Instant| LockError::Timeout {
        waited: started.elapsed(),
    };
    let Some(wait) = opts
        .wait
        .checked_sub(started.elapsed())
        .filter(|w| !w.is_zero())
    else {
        return Err(failed.unwrap_or_else(|| timeout(started)));
    };
    let opts = opts.clone().wait(wait);
    let mut waits: futures::stream::FuturesUnordered<_> =
        keys.iter().map(|key| lock.acquire(key, &opts)).collect();
    // The waits' own last words: a wait that saw its key held ends in Timeout.
    let mut failed = None;
    while let Some(result) = futures::StreamExt::next(&mut waits).await {
        match result {
            Ok(lease) => return Ok(lease),
            Err(LockError::Timeout { .. }) => {}
            Err(e) if e.is_retryable() => failed = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(failed.unwrap_or_else(|| timeout(started)))
}

/// `keys`, or [`LockError::InvalidInput`] when there are none: for implementations of
/// [`DistributedLock::acquire_any`].
pub fn validate_keys(keys: &[LockKey]) -> Result<&[LockKey], LockError> {
    if keys.is_empty() {
        return Err(LockError::InvalidInput(
            "acquire_any needs at least one key".into(),
        ));
    }
    Ok(keys)
}

#[async_trait]
impl<L: DistributedLock + ?Sized> DistributedLock for Arc<L> {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        (**self).try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        (**self).acquire(key, opts).await
    }
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        (**self).acquire_shared(key, opts).await
    }
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        (**self).extend(lease, ttl).await
    }
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        (**self).release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        (**self).inspect(key).await
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        (**self).acquire_any(keys, opts).await
    }
    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        (**self).inspect_each(keys).await
    }
    fn holder_changes(&self, key: &LockKey) -> Option<HolderFeed> {
        (**self).holder_changes(key)
    }
}

/// The bounded retry loop for backends without a push signal (and for waiting out
/// transient errors): calls `attempt` until it yields a lease, sleeping per
/// `opts.backoff` in between, for at most `opts.wait`.
///
/// Retryable errors ([`LockError::is_retryable`]) are retried within the bound; if the
/// last attempt failed with one, that error is returned instead of
/// [`LockError::Timeout`], so "backend down" is never reported as "held". Other errors
/// end the loop at once.
///
/// # Cancel safety
/// As cancel-safe as one `attempt`.
pub async fn poll_acquire<F, Fut>(
    clock: &dyn Clock,
    opts: &AcquireOptions,
    attempt: F,
) -> Result<Lease, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Lease>, LockError>>,
{
    poll_acquire_woken(clock, opts, attempt, std::future::pending).await
}

/// [`poll_acquire`] for backends that can hear of a release but cannot queue waiters:
/// after each failed attempt, the backoff pause is cut short when the future `released()`
/// returns resolves. `released()` is called before each attempt, so that a release
/// signalled while the attempt was finding the key held ends the pause after it — where
/// its future registers when made (tokio's `Notify::notified` does, for
/// `notify_waiters`), not only once polled as an `async` block does. The backoff grows as
/// in plain polling; each wake-up adds one attempt, so the signal's rate bounds the extra
/// attempts, and a signal that never comes leaves plain polling.
///
/// # Cancel safety
/// As cancel-safe as one `attempt` and one `released()` future.
pub async fn poll_acquire_woken<F, Fut, W, WFut>(
    clock: &dyn Clock,
    opts: &AcquireOptions,
    mut attempt: F,
    mut released: W,
) -> Result<Lease, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Lease>, LockError>>,
    W: FnMut() -> WFut,
    WFut: Future<Output = ()>,
{
    opts.validate()?;
    let started = clock.now();
    let deadline = opts.wait_deadline(started);
    let mut tries = 0u32;
    loop {
        // Made before the attempt: a release during it is not missed (see above).
        let woken = released();
        let last_error = match attempt().await {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) => None,
            Err(e) if e.is_retryable() => Some(e),
            Err(e) => return Err(e),
        };
        let now = clock.now();
        if now >= deadline {
            return Err(last_error.unwrap_or(LockError::Timeout {
                waited: now - started,
            }));
        }
        let pause = opts.backoff.delay(tries).min(deadline - now);
        tries = tries.saturating_add(1);
        let sleep = clock.sleep_until(now + pause);
        futures::pin_mut!(sleep, woken);
        futures::future::select(sleep, woken).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryLock;

    #[tokio::test]
    async fn acquire_any_takes_the_first_free_key_or_waits_for_any() {
        let lock = Arc::new(MemoryLock::new());
        let ttl = Duration::from_secs(30);
        let keys: Vec<LockKey> = ["a", "b", "c"].map(|k| LockKey::new(k).unwrap()).into();
        let now = AcquireOptions::new(ttl).wait(Duration::ZERO);
        let empty = lock.acquire_any(&[], &now).await.unwrap_err();
        assert!(matches!(empty, LockError::InvalidInput(_)), "{empty:?}");
        let a = lock.try_acquire(&keys[0], ttl).await.unwrap().unwrap();
        let b = lock.acquire_any(&keys, &now).await.unwrap();
        assert_eq!(b.key(), &keys[1], "the first free key, in order");
        let c = lock
            .acquire_any(&keys, &now.clone().label("c"))
            .await
            .unwrap();
        assert_eq!(c.key(), &keys[2]);
        let holder = lock.inspect(&keys[2]).await.unwrap().unwrap();
        assert_eq!(holder.label.as_deref(), Some("c"), "the label is kept");
        let full = lock.acquire_any(&keys, &now).await.unwrap_err();
        assert!(matches!(full, LockError::Timeout { .. }), "{full:?}");
        let waiter = tokio::spawn({
            let (lock, keys) = (lock.clone(), keys.clone());
            async move {
                let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(60));
                lock.acquire_any(&keys, &opts).await
            }
        });
        lock.release(b).await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert_eq!(got.key(), &keys[1], "the key released");
        for lease in [a, c, got] {
            lock.release(lease).await.unwrap();
        }
    }
}
