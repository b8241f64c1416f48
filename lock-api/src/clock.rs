//! An injectable time source, so tests can pause, advance or suspend client time.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;

/// A monotonic time source. Leases, deadlines and the watchdog read time only through it.
///
/// `Instant` (CLOCK_MONOTONIC on Linux) stands still while the machine is suspended (a
/// laptop's sleep, a VM suspended through its guest), while the servers' clocks, and so
/// every lease on them, run on. (A VM paused by its hypervisor without the guest knowing
/// moves neither clock: no clock can tell it.) A clock also tells how long the machine has been suspended
/// ([`suspended`](Self::suspended)), and a [`LostSignal`](crate::LostSignal) counts that
/// time against its lease's deadline.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Completes once [`now`](Self::now) has reached `deadline`.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future has no effect.
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()>;

    /// How long the machine has been suspended in all, as far as this clock can tell;
    /// never decreases. Zero for a clock that cannot tell.
    fn suspended(&self) -> Duration {
        Duration::ZERO
    }
}

/// The real monotonic clock (`Instant::now`, tokio timers). On Linux it tells time spent
/// suspended: CLOCK_BOOTTIME, which runs on during suspend, minus CLOCK_MONOTONIC, which
/// does not.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }

    fn suspended(&self) -> Duration {
        system_suspended()
    }
}

/// Below this, a rise of BOOTTIME − MONOTONIC is the jitter of reading two clocks, not a
/// suspend.
const SUSPEND_NOISE: Duration = Duration::from_millis(1);

/// The largest suspended total seen so far, in nanoseconds: it never decreases.
static SUSPENDED_NS: AtomicU64 = AtomicU64::new(0);

/// The largest BOOTTIME − MONOTONIC seen, relative to the first reading.
fn system_suspended() -> Duration {
    static BASE_NS: AtomicU64 = AtomicU64::new(u64::MAX);
    let Some(gap) = boottime_gap_ns() else {
        return Duration::ZERO;
    };
    let base = match BASE_NS.compare_exchange(u64::MAX, gap, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => gap,
        Err(base) => base,
    };
    let total = gap.saturating_sub(base);
    let seen = SUSPENDED_NS.load(Ordering::Acquire);
    if total >= seen + SUSPEND_NOISE.as_nanos() as u64 {
        SUSPENDED_NS.fetch_max(total, Ordering::AcqRel);
    }
    Duration::from_nanos(SUSPENDED_NS.load(Ordering::Acquire))
}

/// CLOCK_BOOTTIME − CLOCK_MONOTONIC, in nanoseconds.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime_gap_ns() -> Option<u64> {
    use nix::time::{clock_gettime, ClockId};
    let nanos = |id| {
        clock_gettime(id)
            .ok()
            .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
    };
    // Monotonic first: the gap read is then never smaller than the true one, so a
    // suspend is never undercounted.
    let monotonic = nanos(ClockId::CLOCK_MONOTONIC)?;
    let boottime = nanos(ClockId::CLOCK_BOOTTIME)?;
    u64::try_from(boottime - monotonic).ok()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime_gap_ns() -> Option<u64> {
    None
}

/// A clock that moves only when told to: [`advance`](Self::advance) wakes every sleeper
/// whose deadline has passed.
///
/// ```
/// use std::time::Duration;
/// use tenure_api::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now() - t0, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    base: Instant,
    offset: Mutex<Duration>,
    suspended: Mutex<Duration>,
    ticks: watch::Sender<Duration>,
}

impl ManualClock {
    /// A clock frozen at the current real instant.
    pub fn new() -> Self {
        let (ticks, _) = watch::channel(Duration::ZERO);
        Self {
            inner: Arc::new(ManualInner {
                base: Instant::now(),
                offset: Mutex::new(Duration::ZERO),
                suspended: Mutex::new(Duration::ZERO),
                ticks,
            }),
        }
    }

    /// Moves time forward by `by` and wakes the sleepers that are due.
    pub fn advance(&self, by: Duration) {
        let mut offset = self
            .inner
            .offset
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *offset += by;
        self.inner.ticks.send_replace(*offset);
    }

    /// A suspend of the machine for `by`: [`now`](Clock::now) stands still (as
    /// `Instant` does), [`suspended`](Clock::suspended) grows by `by`, and sleepers wake
    /// to look at the time again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tenure_api::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// let t0 = clock.now();
    /// clock.suspend(Duration::from_secs(60));
    /// assert_eq!(clock.now(), t0);
    /// assert_eq!(clock.suspended(), Duration::from_secs(60));
    /// ```
    pub fn suspend(&self, by: Duration) {
        *self
            .inner
            .suspended
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += by;
        self.inner.ticks.send_modify(|_| {});
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        let offset = *self
            .inner
            .offset
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.inner.base + offset
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let base = self.inner.base;
        let mut ticks = self.inner.ticks.subscribe();
        let suspended = self.suspended();
        let clock = self.clone();
        Box::pin(async move {
            // `wait_for` checks the current value first, so an advance that happened
            // before this future was polled is not missed. A suspend wakes it too.
            let _ = ticks
                .wait_for(|offset| base + *offset >= deadline || clock.suspended() > suspended)
                .await;
        })
    }

    fn suspended(&self) -> Duration {
        *self
            .inner
            .suspended
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
