//! Observability layers: [`Traced`] (a `tracing` span per operation) and [`Metered`]
//! (Prometheus-style metrics through the [`metrics`] facade). Both are [`Observed`]
//! wrappers: one pass-through implementation of [`DistributedLock`] that reports every
//! call to an [`Observer`], so further observers need no copy of it. They compose with
//! each other and with [`crate::layers::DriftMargin`]:
//!
//! ```
//! # async fn demo() -> Result<(), tenure::LockError> {
//! use std::sync::Arc;
//! use tenure::observe::{Metered, Traced};
//! use tenure::{DistributedLock, MemoryLock};
//! let lock: Arc<dyn DistributedLock> =
//!     Arc::new(Metered::new(Arc::new(Traced::new(Arc::new(MemoryLock::new())))));
//! # Ok(()) }
//! ```
//!
//! Every operation ends in one [`Outcome`], named the same in spans and metric labels.
//!
//! ## Metrics
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tenure_acquire_wait_seconds` | histogram | backend, key_prefix | duration of every `acquire`, `acquire_any` and `try_acquire`, whatever the outcome |
//! | `tenure_acquire_total` | counter | backend, key_prefix, outcome | `acquire`, `acquire_any` and `try_acquire` calls |
//! | `tenure_extend_total` | counter | backend, key_prefix, outcome | `extend` calls |
//! | `tenure_lease_lost_total` | counter | backend, key_prefix | leases found lost (below) |
//! | `tenure_held` | gauge | backend, key_prefix | leases granted and not yet released, lost or abandoned |
//!
//! **`tenure_held`** goes up when a lease is granted (or successfully extended while not
//! counted) and down exactly once per lease: at its release (whatever the answer: the
//! caller has given it up), when it is found lost, or when it is presumed abandoned —
//! neither extended nor released until [`ABANDONED_AFTER`] past its local deadline
//! (checked, at most once a second, when another lease is granted; the bookkeeping then
//! forgets it, so it stays bounded).
//!
//! **Lost** is counted for a lease counted in `tenure_held`, when the wrapper first sees
//! it gone: `extend` failing with [`LockError::LeaseLost`], or `release` answering
//! [`ReleaseOutcome::NotHeld`]. So a lease counts as lost at most once, and never after it
//! was released (a second release or an extend after release is a caller's mistake, not
//! a loss); `tenure_extend_total{outcome="lost"}` still counts every such call. The
//! bookkeeping is per process (owner ids are unique), so a lease may be released through
//! another `Metered` than the one that granted it.
//!
//! **`key_prefix` label** (bounded cardinality): the part of the key before the first
//! `/`, cut to [`KEY_PREFIX_MAX_LEN`] bytes; `none` for keys without a `/` (or starting
//! with one). The first [`KEY_PREFIX_MAX_VALUES`] distinct values a process sees keep
//! their name; any later one is reported as `other`.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Debug};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tenure_api::async_trait;
use tenure_api::{
    AcquireOptions, Capabilities, DistributedLock, FencingToken, HolderInfo, Lease, LockError,
    LockKey, OwnerId, ReleaseOutcome,
};
use tracing::Instrument;

use crate::layers::LockLayer;

/// A boxed, sendable future (what `async_trait` methods return).
pub type BoxedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The operation being observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`DistributedLock::try_acquire`].
    TryAcquire,
    /// [`DistributedLock::acquire`].
    Acquire,
    /// [`DistributedLock::acquire_shared`] (a read-write lock's reader).
    AcquireShared,
    /// [`DistributedLock::acquire_any`] (a semaphore's permits); its `key` is the first
    /// key asked for, the lease says which was granted.
    AcquireAny,
    /// [`DistributedLock::extend`].
    Extend,
    /// [`DistributedLock::release`].
    Release,
    /// [`DistributedLock::inspect`].
    Inspect,
    /// [`DistributedLock::inspect_each`] (a semaphore's check of its permits' count); its
    /// `key` is the first key read, its outcome `held` when any of them is.
    InspectEach,
}

impl Op {
    /// `try_acquire`, `acquire`, `acquire_shared`, `acquire_any`, `extend`, `release`,
    /// `inspect` or `inspect_each`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TryAcquire => "try_acquire",
            Self::Acquire => "acquire",
            Self::AcquireShared => "acquire_shared",
            Self::AcquireAny => "acquire_any",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::Inspect => "inspect",
            Self::InspectEach => "inspect_each",
        }
    }
}

/// How one operation ended; [`as_str`](Self::as_str) is the `outcome` label and span field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Granted (acquire, try_acquire).
    Acquired,
    /// Held by another owner (try_acquire).
    Busy,
    /// [`LockError::Timeout`]: waited, still held by another owner.
    Timeout,
    /// Extended.
    Extended,
    /// [`LockError::LeaseLost`].
    Lost,
    /// Released.
    Released,
    /// Release found the lock no longer ours.
    NotHeld,
    /// Inspect found a holder.
    Held,
    /// Inspect found the key free.
    Free,
    /// [`LockError::NoQuorum`].
    NoQuorum,
    /// [`LockError::Unavailable`].
    Unavailable,
    /// [`LockError::InvalidInput`] or [`LockError::Config`].
    Invalid,
    /// Any other error.
    Error,
}

impl Outcome {
    /// `acquired`, `busy`, `timeout`, `extended`, `lost`, `released`, `not_held`,
    /// `held`, `free`, `no_quorum`, `unavailable`, `invalid` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Busy => "busy",
            Self::Timeout => "timeout",
            Self::Extended => "extended",
            Self::Lost => "lost",
            Self::Released => "released",
            Self::NotHeld => "not_held",
            Self::Held => "held",
            Self::Free => "free",
            Self::NoQuorum => "no_quorum",
            Self::Unavailable => "unavailable",
            Self::Invalid => "invalid",
            Self::Error => "error",
        }
    }

    /// The outcome an error stands for.
    pub fn of_error(error: &LockError) -> Self {
        match error {
            LockError::Timeout { .. } => Self::Timeout,
            LockError::LeaseLost { .. } => Self::Lost,
            LockError::NoQuorum { .. } => Self::NoQuorum,
            LockError::Unavailable { .. } => Self::Unavailable,
            LockError::InvalidInput(_) | LockError::Config(_) => Self::Invalid,
            _ => Self::Error,
        }
    }
}

/// One operation as an [`Observer`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// Which operation.
    pub op: Op,
    /// On which key.
    pub key: &'a LockKey,
    /// The wrapped backend's name ([`Capabilities::backend`]).
    pub backend: &'static str,
}

/// The grant an operation concerned: the new lease (acquire), the lease passed in
/// (extend, release), or the holder found (inspect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Its owner id.
    pub owner: OwnerId,
    /// Its fencing token, if known.
    pub fence: Option<FencingToken>,
    /// Its local deadline after the call, for leases.
    pub valid_until: Option<Instant>,
}

impl Grant {
    fn of(lease: &Lease) -> Self {
        Self {
            owner: lease.owner(),
            fence: Some(lease.token()),
            valid_until: Some(lease.valid_until()),
        }
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug)]
pub struct Done<'a> {
    /// The outcome.
    pub outcome: Outcome,
    /// The grant concerned, if any.
    pub grant: Option<Grant>,
    /// How long the call took.
    pub elapsed: Duration,
    /// The error, if it failed (backends keep secrets out of error texts).
    pub error: Option<&'a LockError>,
}

/// Watches the operations of an [`Observed`] lock.
pub trait Observer: Send + Sync + Debug + 'static {
    /// The name the wrapper shows in `Debug` (`Traced`, `Metered`).
    const NAME: &'static str;
    /// What one operation carries from [`begin`](Self::begin) to [`end`](Self::end).
    type Scope: Send;
    /// Called before the inner call starts.
    fn begin(&self, call: &Call<'_>) -> Self::Scope;
    /// Wraps the inner call (e.g. to enter a span while it runs); by default unchanged.
    fn instrument<'a, T: 'a>(
        &self,
        _scope: &Self::Scope,
        call: BoxedFuture<'a, T>,
    ) -> BoxedFuture<'a, T> {
        call
    }
    /// Called once the inner call completed (not if the future was dropped).
    fn end(&self, scope: Self::Scope, call: &Call<'_>, done: &Done<'_>);
}

/// A [`DistributedLock`] that passes every call to `inner` unchanged and reports it to an
/// [`Observer`]. Capabilities are the inner lock's.
pub struct Observed<O: Observer> {
    inner: Arc<dyn DistributedLock>,
    observer: O,
    backend: &'static str,
}

/// A `tracing` span per operation (see [`Tracing`]).
pub type Traced = Observed<Tracing>;
/// Metrics per operation (see the [module docs](self)).
pub type Metered = Observed<Metrics>;

impl<O: Observer> Observed<O> {
    /// Wraps `inner`, reporting to `observer`.
    pub fn with_observer(inner: Arc<dyn DistributedLock>, observer: O) -> Self {
        Self {
            backend: inner.capabilities().backend,
            inner,
            observer,
        }
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    fn begin<'a>(&'a self, op: Op, key: &'a LockKey) -> Watch<'a, O> {
        let call = Call {
            op,
            key,
            backend: self.backend,
        };
        Watch {
            observer: &self.observer,
            scope: self.observer.begin(&call),
            call,
            started: Instant::now(),
        }
    }
}

impl Observed<Tracing> {
    /// Wraps `inner` in a span per operation.
    pub fn new(inner: Arc<dyn DistributedLock>) -> Self {
        Self::with_observer(inner, Tracing)
    }
}

impl Observed<Metrics> {
    /// Wraps `inner` in metrics (and describes them to the installed recorder).
    pub fn new(inner: Arc<dyn DistributedLock>) -> Self {
        describe_metrics();
        Self::with_observer(inner, Metrics)
    }
}

/// [`Traced`] as a layer ([`LockStack`](crate::layers::LockStack)).
#[derive(Debug, Clone, Copy, Default)]
pub struct TracedLayer;

impl LockLayer for TracedLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Traced::new(inner))
    }
}

/// [`Metered`] as a layer ([`LockStack`](crate::layers::LockStack)).
#[derive(Debug, Clone, Copy, Default)]
pub struct MeteredLayer;

impl LockLayer for MeteredLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Metered::new(inner))
    }
}

impl<O: Observer> Debug for Observed<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(O::NAME)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// One operation in flight.
struct Watch<'a, O: Observer> {
    observer: &'a O,
    scope: O::Scope,
    call: Call<'a>,
    started: Instant,
}

impl<O: Observer> Watch<'_, O> {
    /// The inner call, instrumented; it does not borrow `self`, so `self` need not be
    /// `Sync` to be held across its await.
    fn run<'f, T: 'f>(&self, call: BoxedFuture<'f, T>) -> BoxedFuture<'f, T> {
        self.observer.instrument(&self.scope, call)
    }

    /// Reports the end: `ok` names the outcome of a success.
    fn end<T>(
        self,
        result: &Result<T, LockError>,
        grant: Option<Grant>,
        ok: impl FnOnce(&T) -> Outcome,
    ) {
        let done = Done {
            outcome: match result {
                Ok(value) => ok(value),
                Err(e) => Outcome::of_error(e),
            },
            grant,
            elapsed: self.started.elapsed(),
            error: result.as_ref().err(),
        };
        self.observer.end(self.scope, &self.call, &done);
    }
}

#[async_trait]
impl<O: Observer> DistributedLock for Observed<O> {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let watch = self.begin(Op::TryAcquire, key);
        let result = watch.run(self.inner.try_acquire(key, ttl)).await;
        let grant = result.as_ref().ok().and_then(Option::as_ref).map(Grant::of);
        watch.end(&result, grant, |lease| match lease {
            Some(_) => Outcome::Acquired,
            None => Outcome::Busy,
        });
        result
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let watch = self.begin(Op::Acquire, key);
        let result = watch.run(self.inner.acquire(key, opts)).await;
        let grant = result.as_ref().ok().map(Grant::of);
        watch.end(&result, grant, |_| Outcome::Acquired);
        result
    }

    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let watch = self.begin(Op::AcquireShared, key);
        let result = watch.run(self.inner.acquire_shared(key, opts)).await;
        let grant = result.as_ref().ok().map(Grant::of);
        watch.end(&result, grant, |_| Outcome::Acquired);
        result
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let key = lease.key().clone();
        let watch = self.begin(Op::Extend, &key);
        let result = watch.run(self.inner.extend(lease, ttl)).await;
        watch.end(&result, Some(Grant::of(lease)), |_| Outcome::Extended);
        result
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let (key, grant) = (lease.key().clone(), Grant::of(&lease));
        let watch = self.begin(Op::Release, &key);
        let result = watch.run(self.inner.release(lease)).await;
        watch.end(&result, Some(grant), |outcome| match outcome {
            ReleaseOutcome::Released => Outcome::Released,
            ReleaseOutcome::NotHeld => Outcome::NotHeld,
        });
        result
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let watch = self.begin(Op::Inspect, key);
        let result = watch.run(self.inner.inspect(key)).await;
        let grant = result
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .map(|h| Grant {
                owner: h.owner,
                fence: h.token,
                valid_until: None,
            });
        watch.end(&result, grant, |holder| match holder {
            Some(_) => Outcome::Held,
            None => Outcome::Free,
        });
        result
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let Some(first) = keys.first() else {
            return self.inner.acquire_any(keys, opts).await; // refused: nothing to observe
        };
        let watch = self.begin(Op::AcquireAny, first);
        let result = watch.run(self.inner.acquire_any(keys, opts)).await;
        let grant = result.as_ref().ok().map(Grant::of);
        watch.end(&result, grant, |_| Outcome::Acquired);
        result
    }

    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        let Some(first) = keys.first() else {
            return self.inner.inspect_each(keys).await; // nothing to observe
        };
        let watch = self.begin(Op::InspectEach, first);
        let result = watch.run(self.inner.inspect_each(keys)).await;
        watch.end(&result, None, |holders| {
            match holders.iter().any(Option::is_some) {
                true => Outcome::Held,
                false => Outcome::Free,
            }
        });
        result
    }

    fn holder_changes(&self, key: &LockKey) -> Option<tenure_api::HolderFeed> {
        self.inner.holder_changes(key)
    }
}

/// The [`Traced`] observer: an INFO span `tenure` per operation with the fields `op`,
/// `key`, `backend`, `outcome` and `fence` (the fencing token of the grant concerned),
/// entered while the backend works, so the backend's own events nest in it. Failures
/// also emit an event inside the span: WARN for a lost lease and for errors, DEBUG for
/// a timeout. No URL or secret is recorded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tracing;

impl Observer for Tracing {
    const NAME: &'static str = "Traced";
    type Scope = tracing::Span;

    fn begin(&self, call: &Call<'_>) -> tracing::Span {
        tracing::info_span!(
            "tenure",
            op = call.op.as_str(),
            key = %call.key,
            backend = call.backend,
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
        )
    }

    fn instrument<'a, T: 'a>(
        &self,
        span: &tracing::Span,
        call: BoxedFuture<'a, T>,
    ) -> BoxedFuture<'a, T> {
        Box::pin(call.instrument(span.clone()))
    }

    fn end(&self, span: tracing::Span, _call: &Call<'_>, done: &Done<'_>) {
        span.record("outcome", done.outcome.as_str());
        if let Some(fence) = done.grant.and_then(|g| g.fence) {
            span.record("fence", fence.get());
        }
        let Some(error) = done.error else { return };
        let _entered = span.enter();
        match done.outcome {
            Outcome::Timeout => tracing::debug!(error = %error, "lock still held by another owner"),
            Outcome::Lost => tracing::warn!(error = %error, "lease lost"),
            _ => tracing::warn!(error = %error, "lock operation failed"),
        }
    }
}

/// Metric names.
pub mod names {
    /// Histogram: seconds spent in `acquire`/`acquire_any`/`try_acquire`.
    pub const ACQUIRE_WAIT_SECONDS: &str = "tenure_acquire_wait_seconds";
    /// Counter: `acquire`/`acquire_any`/`try_acquire` calls by outcome.
    pub const ACQUIRE_TOTAL: &str = "tenure_acquire_total";
    /// Counter: `extend` calls by outcome.
    pub const EXTEND_TOTAL: &str = "tenure_extend_total";
    /// Counter: leases found lost.
    pub const LEASE_LOST_TOTAL: &str = "tenure_lease_lost_total";
    /// Gauge: leases held.
    pub const HELD: &str = "tenure_held";
}

/// Longest `key_prefix` label value, in bytes.
pub const KEY_PREFIX_MAX_LEN: usize = 32;
/// Distinct `key_prefix` values per process before new ones become `other`.
pub const KEY_PREFIX_MAX_VALUES: usize = 64;
/// How long past its local deadline an untouched lease counts as held.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// Registers the units and help texts of tenure's metrics with the current recorder.
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_histogram!(
        names::ACQUIRE_WAIT_SECONDS,
        Unit::Seconds,
        "Time spent in acquire and try_acquire, whatever the outcome"
    );
    metrics::describe_counter!(
        names::ACQUIRE_TOTAL,
        "acquire and try_acquire calls by outcome"
    );
    metrics::describe_counter!(names::EXTEND_TOTAL, "extend calls by outcome");
    metrics::describe_counter!(
        names::LEASE_LOST_TOTAL,
        "Leases found lost (extend failed with LeaseLost, or release found them gone)"
    );
    metrics::describe_gauge!(
        names::HELD,
        "Leases granted and not yet released, lost or abandoned"
    );
}

/// The `key_prefix` label of `key` (see the [module docs](self)).
pub fn key_prefix(key: &LockKey) -> String {
    static SEEN: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);
    let head = match key.as_str().split_once('/') {
        Some((head, _)) if !head.is_empty() => head,
        _ => return "none".into(),
    };
    let mut end = head.len().min(KEY_PREFIX_MAX_LEN);
    while !head.is_char_boundary(end) {
        end -= 1;
    }
    let head = &head[..end];
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if seen.contains(head) || seen.len() < KEY_PREFIX_MAX_VALUES {
        seen.insert(head.to_string());
        head.to_string()
    } else {
        "other".into()
    }
}

/// The [`Metered`] observer (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics;

/// The labels of one key on one backend.
type Labels = [(&'static str, String); 2];

/// Leases this process counts in `tenure_held`, by owner id.
#[derive(Default)]
struct Tracked {
    leases: HashMap<OwnerId, TrackedLease>,
    last_sweep: Option<Instant>,
}

struct TrackedLease {
    labels: Labels,
    valid_until: Instant,
    /// Out of `tenure_held` (found lost); kept until swept, so it is not counted twice.
    lost: bool,
}

static TRACKED: LazyLock<Mutex<Tracked>> = LazyLock::new(Mutex::default);

impl Tracked {
    fn lock() -> std::sync::MutexGuard<'static, Self> {
        TRACKED.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `grant` as held (again).
    fn hold(&mut self, grant: &Grant, labels: &Labels) {
        let valid_until = grant.valid_until.unwrap_or_else(Instant::now);
        let previous = self.leases.insert(
            grant.owner,
            TrackedLease {
                labels: labels.clone(),
                valid_until,
                lost: false,
            },
        );
        if previous.is_none_or(|p| p.lost) {
            metrics::gauge!(names::HELD, labels).increment(1.0);
        }
    }

    /// The lease ended — `lost`, or given up (`forget`: released). A lease counted in
    /// `tenure_held` leaves it, and counts as lost if it was, exactly once.
    fn end(&mut self, owner: OwnerId, lost: bool, forget: bool) {
        if let Some(tracked) = self.leases.get_mut(&owner).filter(|t| !t.lost) {
            metrics::gauge!(names::HELD, &tracked.labels).decrement(1.0);
            if lost {
                metrics::counter!(names::LEASE_LOST_TOTAL, &tracked.labels).increment(1);
            }
            tracked.lost = true;
        }
        if forget {
            self.leases.remove(&owner);
        }
    }

    /// At most once a second: forgets leases untouched for [`ABANDONED_AFTER`] past their
    /// deadline, taking those still counted out of `tenure_held`.
    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.last_sweep = Some(now);
        self.leases.retain(|_, tracked| {
            let keep = tracked.valid_until + ABANDONED_AFTER > now;
            if !keep && !tracked.lost {
                metrics::gauge!(names::HELD, &tracked.labels).decrement(1.0);
            }
            keep
        });
    }
}

/// Metrics take no scope: all is decided at the end.
impl Observer for Metrics {
    const NAME: &'static str = "Metered";
    type Scope = ();

    fn begin(&self, _call: &Call<'_>) {}

    fn end(&self, _scope: (), call: &Call<'_>, done: &Done<'_>) {
        let labels: Labels = [
            ("backend", call.backend.to_string()),
            ("key_prefix", key_prefix(call.key)),
        ];
        let with_outcome = |name: &'static str| {
            let [backend, prefix] = labels.clone();
            metrics::counter!(
                name,
                &[
                    backend,
                    prefix,
                    ("outcome", done.outcome.as_str().to_string())
                ]
            )
            .increment(1);
        };
        match (call.op, done.outcome, done.grant) {
            (Op::Acquire | Op::AcquireShared | Op::AcquireAny | Op::TryAcquire, outcome, grant) => {
                metrics::histogram!(names::ACQUIRE_WAIT_SECONDS, &labels)
                    .record(done.elapsed.as_secs_f64());
                with_outcome(names::ACQUIRE_TOTAL);
                if let (Outcome::Acquired, Some(grant)) = (outcome, grant) {
                    let mut tracked = Tracked::lock();
                    tracked.sweep(Instant::now());
                    tracked.hold(&grant, &labels);
                }
            }
            (Op::Extend, outcome, grant) => {
                with_outcome(names::EXTEND_TOTAL);
                match (outcome, grant) {
                    (Outcome::Extended, Some(grant)) => Tracked::lock().hold(&grant, &labels),
                    (Outcome::Lost, Some(grant)) => Tracked::lock().end(grant.owner, true, false),
                    _ => {}
                }
            }
            // Whatever the answer, the caller has given the lease up.
            (Op::Release, outcome, Some(grant)) => {
                Tracked::lock().end(grant.owner, outcome == Outcome::NotHeld, true);
            }
            (Op::Release, _, None) | (Op::Inspect | Op::InspectEach, ..) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_prefix_is_bounded() {
        let key = |k: &str| LockKey::new(k).unwrap();
        assert_eq!(key_prefix(&key("billing/invoice-7")), "billing");
        assert_eq!(key_prefix(&key("nightly")), "none");
        assert_eq!(key_prefix(&key("/abs")), "none");
        let long = format!("{}/x", "é".repeat(40));
        let cut = key_prefix(&key(&long));
        assert!(
            cut.len() <= KEY_PREFIX_MAX_LEN && cut.starts_with('é'),
            "{cut}"
        );
        for i in 0..KEY_PREFIX_MAX_VALUES {
            key_prefix(&key(&format!("p{i}/x")));
        }
        assert_eq!(key_prefix(&key("brand-new/x")), "other");
        assert_eq!(key_prefix(&key("billing/again")), "billing", "seen before");
    }

    #[test]
    fn errors_map_to_outcomes() {
        assert_eq!(
            Outcome::of_error(&LockError::Timeout {
                waited: Duration::ZERO
            }),
            Outcome::Timeout
        );
        assert_eq!(Outcome::of_error(&LockError::lost("x")), Outcome::Lost);
        assert_eq!(
            Outcome::of_error(&LockError::InvalidInput("x".into())),
            Outcome::Invalid
        );
        assert_eq!(Outcome::of_error(&LockError::backend("x")), Outcome::Error);
        assert_eq!(Outcome::NotHeld.as_str(), "not_held");
    }
}
