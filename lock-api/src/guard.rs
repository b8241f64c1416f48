//! [`LockGuard`]: a held lease renewed in the background that reports its own loss, and
//! the [`LockExt`] conveniences built on it.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::LossNotice;
use crate::{
    AcquireOptions, Clock, DistributedLock, FencingToken, Lease, LockError, LockKey,
    ReleaseOutcome, SystemClock,
};

/// Resolves when a guard's lease is lost. Cheap to clone; hand it to the code doing the
/// protected work so it can stop.
///
/// The lease's deadline is part of the signal: [`is_lost`](Self::is_lost) compares it
/// with the clock, and [`lost`](Self::lost) completes at the deadline at the latest,
/// whether or not the renewal task has run. Time the machine spends suspended
/// ([`Clock::suspended`]: the servers' clocks run on while `Instant` stands still) since
/// the deadline was set counts against it, so a lease that ran out during a suspend is
/// lost on wake ([`lost`](Self::lost) looks at least every [`SUSPEND_CHECK`]). Where the
/// backend pushes losses (a [`LossNotice`] on the lease, e.g. a closed Postgres
/// connection), the signal is lost as soon as the notice fires.
///
/// What remains: for a guard built from a lease ([`LockGuard::new`]) rather than by
/// [`LockExt::lock`], a suspend while the grant's request was in flight is not counted
/// (renewals count from before they are sent); a clock that cannot tell suspends (not
/// Linux, or a VM paused by its hypervisor) counts none.
#[derive(Clone)]
pub struct LostSignal {
    inner: Arc<LostInner>,
}

struct LostInner {
    token: CancellationToken,
    reason: Mutex<Option<String>>,
    /// The local deadline of the current lease, and the clock's suspended total when it
    /// was set; moves forward with each renewal.
    deadline: Mutex<(Instant, Duration)>,
    clock: Arc<dyn Clock>,
    /// The backend's push notice of a loss, where it has one.
    notice: Option<LossNotice>,
    /// The last renewal's error while renewals fail for a reason that may pass (the
    /// guard retries them until the deadline): the reason given if the deadline passes.
    failing: Mutex<Option<String>>,
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lost", &self.is_lost())
            .field("reason", &self.reason())
            .finish()
    }
}

/// How often [`LostSignal::lost`] looks at the clock while it waits, so that a lease that
/// ran out during a suspend is reported at most this long after the machine wakes.
pub const SUSPEND_CHECK: Duration = Duration::from_secs(1);

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LostSignal {
    /// A signal for a lease whose local deadline is `deadline` on `clock`.
    pub fn new(deadline: Instant, clock: Arc<dyn Clock>) -> Self {
        Self::with_notice(deadline, clock, None)
    }

    /// As [`new`](Self::new), also lost as soon as the backend fires `notice`.
    pub fn with_notice(
        deadline: Instant,
        clock: Arc<dyn Clock>,
        notice: Option<LossNotice>,
    ) -> Self {
        let suspended = clock.suspended();
        Self::since(deadline, clock, notice, suspended)
    }

    /// As [`with_notice`](Self::with_notice), counting suspends from when the clock's
    /// suspended total was `suspended` (read before the grant's request was sent).
    fn since(
        deadline: Instant,
        clock: Arc<dyn Clock>,
        notice: Option<LossNotice>,
        suspended: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(LostInner {
                token: CancellationToken::new(),
                reason: Mutex::new(None),
                deadline: Mutex::new((deadline, suspended)),
                clock,
                notice,
                failing: Mutex::new(None),
            }),
        }
    }

    fn mark(&self, reason: impl Into<String>) {
        let mut slot = locked(&self.inner.reason);
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        drop(slot);
        self.inner.token.cancel();
    }

    /// Notes the last renewal's error (`None`: it succeeded), while retrying may cure it.
    fn note_renewal_error(&self, error: Option<&LockError>) {
        *locked(&self.inner.failing) = error.map(ToString::to_string);
    }

    /// Moves the deadline to `deadline` after a renewal (never once lost); `suspended`
    /// is the clock's suspended total read before the renewal was sent, so a suspend
    /// while it was in flight counts too.
    fn renewed(&self, deadline: Instant, suspended: Duration) {
        *locked(&self.inner.deadline) = (deadline, suspended);
    }

    /// The lease's current local deadline, moved earlier by the time the machine has
    /// spent suspended since it was set.
    pub fn deadline(&self) -> Instant {
        let (deadline, suspended_then) = *locked(&self.inner.deadline);
        let slept = self.inner.clock.suspended().saturating_sub(suspended_then);
        deadline
            .checked_sub(slept)
            .unwrap_or_else(|| self.inner.clock.now())
    }

    /// Marks the signal lost if the deadline has passed; true once lost.
    fn check_deadline(&self) -> bool {
        if self.inner.token.is_cancelled() {
            return true;
        }
        if let Some(notice) = self.inner.notice.as_ref().filter(|n| n.is_fired()) {
            self.mark(notice.reason().unwrap_or_default());
            return true;
        }
        let (_, suspended_then) = *locked(&self.inner.deadline);
        if self.inner.clock.now() >= self.deadline() {
            let slept = self.inner.clock.suspended().saturating_sub(suspended_then);
            let failing = locked(&self.inner.failing).clone();
            self.mark(if !slept.is_zero() {
                format!("the lease deadline passed while the machine was suspended for {slept:?}")
            } else if let Some(error) = failing {
                format!("the lease deadline passed while renewals failed: {error}")
            } else {
                "the lease deadline passed without a renewal".to_owned()
            });
            return true;
        }
        false
    }

    /// True once the lease has been lost — reported, or past its deadline on the clock.
    pub fn is_lost(&self) -> bool {
        self.check_deadline()
    }

    /// Why the lease was lost, once it has been.
    pub fn reason(&self) -> Option<String> {
        self.check_deadline();
        locked(&self.inner.reason).clone()
    }

    /// Completes when the lease is lost: when a renewal fails for good or the backend
    /// reports the loss, or at the lease's deadline at the latest.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        while !self.check_deadline() {
            let deadline = self.deadline();
            let notice = async {
                match &self.inner.notice {
                    Some(notice) => notice.fired().await,
                    None => std::future::pending().await,
                }
            };
            // A suspend does not move the clock: look again at least this often.
            let wake = deadline.min(self.inner.clock.now() + SUSPEND_CHECK);
            tokio::select! {
                _ = self.inner.token.cancelled() => return,
                _ = notice => {}
                _ = self.inner.clock.sleep_until(wake) => {}
            }
        }
    }
}

struct Shared<L: ?Sized> {
    lock: Arc<L>,
    /// The current lease; taken by release. Never held across an await.
    lease: Mutex<Option<Lease>>,
    stop: CancellationToken,
    lost: LostSignal,
    clock: Arc<dyn Clock>,
}

/// A held lock whose lease a background task renews.
///
/// The lease's local deadline is part of the guard's state: [`is_lost`](Self::is_lost)
/// compares it with the clock and [`lost`](Self::lost) fires at the deadline at the
/// latest, even if the renewal task is starved. The renewal task renews once a third of
/// the remaining validity (of at most the TTL) has passed — before the deadline, with
/// two thirds left for the round trip — and at once for a lease that reached the guard
/// with less than two thirds of its TTL left. A renewal that fails for a reason that may
/// pass ([`LockError::Unavailable`]: no reply, unreachable; [`LockError::NoQuorum`]) is
/// retried after a third of the time left (at least 10 ms) until the deadline; one that
/// fails for good (the lease is another's, a server error), or no renewal completing
/// before the deadline, marks the lease lost: the guard never re-acquires. If the
/// renewal task panics, the lease is reported lost too.
///
/// [`release`](Self::release) is the normal end. Dropping the guard without releasing
/// spawns a best-effort release on the current tokio runtime (without blocking); with no
/// runtime, the TTL frees the lock.
pub struct LockGuard<L: DistributedLock + ?Sized + 'static = dyn DistributedLock> {
    shared: Arc<Shared<L>>,
    key: LockKey,
    token: FencingToken,
    reader: bool,
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
    ///
    /// A lease whose deadline has already passed gives a guard that is lost from the
    /// start (see [`LockExt::lock`], which never hands such a guard out).
    pub fn new(lock: Arc<L>, lease: Lease) -> Self {
        Self::with_clock(lock, lease, Arc::new(SystemClock))
    }

    /// As [`new`](Self::new), timed by `clock`. A suspend of the machine counts against
    /// the lease from here on ([`LockExt::lock`] counts from before its acquire).
    pub fn with_clock(lock: Arc<L>, lease: Lease, clock: Arc<dyn Clock>) -> Self {
        let suspended = clock.suspended();
        Self::since(lock, lease, clock, suspended)
    }

    /// As [`with_clock`](Self::with_clock), counting suspends from the clock's
    /// suspended total `suspended`, read before the grant's request was sent.
    fn since(lock: Arc<L>, lease: Lease, clock: Arc<dyn Clock>, suspended: Duration) -> Self {
        let key = lease.key().clone();
        let reader = lease.is_shared();
        let token = lease.token();
        let notice = lease.loss_notice().cloned();
        let lost = LostSignal::since(lease.valid_until(), clock.clone(), notice, suspended);
        let shared = Arc::new(Shared {
            lock,
            lease: Mutex::new(Some(lease)),
            stop: CancellationToken::new(),
            lost: lost.clone(),
            clock,
        });
        let task = AssertUnwindSafe(watchdog(shared.clone())).catch_unwind();
        let watchdog = tokio::spawn(async move {
            if task.await.is_err() {
                lost.mark("the renewal task panicked");
            }
        });
        Self {
            shared,
            key,
            token,
            reader,
            watchdog: Some(watchdog),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Whether the guard holds a reader's lease ([`Lease::is_shared`]), shared with other
    /// readers, rather than the key alone.
    pub fn is_shared(&self) -> bool {
        self.reader
    }

    /// The fencing token of this grant: send it with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// True once the lease has been lost, or its deadline has passed on the guard's clock.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_lost()
    }

    /// The lease's current local deadline (moves forward with each renewal).
    pub fn deadline(&self) -> Instant {
        self.shared.lost.deadline()
    }

    /// A handle that resolves on loss, to pass to the protected work.
    pub fn lost_signal(&self) -> LostSignal {
        self.shared.lost.clone()
    }

    /// Completes when the lease is lost, at its deadline at the latest.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        self.shared.lost.lost().await
    }

    /// A copy of the current lease (its deadline moves with each renewal). Never waits
    /// for a renewal in flight.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lease(&self) -> Option<Lease> {
        locked(&self.shared.lease).clone()
    }

    /// Stops renewing and releases the lock. Returns [`ReleaseOutcome::NotHeld`] if it was
    /// no longer ours.
    ///
    /// # Cancel safety
    /// If dropped, the lock is still released: in the background as by `Drop` before the
    /// release was sent, by the task that sends it after (so a caller that gives up on
    /// the reply never leaves the lock held until its TTL).
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.shared.stop.cancel();
        if let Some(watchdog) = self.watchdog.as_mut() {
            // Taken only once it has ended: dropped while waiting, `Drop` releases.
            let ended = watchdog.await;
            self.watchdog = None;
            if let Err(error) = ended {
                self.shared
                    .lost
                    .mark(format!("the renewal task ended abnormally: {error}"));
            }
        }
        let lease = locked(&self.shared.lease).take();
        let Some(lease) = lease else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.lock.release(lease).await })
            .await
            .map_err(|error| LockError::backend(format!("the release task failed: {error}")))?
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
            let lease = locked(&shared.lease).take();
            if let Some(lease) = lease {
                let _ = shared.lock.release(lease).await;
            }
        });
    }
}

/// How long the renewal task waits before renewing a lease of `ttl` with `remaining`
/// validity: a third of what is left (of at most the TTL), so two thirds stay for the
/// round trip. A lease that reaches the guard with less than two thirds of its TTL left
/// (a slow reply, a pause before the guard was built) is renewed at once.
fn renewal_delay(ttl: Duration, remaining: Duration, first: bool) -> Duration {
    if first && remaining < ttl.saturating_sub(renewal_interval(ttl)) {
        Duration::ZERO
    } else {
        renewal_interval(remaining.min(ttl))
    }
}

/// The shortest pause before retrying a renewal that failed for a reason that may pass.
const RENEWAL_RETRY_MIN: Duration = Duration::from_millis(10);

async fn watchdog<L: DistributedLock + ?Sized>(shared: Arc<Shared<L>>) {
    let (clock, lost) = (&shared.clock, &shared.lost);
    let mut first = true;
    // Whether the last renewal failed for a reason that may pass.
    let mut failing = false;
    loop {
        let Some(lease) = locked(&shared.lease).clone() else {
            return;
        };
        // The signal's deadline: the lease's, less any time spent suspended since.
        let (valid_until, ttl) = (lost.deadline(), lease.ttl());
        if lost.is_lost() {
            return;
        }
        let now = clock.now();
        let remaining = valid_until.saturating_duration_since(now);
        let delay = match failing {
            false => renewal_delay(ttl, remaining, first),
            true => renewal_interval(remaining).max(RENEWAL_RETRY_MIN),
        };
        first = false;
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock.sleep_until(now + delay) => {}
        }
        if lost.is_lost() || clock.now() >= valid_until {
            lost.mark("renewal came too late: the lease deadline had already passed");
            return;
        }
        // Extend a copy, so that `lease()` and `release()` never wait for the server.
        let mut renewed = lease;
        let suspended = clock.suspended();
        let outcome = tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock.sleep_until(valid_until) => {
                // Lost at its deadline: the signal names the last renewal error, if any.
                if !lost.is_lost() {
                    lost.mark("renewal did not complete before the lease deadline");
                }
                return;
            }
            result = shared.lock.extend(&mut renewed, ttl) => result,
        };
        // A slow node or a dropped connection need not mean the lease is gone: it stands
        // until its deadline, so retry until then (each extension counts from when it
        // was sent, and a late one never shortens the lease).
        // (Not `Timeout`: for an extension, "held by another".)
        failing = matches!(
            &outcome,
            Err(LockError::NoQuorum { .. } | LockError::Unavailable { .. })
        );
        lost.note_renewal_error(outcome.as_ref().err().filter(|_| failing));
        match outcome {
            Ok(()) => {}
            Err(_) if failing => continue,
            Err(error) => {
                lost.mark(format!("renewal failed: {error}"));
                return;
            }
        }
        let mut slot = locked(&shared.lease);
        if slot.is_none() || shared.stop.is_cancelled() {
            return;
        }
        lost.renewed(renewed.valid_until(), suspended);
        *slot = Some(renewed);
    }
}

/// What [`LockExt::with_lock`] returns when it cannot hand back the work's result alone.
#[derive(Debug)]
#[non_exhaustive]
pub enum WithLockError<T> {
    /// The lock was not acquired, or its lease was lost and the work was cancelled.
    Lock(LockError),
    /// The work ran to completion under the lock, but releasing it failed: the lock stays
    /// held until its TTL (or the backend's session end) frees it.
    Release {
        /// What the work returned.
        value: T,
        /// Why the release failed.
        error: LockError,
    },
}

impl<T> WithLockError<T> {
    /// The work's result, if it ran to completion.
    pub fn into_value(self) -> Option<T> {
        match self {
            Self::Lock(_) => None,
            Self::Release { value, .. } => Some(value),
        }
    }

    /// The lock error, dropping any result.
    pub fn into_lock_error(self) -> LockError {
        match self {
            Self::Lock(error) | Self::Release { error, .. } => error,
        }
    }
}

impl<T> From<LockError> for WithLockError<T> {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl<T> From<WithLockError<T>> for LockError {
    fn from(error: WithLockError<T>) -> Self {
        error.into_lock_error()
    }
}

impl<T> fmt::Display for WithLockError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lock(error) => error.fmt(f),
            Self::Release { error, .. } => {
                write!(
                    f,
                    "the work completed but releasing the lock failed: {error}"
                )
            }
        }
    }
}

impl<T: fmt::Debug> std::error::Error for WithLockError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Lock(error) | Self::Release { error, .. } => Some(error),
        }
    }
}

/// Conveniences on any shared lock: a renewing [`LockGuard`], and running a closure
/// under the lock.
pub trait LockExt {
    /// The lock type the guard holds.
    type Lock: DistributedLock + ?Sized + 'static;

    /// Acquires `key` (waiting up to `opts.wait`) and returns a renewing guard. A grant
    /// that arrives after its own deadline (a reply slower than the TTL) is released, never
    /// handed out, and the lock is asked for again within the wait; if the wait runs out on
    /// such a grant, the error is [`LockError::LeaseLost`].
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`].
    fn lock(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<LockGuard<Self::Lock>, LockError>> + Send;

    /// As [`lock`](Self::lock), in shared mode: a renewing guard over one reader's
    /// lease from [`DistributedLock::acquire_shared`].
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire_shared`].
    fn lock_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<LockGuard<Self::Lock>, LockError>> + Send;

    /// Acquires `key`, runs `work(token, lost)` under a renewing guard and releases.
    /// If the lease is lost first, `work` is cancelled (dropped) and the result is
    /// [`WithLockError::Lock`] with [`LockError::LeaseLost`]; if the work completed but
    /// the release failed, [`WithLockError::Release`] carries both. `?` converts it into
    /// a [`LockError`] where the result is not needed.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and releases the lock in the background.
    fn with_lock<F, Fut, T>(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        work: F,
    ) -> impl Future<Output = Result<T, WithLockError<T>>> + Send
    where
        F: FnOnce(FencingToken, LostSignal) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;
}

impl<L: DistributedLock + ?Sized + 'static> LockExt for Arc<L> {
    type Lock = L;

    async fn lock(&self, key: &LockKey, opts: &AcquireOptions) -> Result<LockGuard<L>, LockError> {
        guarded(self, key, opts, false).await
    }

    async fn lock_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<LockGuard<L>, LockError> {
        guarded(self, key, opts, true).await
    }

    async fn with_lock<F, Fut, T>(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        work: F,
    ) -> Result<T, WithLockError<T>>
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
            Some(value) => match guard.release().await {
                Ok(_) => Ok(value),
                Err(error) => Err(WithLockError::Release { value, error }),
            },
            None => {
                let reason = lost.reason().unwrap_or_default();
                drop(guard);
                Err(LockError::lost(reason).into())
            }
        }
    }
}

/// How much of a lease of `ttl` the guard lets pass before renewing it.
pub fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// What [`LockExt::lock`] and [`LockExt::lock_shared`] do: a guard over a grant that
/// arrived within its own deadline, asking again within the wait for one that did not.
///
/// # Cancel safety
/// As [`DistributedLock::acquire`].
async fn guarded<L: DistributedLock + ?Sized + 'static>(
    lock: &Arc<L>,
    key: &LockKey,
    opts: &AcquireOptions,
    shared: bool,
) -> Result<LockGuard<L>, LockError> {
    let deadline = opts.wait_deadline(Instant::now());
    let mut late = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // A suspend from here on counts against the grant, however late in the
        // wait its request was sent.
        let suspended = SystemClock.suspended();
        let lease = match late {
            0 => acquire(lock, key, opts, shared).await?,
            _ => acquire(lock, key, &opts.clone().wait(left), shared).await?,
        };
        let guard = LockGuard::since(lock.clone(), lease, Arc::new(SystemClock), suspended);
        if !guard.is_lost() {
            return Ok(guard);
        }
        let _ = guard.release().await;
        late += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LockError::lost(format!(
                "the grant of `{key}` arrived after its lease deadline ({late} such \
                     grant(s) within the wait)"
            )));
        }
        tokio::time::sleep(opts.backoff.delay(late).min(left)).await;
    }
}

/// `key`'s writer's or (`shared`) a reader's lease.
///
/// # Cancel safety
/// As [`DistributedLock::acquire`].
async fn acquire<L: DistributedLock + ?Sized>(
    lock: &L,
    key: &LockKey,
    opts: &AcquireOptions,
    shared: bool,
) -> Result<Lease, LockError> {
    match shared {
        false => lock.acquire(key, opts).await,
        true => lock.acquire_shared(key, opts).await,
    }
}
