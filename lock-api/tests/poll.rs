//! `poll_acquire`'s schedule, on a clock that records every pause and jumps to its end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tenure_api::{poll_acquire, AcquireOptions, Backoff, Clock, LockError};

/// A clock whose sleeps complete at once, moving time to their deadline; it keeps the
/// length of every pause.
#[derive(Debug, Clone)]
struct Recording {
    now: Arc<Mutex<Instant>>,
    pauses: Arc<Mutex<Vec<Duration>>>,
}

impl Recording {
    fn new() -> Self {
        Self {
            now: Arc::new(Mutex::new(Instant::now())),
            pauses: Arc::default(),
        }
    }

    fn pauses(&self) -> Vec<Duration> {
        self.pauses.lock().unwrap().clone()
    }
}

impl Clock for Recording {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let mut now = self.now.lock().unwrap();
        self.pauses
            .lock()
            .unwrap()
            .push(deadline.saturating_duration_since(*now));
        *now = (*now).max(deadline);
        Box::pin(async {})
    }
}

fn unavailable() -> LockError {
    LockError::Unavailable {
        message: "node down".into(),
        source: None,
    }
}

fn options() -> AcquireOptions {
    AcquireOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10))
}

#[tokio::test]
async fn a_held_lock_is_polled_at_the_first_delay_however_long_the_wait() {
    let clock = Recording::new();
    let err = poll_acquire(&clock, &options(), || async { Ok(None) })
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let pauses = clock.pauses();
    let initial = Backoff::default().initial;
    // A waiter that polled slower and slower (up to 200 ms) lost the lock to every
    // newcomer; it polls as often at the end of its wait as at the start.
    let slowest = pauses[..pauses.len() - 1].iter().max().unwrap();
    assert!(
        *slowest <= initial,
        "a refusal grew the pause to {slowest:?}"
    );
    assert!(
        pauses.len() > 1_000,
        "10 s of polls at ≤ 5 ms: {} polls",
        pauses.len()
    );
}

#[tokio::test]
async fn errors_back_off_exponentially_and_a_refusal_resets_the_growth() {
    let clock = Recording::new();
    let calls = Mutex::new(0u32);
    // Ten errors, one refusal, two errors, then errors forever.
    let err = poll_acquire(&clock, &options(), || {
        let n = {
            let mut calls = calls.lock().unwrap();
            *calls += 1;
            *calls
        };
        async move {
            match n {
                11 => Ok(None),
                _ => Err(unavailable()),
            }
        }
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "the last error, not Timeout: {err}"
    );
    let pauses = clock.pauses();
    let backoff = Backoff::default();
    assert!(
        pauses[9] > backoff.initial * 8,
        "grown after ten errors: {pauses:?}"
    );
    assert!(pauses[9] <= backoff.max);
    assert!(
        pauses[10] <= backoff.initial,
        "after the refusal: {:?}",
        pauses[10]
    );
    assert!(
        pauses[11] <= backoff.initial,
        "the growth restarts: {:?}",
        pauses[11]
    );
}
