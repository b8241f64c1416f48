//! Counting semaphores on any lock: up to N holders of one name at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, Fairness, HolderInfo, Lease,
    LockError, LockKey, ReleaseOutcome,
};

/// Up to `permits` holders of one name at once, on any [`DistributedLock`].
///
/// Permit `i` of name `K` is the lock `K#permit-i`, and a `Semaphore` is itself a
/// [`DistributedLock`]: `try_acquire(K, ttl)` takes a free permit of `K`. So a permit has
/// everything a lease has — a TTL, extension, the renewing [`LockGuard`](crate::LockGuard)
/// with its lost signal — on every backend, and a crashed holder's permit comes back when
/// its lease ends (TTL, session or connection), never later.
///
/// **Fencing is per permit.** A permit's [`Lease::key`] names the permit (`K#permit-i`),
/// and its token orders the grants of *that permit*: a store fences a permit's stale
/// holder by keeping one fenced record per permit key. (One token sequence for N
/// concurrent holders could not fence anything: their writes legitimately interleave.)
///
/// Every client of a name must use the same `permits`: one configured with more admits
/// up to its own count. Names ending in `#permit-<i>` are the permits' own: a plain lock
/// on `K#permit-0` competes with permit 0 of `K` (and a plain lock on `K` with none).
///
/// Costs: the permits are taken with the lock's
/// [`acquire_any`](DistributedLock::acquire_any) over the permit keys, from a random one
/// on, so that clients spread over the permits. On Redis that is one script call per
/// attempt whatever the count, and a waiter subscribes to every permit's release channel
/// (on the client's one subscriber connection) and tries again on any release. On
/// Postgres it is one statement per attempt (`FOR UPDATE SKIP LOCKED` over the permits'
/// rows). Elsewhere a `try_acquire` tries the permits one request each until one is free
/// (`permits` requests when all are held). A blocking
/// [`acquire`](DistributedLock::acquire) then waits on every permit at once, each as the
/// backend waits for a lock (push where it has one), and takes the first granted,
/// dropping the other waits (which backends leave no grant behind for). Each of those
/// waits costs what a lock waiter costs: on Postgres
/// a dedicated connection and a `max_waiting` slot, on ZooKeeper a queue node, on etcd a
/// watch. Waiters are not served in arrival order across permits.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure_api::{DistributedLock, LockKey, MemoryLock, Semaphore};
///
/// # tokio_test_block_on(async {
/// let uploads = Semaphore::new(Arc::new(MemoryLock::new()), 2)?;
/// let name = LockKey::new("uploads")?;
/// let ttl = Duration::from_secs(30);
/// let first = uploads.try_acquire(&name, ttl).await?.expect("a free permit");
/// let second = uploads.try_acquire(&name, ttl).await?.expect("a free permit");
/// assert!(uploads.try_acquire(&name, ttl).await?.is_none(), "both permits are taken");
/// assert_ne!(first.key(), second.key(), "one lease per permit");
/// uploads.release(first).await?;
/// assert!(uploads.try_acquire(&name, ttl).await?.is_some());
/// # Ok::<(), tenure_api::LockError>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    lock: Arc<dyn DistributedLock>,
    permits: u32,
}

impl Semaphore {
    /// The most permits a name may have: a blocking acquire waits on each of them at once.
    pub const MAX_PERMITS: u32 = 64;

    /// A semaphore of `permits` (1..=[`MAX_PERMITS`](Self::MAX_PERMITS)) per name on
    /// `lock`; another count is [`LockError::InvalidInput`].
    pub fn new(lock: Arc<dyn DistributedLock>, permits: u32) -> Result<Self, LockError> {
        if !(1..=Self::MAX_PERMITS).contains(&permits) {
            return Err(LockError::InvalidInput(format!(
                "a semaphore has 1 to {} permits, not {permits}",
                Self::MAX_PERMITS
            )));
        }
        Ok(Self { lock, permits })
    }

    /// How many holders a name admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lock key of permit `permit` of `name` (`name#permit-<permit>`); a name too
    /// long to take the suffix is [`LockError::InvalidInput`].
    pub fn permit_key(&self, name: &LockKey, permit: u32) -> Result<LockKey, LockError> {
        LockKey::new(format!("{name}#permit-{permit}"))
    }

    /// Every permit's key, starting at a random permit, so that clients spread over the
    /// permits instead of all asking for the first.
    fn permit_keys(&self, name: &LockKey) -> Result<Vec<LockKey>, LockError> {
        let start = rand::random::<u32>() % self.permits;
        (0..self.permits)
            .map(|i| self.permit_key(name, (start + i) % self.permits))
            .collect()
    }

    /// Each held permit of `name` with its holder, in permit order.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub async fn holders(&self, name: &LockKey) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let mut holders = Vec::new();
        for permit in 0..self.permits {
            let key = self.permit_key(name, permit)?;
            if let Some(holder) = self.lock.inspect(&key).await? {
                holders.push((key, holder));
            }
        }
        Ok(holders)
    }
}

#[async_trait]
impl DistributedLock for Semaphore {
    /// Takes a free permit of `key`: `Ok(None)` when all are held. A retryable error from
    /// one permit is returned only if no other permit was granted; any other error ends
    /// the attempt.
    ///
    /// # Cancel safety
    /// As the lock's [`acquire_any`](DistributedLock::acquire_any).
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let once = AcquireOptions::new(ttl).wait(Duration::ZERO);
        match self.lock.acquire_any(&self.permit_keys(key)?, &once).await {
            Ok(lease) => Ok(Some(lease)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes a free permit, or waits up to `opts.wait` for any permit of `key` and takes
    /// the first granted: the lock's [`acquire_any`](DistributedLock::acquire_any) over
    /// the permits. As with a lock, a retryable error is waited out within the wait, and
    /// returned instead of [`LockError::Timeout`] if it was the last word.
    ///
    /// # Cancel safety
    /// As the lock's [`acquire_any`](DistributedLock::acquire_any).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.lock.acquire_any(&self.permit_keys(key)?, opts).await
    }

    /// Extends the permit the lease holds.
    ///
    /// # Cancel safety
    /// As the lock's `extend`.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        self.lock.extend(lease, ttl).await
    }

    /// Gives the lease's permit back.
    ///
    /// # Cancel safety
    /// As the lock's `release`.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        self.lock.release(lease).await
    }

    /// A holder of `key` (the first held permit's; see [`Semaphore::holders`] for all of
    /// them), or `None` when every permit is free. `Some` does not mean full: other
    /// permits may be free.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        for permit in 0..self.permits {
            if let Some(holder) = self.lock.inspect(&self.permit_key(key, permit)?).await? {
                return Ok(Some(holder));
            }
        }
        Ok(None)
    }

    /// The lock's capabilities; waiters are not served in order across several permits.
    fn capabilities(&self) -> Capabilities {
        let caps = self.lock.capabilities();
        match self.permits {
            1 => caps,
            _ => Capabilities {
                fairness: Fairness::None,
                ..caps
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryLock;

    #[test]
    fn a_permit_count_outside_the_range_is_refused() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        for permits in [0, Semaphore::MAX_PERMITS + 1] {
            let error = Semaphore::new(lock.clone(), permits).unwrap_err();
            assert!(matches!(error, LockError::InvalidInput(_)), "{error:?}");
        }
        assert_eq!(Semaphore::new(lock, 3).unwrap().permits(), 3);
    }

    #[tokio::test]
    async fn a_guard_holds_a_permit_and_gives_it_back() {
        use crate::LockExt;
        let uploads = Arc::new(Semaphore::new(Arc::new(MemoryLock::new()), 1).unwrap());
        let name = LockKey::new("uploads").unwrap();
        let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::ZERO);
        let guard = uploads.lock(&name, &opts).await.unwrap();
        assert_eq!(guard.key().as_str(), "uploads#permit-0");
        let busy = uploads.lock(&name, &opts).await.err();
        assert!(matches!(busy, Some(LockError::Timeout { .. })), "{busy:?}");
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        assert!(uploads.inspect(&name).await.unwrap().is_none());
    }

    #[test]
    fn permit_keys_cover_every_permit_once() {
        let semaphore = Semaphore::new(Arc::new(MemoryLock::new()), 5).unwrap();
        let name = LockKey::new("jobs").unwrap();
        let mut keys: Vec<String> = semaphore
            .permit_keys(&name)
            .unwrap()
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect();
        keys.sort();
        let expected: Vec<String> = (0..5).map(|i| format!("jobs#permit-{i}")).collect();
        assert_eq!(keys, expected);
        let long = LockKey::new("x".repeat(LockKey::MAX_LEN)).unwrap();
        assert!(matches!(
            semaphore.permit_key(&long, 0),
            Err(LockError::InvalidInput(_))
        ));
    }
}
