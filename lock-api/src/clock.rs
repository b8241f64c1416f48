//! An injectable time source, so tests can pause or advance client time.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;

/// A monotonic time source. Leases, deadlines and the watchdog read time only through it.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Completes once [`now`](Self::now) has reached `deadline`.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future has no effect.
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()>;
}

/// The real monotonic clock (`Instant::now`, tokio timers).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
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
        Box::pin(async move {
            // `wait_for` checks the current value first, so an advance that happened
            // before this future was polled is not missed.
            let _ = ticks.wait_for(|offset| base + *offset >= deadline).await;
        })
    }
}
