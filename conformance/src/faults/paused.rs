//! A holder that stops past its TTL: its process pauses (a GC pause, SIGSTOP), or its
//! machine is suspended (its monotonic clock stands still while the servers' run on).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tenure_api::{
    AcquireOptions, Clock, DistributedLock, Election, LockError, LockExt, LockGuard, LockKey,
    Semaphore,
};
use tokio::sync::oneshot;

use super::cell::Trial;
use super::trial::{
    contend_with, patience, setup_failed, Ending, Holder, Record, CONTENDER, HOLDER,
};
use super::Target;

/// How the holder stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Its process pauses between its check and its write: its clock runs on, and it
    /// writes at once on waking.
    Pause,
    /// Its machine is suspended: on waking, its monotonic clock is behind by the
    /// suspend, and it checks its guard before it writes, as every careful holder does.
    /// `tells`: whether its clock tells suspends (CLOCK_BOOTTIME − CLOCK_MONOTONIC, as
    /// [`tenure_api::SystemClock`] does on Linux) or counts on the stopping clock alone.
    Suspend {
        /// Whether the holder's clock tells how long it was suspended.
        tells: bool,
    },
}

/// A holder's clock across a simulated suspend of its machine: [`now`](Clock::now) falls
/// behind the real clock by the time suspended, as CLOCK_MONOTONIC does; if it `tells`,
/// [`suspended`](Clock::suspended) grows by that time, as CLOCK_BOOTTIME − CLOCK_MONOTONIC
/// does.
#[derive(Debug)]
struct SuspendedClock {
    lag: Mutex<Duration>,
    tells: bool,
}

impl SuspendedClock {
    fn new(tells: bool) -> Self {
        Self {
            lag: Mutex::new(Duration::ZERO),
            tells,
        }
    }

    fn lag(&self) -> Duration {
        *self.lag.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The machine was suspended for `by`.
    fn suspend(&self, by: Duration) {
        *self.lag.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Clock for SuspendedClock {
    fn now(&self) -> Instant {
        Instant::now() - self.lag()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        // A sleep begun before a suspend ends early on this clock: its sleepers look at
        // the time again, as they do after a real one.
        Box::pin(tokio::time::sleep_until((deadline + self.lag()).into()))
    }

    fn suspended(&self) -> Duration {
        match self.tells {
            true => self.lag(),
            false => Duration::ZERO,
        }
    }
}

/// What the frozen holder reports once it runs again.
struct Woken {
    /// When its runtime stopped and resumed, observed by the frozen thread itself.
    frozen: (Instant, Instant),
    /// Its lease's local deadline when it froze.
    deadline: Instant,
    /// Whether its write on waking was accepted; `None` if it did not write (it knew
    /// its lease was lost).
    write_accepted: Option<bool>,
    /// The key its lease was on (a semaphore's: the permit's).
    key: LockKey,
}

/// A holder paused past its TTL: a real `LockGuard` whose client runs on a runtime of
/// its own thread, which the trial freezes (as a GC pause or SIGSTOP freezes a process:
/// no renewals, no reads of its connections) between the holder's check and its write.
/// The contender asks meanwhile; once it has its answer the holder wakes, writes with
/// its token at once, and its watchdog then acts on what it finds. Fired: the frozen
/// thread saw its stop outlast the lease's deadline and span the contender's answer.
///
/// With a [`Primitive`] other than the lock, the holder holds a semaphore's permit (the
/// semaphore's other permit held by an unrecorded client throughout, so the contender
/// waits for the holder's), an election's leadership (the contender campaigns) or a
/// reader's lease (the contender is a writer).
///
/// Stopped by a [`Stop::Suspend`], the holder holds the lock on a guard timed by a
/// [`SuspendedClock`]; on waking it writes only if its guard says it still holds.
pub(super) async fn paused_holder(
    target: &Target,
    record: Record,
    primitive: Primitive,
    stop: Stop,
) -> Trial {
    let contender = match target.client().await {
        Ok(c) => primitive.wrap(record.client(CONTENDER, c)),
        Err(e) => return setup_failed("contender", e),
    };
    // The semaphore's other permit, held past the trial's end.
    let filler = match primitive {
        Primitive::Permit => {
            let opts = AcquireOptions::new(patience(target) * 4).wait(Duration::from_secs(10));
            let taken = async {
                let lock = primitive.wrap(target.client().await?);
                let lease = lock.acquire(&record.key, &opts).await?;
                Ok::<_, LockError>((lock, lease))
            };
            match taken.await {
                Ok(filler) => Some(filler),
                Err(e) => return setup_failed("the other permit's holder", e),
            }
        }
        _ => None,
    };
    let (ready_tx, ready) = oneshot::channel::<Result<(), LockError>>();
    let (freeze_tx, freeze) = oneshot::channel::<()>();
    let (wake_tx, wake) = std::sync::mpsc::channel::<()>();
    let (woken_tx, woken) = oneshot::channel::<Woken>();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return setup_failed("holder runtime", LockError::backend(e.to_string())),
    };
    let (thread_target, history, counter, key) = (
        target.clone(),
        record.history.clone(),
        Arc::clone(&record.counter),
        record.key.clone(),
    );
    let patience = patience(target);
    let clock = Arc::new(SuspendedClock::new(match stop {
        Stop::Suspend { tells } => tells,
        Stop::Pause => true,
    }));
    let thread = std::thread::spawn(move || {
        runtime.block_on(async move {
            let taken = async {
                let lock = history.recorded(HOLDER, thread_target.client().await?);
                let wait = Duration::from_secs(10);
                match primitive {
                    Primitive::Leadership => Ok(Election::new(lock)?
                        .with_ttl(thread_target.ttl)?
                        .campaign(&key, "holder", wait)
                        .await?
                        .into_guard()),
                    // Paused only: no trial suspends a reader's machine.
                    Primitive::Reader => {
                        let opts = AcquireOptions::new(thread_target.ttl).wait(wait);
                        let lock: Arc<dyn DistributedLock> = lock;
                        let guard = lock.lock_shared(&key, &opts).await?;
                        match guard.is_shared() {
                            true => Ok(guard),
                            false => Err(LockError::backend("the reader's lease is not shared")),
                        }
                    }
                    _ if stop != Stop::Pause => {
                        let opts = AcquireOptions::new(thread_target.ttl).wait(wait);
                        let lease = lock.acquire(&key, &opts).await?;
                        let lock: Arc<dyn DistributedLock> = lock;
                        Ok(LockGuard::with_clock(lock, lease, clock.clone()))
                    }
                    _ => {
                        let opts = AcquireOptions::new(thread_target.ttl).wait(wait);
                        primitive.wrap(lock).lock(&key, &opts).await
                    }
                }
            };
            let guard = match taken.await {
                Ok(g) => g,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let increment = counter.read(guard.fencing_token());
            let _ = ready_tx.send(Ok(()));
            if freeze.await.is_err() {
                return;
            }
            // The pause: this thread, and with it every task of the holder, stops.
            let deadline = guard.deadline();
            let stopped = Instant::now();
            let _ = wake.recv_timeout(patience + Duration::from_secs(5));
            let resumed = Instant::now();
            let write_accepted = match stop {
                Stop::Pause => Some(counter.write(increment).is_ok()),
                Stop::Suspend { .. } => {
                    clock.suspend(resumed - stopped);
                    let believes = !guard.is_lost();
                    believes.then(|| counter.write(increment).is_ok())
                }
            };
            // The watchdog runs again: give it a renewal interval to act on what it
            // finds, recording any loss it reports.
            let interval = tenure_api::renewal_interval(thread_target.ttl);
            if tokio::time::timeout(interval * 2, guard.lost())
                .await
                .is_ok()
            {
                history.lost(HOLDER, Instant::now());
            }
            let _ = woken_tx.send(Woken {
                frozen: (stopped, resumed),
                deadline,
                write_accepted,
                key: guard.key().clone(),
            });
            let _ = guard.release().await;
        });
    });
    match ready.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return setup_failed("holder", e),
        Err(_) => return setup_failed("holder", LockError::backend("the holder's thread ended")),
    }
    let _ = freeze_tx.send(());
    // The contender writes once the woken holder has written and released, and a
    // release of a lease the server ended may first reconnect (a TLS handshake and a
    // password check, on a loaded machine: seconds): its lease outlasts all that, or it
    // would no longer believe when it writes.
    let opts = AcquireOptions::new(patience * 2).wait(patience);
    let opts = match primitive {
        Primitive::Leadership => opts.label("contender"),
        _ => opts,
    };
    // The contender reads when granted, before the holder wakes and writes.
    let outcome = contend_with(&contender, &record, &opts).await;
    let _ = wake_tx.send(());
    let woken = woken.await;
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    let Ok(woken) = woken else {
        return setup_failed("holder", LockError::backend("the holder's thread ended"));
    };
    let (stopped, resumed) = woken.frozen;
    // A semaphore's contender must have waited for the paused holder's own permit.
    let same_key = outcome
        .granted
        .as_ref()
        .is_none_or(|lease| *lease.key() == woken.key);
    let fired =
        resumed >= woken.deadline && stopped <= outcome.at && outcome.at <= resumed && same_key;
    let holder = Holder {
        stale_write: woken.write_accepted,
        ..Holder::idle(contender.clone(), Ending::Nothing)
    };
    let trial = record
        .judge(target, holder, &contender, outcome, fired)
        .await;
    if let Some((lock, lease)) = filler {
        let _ = lock.release(lease).await;
    }
    trial
}

/// What a paused-holder trial holds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Primitive {
    /// The lock itself.
    Lock,
    /// A permit of a two-permit [`Semaphore`].
    Permit,
    /// An [`Election`]'s leadership.
    Leadership,
    /// A reader's lease ([`DistributedLock::acquire_shared`]); the contender is a writer.
    Reader,
}

impl Primitive {
    /// `lock` as this primitive's clients use it: a [`Semaphore`] of two permits for
    /// [`Permit`](Self::Permit), else the lock itself (an election is its lock, with
    /// labels).
    pub(super) fn wrap(self, lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        match self {
            Primitive::Permit => match Semaphore::new(lock.clone(), 2) {
                Ok(semaphore) => Arc::new(semaphore),
                Err(_) => lock, // 2 permits are always accepted
            },
            Primitive::Lock | Primitive::Leadership | Primitive::Reader => lock,
        }
    }
}
