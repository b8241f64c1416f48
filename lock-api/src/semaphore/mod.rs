//! Counting semaphores on any lock: up to N holders of one name at once.

mod count;

use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// **Every client of a name must use the same `permits`, and a try that disagrees is
/// refused.** Each permit's grant records the count (in its label: `permits=<N>`, then the
/// holder's own label, which [`holders`](Semaphore::holders) and
/// [`inspect`](DistributedLock::inspect) give back without it). A try whose count differs
/// from that of a live permit among its own permits (`0..permits`) is
/// [`LockError::Config`], naming both counts: after a grant, by reading the other
/// permits (and giving the grant back if one disagrees); before a wait, by reading the
/// permits that kept the first attempt out. So a second count is refused while the first
/// one's holders live: to change a name's count, let its holders drain or use a new name.
/// What this cannot see: a run reads only its own permits (`0..permits`), so beside a
/// larger count's holder on a permit at or beyond a smaller count, runs of the smaller
/// count are admitted up to their own count (more hold at once than they were sized
/// for); the next run of the larger count is refused. And two runs of different counts
/// granted at the same moment may both be refused (each sees the other's grant before it
/// is given back): neither is ever admitted beside the other. Records with no count (another recipe's
/// client on a permit's key, a tenure before counts were recorded) are not compared, and
/// a lock without [`labels`](Capabilities::labels) records none. Names ending in
/// `#permit-<i>` are the permits' own: a plain lock on `K#permit-0` competes with permit
/// 0 of `K` (and a plain lock on `K` with none).
///
/// Costs: the count's check reads the try's other permits (at once) after a grant, and
/// every permit once before a wait. The permits are taken with the lock's
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

    /// The longest label ([`AcquireOptions::label`]) a permit's holder may give, in bytes:
    /// the permit count is recorded with it.
    pub const MAX_LABEL: usize = count::MAX_PERMIT_LABEL;

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

    /// Each held permit of `name` with its holder, in permit order: the lock's
    /// [`inspect_each`](DistributedLock::inspect_each) over every permit.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub async fn holders(&self, name: &LockKey) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let keys: Vec<LockKey> = (0..self.permits)
            .map(|permit| self.permit_key(name, permit))
            .collect::<Result<_, _>>()?;
        let holders = self.lock.inspect_each(&keys).await?;
        Ok(keys
            .into_iter()
            .zip(holders)
            .filter_map(|(key, holder)| Some((key, count::untagged(holder?))))
            .collect())
    }

    /// `opts` with the count recorded in the label (for a lock that records labels).
    fn counted(&self, opts: &AcquireOptions) -> Result<AcquireOptions, LockError> {
        let label = count::tagged(self.permits, opts.label.as_deref())?;
        Ok(opts.clone().label(label))
    }

    /// [`LockError::Config`] when a live permit among `permits` (all but `ours`) was
    /// granted by a semaphore of another count; the permits are read at once.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn refuse_another_count(
        &self,
        name: &LockKey,
        permits: &[LockKey],
        ours: Option<&LockKey>,
    ) -> Result<(), LockError> {
        let others: Vec<&LockKey> = permits.iter().filter(|k| Some(*k) != ours).collect();
        let others: Vec<LockKey> = others.into_iter().cloned().collect();
        let holders = self.lock.inspect_each(&others).await?;
        for (permit, holder) in others.iter().zip(holders) {
            if let Some(holder) = holder {
                count::refuse_another(name, self.permits, permit, &holder)?;
            }
        }
        Ok(())
    }

    /// The lock's `acquire_any` over `permits`, then the count's check: a grant among
    /// permits held with another count is given back and refused; so is one whose check
    /// could not read the permits (with that error).
    ///
    /// # Cancel safety
    /// As the lock's [`acquire_any`](DistributedLock::acquire_any); a grant dropped
    /// during the check is given back by a task of its own.
    async fn grant_checked(
        &self,
        name: &LockKey,
        permits: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let lease = self.lock.acquire_any(permits, opts).await?;
        let unchecked = Unchecked {
            lock: self.lock.clone(),
            lease: Some(lease),
        };
        let ours = unchecked.lease.as_ref().map(Lease::key);
        let checked = self.refuse_another_count(name, permits, ours).await;
        unchecked.settle(checked).await
    }
}

/// A grant whose count is being checked: given back if the check fails or is dropped.
struct Unchecked {
    lock: Arc<dyn DistributedLock>,
    /// `None` once settled.
    lease: Option<Lease>,
}

impl Unchecked {
    /// The lease if `checked` passed; else it is given back and the refusal (or the
    /// failed read) is the answer.
    async fn settle(mut self, checked: Result<(), LockError>) -> Result<Lease, LockError> {
        let Some(lease) = self.lease.take() else {
            return Err(LockError::backend("a permit's grant was settled twice"));
        };
        match checked {
            Ok(()) => Ok(lease),
            Err(refused) => {
                // An unreleased grant ends with its TTL.
                let _ = self.lock.release(lease).await;
                Err(refused)
            }
        }
    }
}

impl Drop for Unchecked {
    fn drop(&mut self) {
        if let (Some(lease), Ok(runtime)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let lock = self.lock.clone();
            runtime.spawn(async move {
                let _ = lock.release(lease).await;
            });
        }
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
        match self.acquire(key, &once).await {
            Ok(lease) => Ok(Some(lease)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes a free permit, or waits up to `opts.wait` for any permit of `key` and takes
    /// the first granted: the lock's [`acquire_any`](DistributedLock::acquire_any) over
    /// the permits. As with a lock, a retryable error is waited out within the wait, and
    /// returned instead of [`LockError::Timeout`] if it was the last word. A try whose
    /// count differs from a live permit's is [`LockError::Config`] (see [`Semaphore`]),
    /// before it waits.
    ///
    /// # Cancel safety
    /// As the lock's [`acquire_any`](DistributedLock::acquire_any); a grant dropped during
    /// the count's check is given back by a task of its own.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let deadline = opts.wait_deadline(Instant::now());
        let permits = self.permit_keys(key)?;
        if !self.lock.capabilities().labels {
            // No count is recorded, so none can be compared.
            return self.lock.acquire_any(&permits, opts).await;
        }
        let opts = self.counted(opts)?;
        let mut attempt = opts.clone().wait(Duration::ZERO);
        let (mut read_before_waiting, mut failures) = (false, 0u32);
        loop {
            let result = self.grant_checked(key, &permits, &attempt).await;
            let left = || deadline.saturating_duration_since(Instant::now());
            let failed = match result {
                Err(e) if e.is_retryable() && !left().is_zero() => e,
                result => return result,
            };
            if !std::mem::replace(&mut read_before_waiting, true) {
                // Held (or unreachable): if by another count, say so instead of waiting.
                // A failed read is left to the wait; the check after a grant is binding.
                if let Err(refused @ LockError::Config(_)) =
                    self.refuse_another_count(key, &permits, None).await
                {
                    return Err(refused);
                }
            } else if !matches!(failed, LockError::Timeout { .. }) {
                // A check that failed after a grant: pause before the next grant.
                failures = failures.saturating_add(1);
                tokio::time::sleep(opts.backoff.delay(failures).min(left())).await;
            }
            match left() {
                wait if wait.is_zero() => return Err(failed),
                wait => attempt = opts.clone().wait(wait),
            }
        }
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
                return Ok(Some(count::untagged(holder)));
            }
        }
        Ok(None)
    }

    /// The lock's capabilities; waiters are not served in order across several permits.
    fn capabilities(&self) -> Capabilities {
        // A permit is taken whole: a semaphore has no shared mode of its own.
        let caps = Capabilities {
            shared: false,
            ..self.lock.capabilities()
        };
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

    #[tokio::test]
    async fn runs_that_disagree_on_the_count_are_refused() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let (two, three) = (
            Semaphore::new(lock.clone(), 2).unwrap(),
            Semaphore::new(lock.clone(), 3).unwrap(),
        );
        let name = LockKey::new("pm").unwrap();
        let ttl = Duration::from_secs(30);
        let opts = AcquireOptions::new(ttl).wait(Duration::ZERO).label("cron");
        let first = two.acquire(&name, &opts).await.unwrap();
        let second = two
            .try_acquire(&name, ttl)
            .await
            .unwrap()
            .expect("a free permit");
        // The permit a wider run would take is free: the grant is given back.
        let refused = three.try_acquire(&name, ttl).await.unwrap_err();
        assert!(matches!(refused, LockError::Config(_)), "{refused:?}");
        assert!(lock
            .inspect(&three.permit_key(&name, 2).unwrap())
            .await
            .unwrap()
            .is_none());
        // A narrower run finds every permit held, and is refused before it waits.
        let one = Semaphore::new(lock.clone(), 1).unwrap();
        let waiting = AcquireOptions::new(ttl).wait(Duration::from_secs(30));
        let refused = one.acquire(&name, &waiting).await.unwrap_err();
        assert!(matches!(refused, LockError::Config(_)), "{refused:?}");
        // Holders read as their own clients labelled them; the record keeps the count.
        let holders = two.holders(&name).await.unwrap();
        let labels: Vec<_> = holders.iter().map(|(_, h)| h.label.clone()).collect();
        assert!(
            labels.contains(&Some("cron".into())) && labels.contains(&None),
            "{labels:?}"
        );
        let raw = lock.inspect(first.key()).await.unwrap().unwrap();
        assert_eq!(raw.label.as_deref(), Some("permits=2 cron"));
        // Drained, the name takes the new count.
        lock.release(first).await.unwrap();
        lock.release(second).await.unwrap();
        assert!(three.try_acquire(&name, ttl).await.unwrap().is_some());
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
