//! All of several keys or none, on any lock: [`MultiLock`] and its [`MultiGuard`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::{
    AcquireOptions, DistributedLock, FencingToken, LockError, LockExt, LockGuard, LockKey,
    ReleaseOutcome,
};

/// All of several keys or none, on any [`DistributedLock`]: one lease per key, behind one
/// [`MultiGuard`] that renews them all and releases them together.
///
/// **Deadlock-free by order.** The keys are taken one after another in one fixed order
/// (sorted by name, whatever order they were given in), each waiting for what is left of
/// one wait bound; if one cannot be had within it, the keys taken so far are released and
/// the error is returned: all or none. So two multi-locks on overlapping keys never wait
/// for each other in a cycle (each waits only for keys after all it holds), and a key
/// already held keeps its holder. Taken keys are renewed while later ones are awaited.
///
/// **Fencing is per key.** Each key's lease has its own token
/// ([`MultiGuard::fencing_tokens`]); a store fences a stale holder of a key by keeping the
/// highest token it has seen for that key.
///
/// **When one key's lease is lost** (its TTL ran out unrenewed, its session or
/// connection ended) while the others hold, the guard reports it — [`is_lost`] turns
/// true, [`lost`] completes, [`lost_keys`] names it — and keeps the others until it is
/// released or dropped: stop the work that needed all of them, then release the guard.
///
/// [`is_lost`]: MultiGuard::is_lost
/// [`lost`]: MultiGuard::lost
/// [`lost_keys`]: MultiGuard::lost_keys
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure_api::{AcquireOptions, DistributedLock, LockKey, MemoryLock, MultiLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tenure_api::LockError> {
/// let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let (from, to) = (LockKey::new("account/17")?, LockKey::new("account/4")?);
/// let transfer = MultiLock::new(lock.clone(), [from.clone(), to.clone()])?;
/// let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
/// let guard = transfer.lock(&opts).await?;
/// for (key, token) in guard.fencing_tokens() {
///     println!("write {key} with fence {token}");
/// }
/// assert!(lock.try_acquire(&to, Duration::from_secs(30)).await?.is_none());
/// guard.release().await?;
/// assert!(lock.try_acquire(&to, Duration::from_secs(30)).await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    lock: Arc<dyn DistributedLock>,
    keys: Vec<LockKey>,
    shared: bool,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("lock", &self.lock)
            .field("keys", &self.keys)
            .field("shared", &self.shared)
            .finish()
    }
}

impl MultiLock {
    /// The keys `keys` (at least one, each once) on `lock`. No key, or a key given twice,
    /// is [`LockError::InvalidInput`].
    pub fn new(
        lock: Arc<dyn DistributedLock>,
        keys: impl IntoIterator<Item = LockKey>,
    ) -> Result<Self, LockError> {
        let mut keys: Vec<LockKey> = keys.into_iter().collect();
        if keys.is_empty() {
            return Err(LockError::InvalidInput("a multi-lock needs a key".into()));
        }
        keys.sort();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(LockError::InvalidInput(format!(
                "key `{}` is given twice to one multi-lock",
                pair[0]
            )));
        }
        Ok(Self {
            lock,
            keys,
            shared: false,
        })
    }

    /// The same keys taken shared: each as one of its readers
    /// ([`LockExt::lock_shared`], the read side of an [`RwLock`](crate::RwLock)), in the
    /// same order, all or none. [`LockError::Config`] if the backend has no shared mode.
    pub fn shared(self) -> Result<Self, LockError> {
        let caps = self.lock.capabilities();
        if !caps.shared {
            return Err(LockError::Config(format!(
                "the {} backend has no shared (read) locks",
                caps.backend
            )));
        }
        Ok(Self {
            shared: true,
            ..self
        })
    }

    /// Whether the keys are taken shared ([`shared`](Self::shared)).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The keys, in the order they are taken (sorted).
    pub fn keys(&self) -> &[LockKey] {
        &self.keys
    }

    /// Takes every key, in order, each waiting for what is left of `opts.wait` (so a
    /// zero wait is one attempt per key), and returns a guard renewing them all; `opts`'
    /// TTL and label go to every key. If a key cannot be had, the keys taken are given
    /// back and its error is returned ([`LockError::Timeout`] while it is held
    /// elsewhere); if a key taken was lost while later ones were awaited, they all are,
    /// and the error is [`LockError::LeaseLost`] naming it — a guard is never handed out
    /// with a key already lost. Giving back is best effort: a key whose release fails
    /// stays held until its lease ends (TTL, session or connection).
    ///
    /// # Cancel safety
    /// Dropped midway, the keys taken so far are released in the background (their
    /// guards' drop), and the one being awaited as [`LockExt::lock`] leaves it.
    pub async fn lock(&self, opts: &AcquireOptions) -> Result<MultiGuard, LockError> {
        let stop = std::future::pending::<std::convert::Infallible>();
        match self.lock_until(opts, stop).await? {
            Ok(guard) => Ok(guard),
            Err(never) => match never {},
        }
    }

    /// As [`lock`](Self::lock), given up if `stop` completes first: the keys taken so
    /// far are then released — awaited, not left to a background task that a process
    /// about to exit would never run — and `stop`'s output is returned as `Ok(Err(_))`.
    /// What `tenure run` waits with, so that a signal during the wait frees every key.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn lock_until<S: Future>(
        &self,
        opts: &AcquireOptions,
        stop: S,
    ) -> Result<Result<MultiGuard, S::Output>, LockError> {
        opts.validate()?;
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut stop = std::pin::pin!(stop);
        let mut guards = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let left = deadline.saturating_duration_since(Instant::now());
            let key_opts = opts.clone().wait(left);
            let taken = tokio::select! {
                taken = self.take(key, &key_opts) => taken,
                stopped = &mut stop => {
                    release_all(guards).await;
                    return Ok(Err(stopped));
                }
            };
            let taken = taken.and_then(|guard| {
                guards.push(guard);
                lost_while_waiting(&guards)
            });
            if let Err(error) = taken {
                release_all(guards).await;
                return Err(match error {
                    // The whole wait, not the last key's share of it.
                    LockError::Timeout { .. } => LockError::Timeout {
                        waited: started.elapsed(),
                    },
                    other => other,
                });
            }
        }
        Ok(Ok(MultiGuard { guards }))
    }
}

impl MultiLock {
    /// One key's guard, exclusive or shared as the multi-lock takes its keys.
    ///
    /// # Cancel safety
    /// As [`LockExt::lock`].
    async fn take(&self, key: &LockKey, opts: &AcquireOptions) -> Result<LockGuard, LockError> {
        match self.shared {
            false => self.lock.lock(key, opts).await,
            true => self.lock.lock_shared(key, opts).await,
        }
    }
}

/// [`LockError::LeaseLost`] if a key of `guards` is lost.
fn lost_while_waiting(guards: &[LockGuard]) -> Result<(), LockError> {
    match guards.iter().find(|guard| guard.is_lost()) {
        Some(lost) => Err(LockError::lost(format!(
            "`{}` was lost while later keys were awaited ({})",
            lost.key(),
            lost.lost_signal()
                .reason()
                .unwrap_or_else(|| "its deadline passed".into())
        ))),
        None => Ok(()),
    }
}

/// Releases `guards` at once, their errors ignored: for an attempt that is given up.
async fn release_all(guards: Vec<LockGuard>) {
    futures::future::join_all(guards.into_iter().map(LockGuard::release)).await;
}

/// Every key of a [`MultiLock`], each on a renewing [`LockGuard`], released together.
/// Dropped without [`release`](Self::release), each key is released in the background on
/// the current Tokio runtime (with none, each lease ends by itself: TTL, session or
/// connection).
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The guard of each key, in key order.
    pub fn members(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Each key with its lease's fencing token, in key order.
    pub fn fencing_tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.guards
            .iter()
            .map(|guard| (guard.key().clone(), guard.fencing_token()))
            .collect()
    }

    /// The earliest of the keys' lease deadlines (each moves with its renewals).
    pub fn deadline(&self) -> Instant {
        let deadlines = self.guards.iter().map(LockGuard::deadline);
        deadlines.min().unwrap_or_else(Instant::now)
    }

    /// Why the first lost key was lost (`` `key`: reason ``), once one is.
    pub fn lost_reason(&self) -> Option<String> {
        let lost = self.guards.iter().find(|guard| guard.is_lost())?;
        let reason = lost.lost_signal().reason()?;
        Some(match self.guards.len() {
            1 => reason,
            _ => format!("`{}`: {reason}", lost.key()),
        })
    }

    /// True once any key's lease is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// The keys whose lease is lost.
    pub fn lost_keys(&self) -> Vec<LockKey> {
        self.guards
            .iter()
            .filter(|guard| guard.is_lost())
            .map(|guard| guard.key().clone())
            .collect()
    }

    /// Completes when any key's lease is lost, at the earliest deadline at the latest.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        let each = self.guards.iter().map(|guard| Box::pin(guard.lost()));
        futures::future::select_all(each).await;
    }

    /// Stops renewing and releases every key, at once (each whatever the others'
    /// outcome): [`ReleaseOutcome::Released`] if every key was still ours, else
    /// [`ReleaseOutcome::NotHeld`]; the first error, in key order.
    ///
    /// # Cancel safety
    /// Dropped midway, every key is still released ([`LockGuard::release`]).
    pub async fn release(self) -> Result<ReleaseOutcome, LockError> {
        let mut outcome = ReleaseOutcome::Released;
        let mut first_error = None;
        let released =
            futures::future::join_all(self.guards.into_iter().map(LockGuard::release)).await;
        for result in released {
            match result {
                Ok(ReleaseOutcome::Released) => {}
                Ok(ReleaseOutcome::NotHeld) => outcome = ReleaseOutcome::NotHeld,
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryLock;

    #[test]
    fn keys_are_taken_sorted_and_each_once() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let keys = ["c", "a", "b"].map(|k| LockKey::new(k).unwrap());
        let multi = MultiLock::new(lock.clone(), keys.clone()).unwrap();
        let names: Vec<&str> = multi.keys().iter().map(LockKey::as_str).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let twice = MultiLock::new(lock.clone(), [keys[0].clone(), keys[0].clone()]);
        assert!(
            matches!(twice, Err(LockError::InvalidInput(_))),
            "{twice:?}"
        );
        assert!(MultiLock::new(lock, []).is_err());
    }

    /// A key lost while a later one is awaited fails the whole lock: no guard is handed
    /// out with a key already lost, and the later key is given back too.
    #[tokio::test]
    async fn a_key_lost_while_waiting_for_the_next_fails_the_lock() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let ttl = Duration::from_secs(30);
        let held = lock.try_acquire(&b, ttl).await.unwrap().unwrap();
        let multi = MultiLock::new(lock.clone(), [a.clone(), b.clone()]).unwrap();
        let short = AcquireOptions::new(Duration::from_millis(300)).wait(Duration::from_secs(10));
        let waiting = tokio::spawn(async move { multi.lock(&short).await });
        let holder = loop {
            if let Some(holder) = lock.inspect(&a).await.unwrap() {
                break holder;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // Released behind the multi-lock's back: its guard finds it lost at a renewal.
        let behind = crate::Lease::new(
            a.clone(),
            holder.owner,
            holder.token.unwrap(),
            Instant::now(),
            ttl,
            Duration::ZERO,
        );
        assert_eq!(
            lock.release(behind).await.unwrap(),
            ReleaseOutcome::Released
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        lock.release(held).await.unwrap();
        let refused = waiting.await.unwrap().unwrap_err();
        assert!(
            matches!(refused, LockError::LeaseLost { .. }),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("`a` was lost"), "{refused}");
        assert!(
            lock.inspect(&b).await.unwrap().is_none(),
            "b was given back"
        );
    }

    /// Stopped while it waits for a later key, it has given the keys it took back by the
    /// time it returns (a process exiting next leaves nothing held).
    #[tokio::test]
    async fn a_stopped_wait_gives_the_keys_taken_back_before_returning() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let ttl = Duration::from_secs(30);
        let held = lock.try_acquire(&b, ttl).await.unwrap().unwrap();
        let multi = MultiLock::new(lock.clone(), [a.clone(), b]).unwrap();
        let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(60));
        let stop = tokio::time::sleep(Duration::from_millis(200));
        let stopped = multi.lock_until(&opts, stop).await.unwrap();
        assert!(stopped.is_err(), "stopped, not granted");
        assert!(
            lock.inspect(&a).await.unwrap().is_none(),
            "a given back already"
        );
        lock.release(held).await.unwrap();
    }

    #[tokio::test]
    async fn all_or_none() {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let keys: Vec<LockKey> = ["a", "b", "c"].map(|k| LockKey::new(k).unwrap()).into();
        let ttl = Duration::from_secs(30);
        let b = lock.try_acquire(&keys[1], ttl).await.unwrap().unwrap();
        let multi = MultiLock::new(lock.clone(), keys.clone()).unwrap();
        let now = AcquireOptions::new(ttl).wait(Duration::ZERO);
        let refused = multi.lock(&now).await.unwrap_err();
        assert!(matches!(refused, LockError::Timeout { .. }), "{refused:?}");
        assert!(
            lock.inspect(&keys[0]).await.unwrap().is_none(),
            "a was given back"
        );
        lock.release(b).await.unwrap();
        let guard = multi.lock(&now).await.unwrap();
        assert_eq!(guard.fencing_tokens().len(), 3);
        assert!(!guard.is_lost() && guard.lost_keys().is_empty());
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        for key in &keys {
            assert!(lock.inspect(key).await.unwrap().is_none());
        }
    }
}
