//! LockGuard and LockExt: renewal, loss reporting, release on drop.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{
    async_trait, renewal_interval, AcquireOptions, Capabilities, DistributedLock, HolderInfo,
    Lease, LockError, LockExt, LockGuard, LockKey, ManualClock, MemoryLock, ReleaseOutcome,
    WithLockError,
};

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

/// How the injected backend behaves on `extend`.
const HEALTHY: u8 = 0;
const FAILING: u8 = 1;
const REFUSED: u8 = 4;
const HANGING: u8 = 2;
const PANICKING: u8 = 3;

/// MemoryLock with injectable faults: an extend that errors, hangs (a silent server) or
/// panics; a release that fails; a grant whose reply arrives `grant_delay` late.
#[derive(Debug)]
struct Faulty {
    inner: MemoryLock,
    extend_mode: AtomicU8,
    extend_entered: AtomicBool,
    extends: AtomicU32,
    /// Extensions that failed (FAILING or REFUSED).
    failures: AtomicU32,
    /// How many of the next extensions fail as FAILING does, whatever the mode.
    failing_next: AtomicU32,
    /// Every extension's deadline is tightened by this much (like `DriftMargin`).
    margin: Duration,
    release_fails: AtomicBool,
    grant_delay: Duration,
    /// How many of the next grants arrive `grant_delay` late.
    late_grants: AtomicU32,
}

impl Faulty {
    fn new(inner: MemoryLock) -> Arc<Self> {
        Self::late(inner, Duration::ZERO)
    }

    fn late(inner: MemoryLock, grant_delay: Duration) -> Arc<Self> {
        Self::late_for(inner, grant_delay, u32::MAX)
    }

    /// Only the first `grants` grants arrive late.
    fn late_for(inner: MemoryLock, grant_delay: Duration, grants: u32) -> Arc<Self> {
        Arc::new(Self {
            inner,
            extend_mode: AtomicU8::new(HEALTHY),
            extend_entered: AtomicBool::new(false),
            extends: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            failing_next: AtomicU32::new(0),
            margin: Duration::ZERO,
            release_fails: AtomicBool::new(false),
            grant_delay,
            late_grants: AtomicU32::new(grants),
        })
    }
}

#[async_trait]
impl DistributedLock for Faulty {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let lease = self.inner.acquire(key, opts).await?;
        let late = self
            .late_grants
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if late.is_ok() {
            tokio::time::sleep(self.grant_delay).await;
        }
        Ok(lease)
    }
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        self.extend_entered.store(true, Ordering::SeqCst);
        let failing_next = self
            .failing_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let mode = match self.extend_mode.load(Ordering::SeqCst) {
            _ if failing_next => FAILING,
            mode => mode,
        };
        if matches!(mode, FAILING | REFUSED) {
            self.failures.fetch_add(1, Ordering::SeqCst);
        }
        match mode {
            FAILING => Err(LockError::Unavailable {
                message: "injected: connection refused".into(),
                source: None,
            }),
            REFUSED => Err(LockError::lost("injected: held by another owner")),
            HANGING => std::future::pending().await,
            PANICKING => panic!("injected: a bug in the backend's extend"),
            _ => {
                self.extends.fetch_add(1, Ordering::SeqCst);
                self.inner.extend(lease, ttl).await?;
                lease.tighten(self.margin);
                Ok(())
            }
        }
    }
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        if self.release_fails.load(Ordering::SeqCst) {
            return Err(LockError::Unavailable {
                message: "injected: release timed out".into(),
                source: None,
            });
        }
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            shared: false,
            ..self.inner.capabilities()
        }
    }
}

const SHORT_TTL: Duration = Duration::from_millis(300);

#[tokio::test]
async fn guard_renews_past_the_ttl() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("renewed");
    let guard = lock
        .lock(&k, &AcquireOptions::new(SHORT_TTL))
        .await
        .unwrap();
    let owner = guard.lease().await.unwrap().owner();
    tokio::time::sleep(SHORT_TTL * 4).await;
    assert!(!guard.is_lost());
    let holder = lock
        .inspect(&k)
        .await
        .unwrap()
        .expect("still held after 4 ttl");
    assert_eq!(holder.owner, owner);
    assert_eq!(holder.token, Some(guard.fencing_token()));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(lock.inspect(&k).await.unwrap().is_none());
}

/// A renewal the server refuses for good (the lease is another's) is a loss at once,
/// long before the deadline.
#[tokio::test]
async fn a_renewal_refused_for_good_marks_the_lease_lost_at_once() {
    let (lock, guard) = faulty_guard("refused", LONG_TTL).await;
    let deadline = guard.deadline();
    lock.extend_mode.store(REFUSED, Ordering::SeqCst);
    tokio::time::timeout(renewal_interval(LONG_TTL) * 2, guard.lost())
        .await
        .expect("loss reported at the first refused renewal (ttl/3)");
    assert!(Instant::now() < deadline, "reported before the deadline");
    assert_eq!(lock.failures.load(Ordering::SeqCst), 1, "not retried");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("held by another owner"), "{reason}");
}

/// A renewal that keeps failing for a reason that may pass (unreachable, no quorum) is
/// retried until the lease deadline; then the lease is lost, with the last error.
#[tokio::test]
async fn a_renewal_failing_until_the_deadline_marks_the_lease_lost_then() {
    let (lock, guard) = faulty_guard("flaky", SHORT_TTL).await;
    lock.extend_mode.store(FAILING, Ordering::SeqCst);
    let deadline = guard.deadline();
    tokio::time::timeout(SHORT_TTL * 2, guard.lost())
        .await
        .expect("loss reported by the deadline");
    assert!(guard.is_lost());
    let failures = lock.failures.load(Ordering::SeqCst);
    assert!(failures >= 2, "retried: {failures} attempts");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(
        reason.contains("while renewals failed") && reason.contains("connection refused"),
        "{reason}"
    );
    assert!(
        Instant::now() + Duration::from_millis(50) >= deadline,
        "not given up before the deadline: {reason}"
    );
}

/// A renewal fails for a reason that may pass, and its retry is still in flight at the
/// deadline: the loss names the failure, not only the deadline.
#[tokio::test]
async fn a_loss_at_the_deadline_names_the_last_renewal_error() {
    let (lock, guard) = faulty_guard("failed-then-silent", SHORT_TTL).await;
    lock.failing_next.store(1, Ordering::SeqCst);
    lock.extend_mode.store(HANGING, Ordering::SeqCst);
    tokio::time::timeout(SHORT_TTL * 2, guard.lost())
        .await
        .expect("loss reported by the deadline");
    assert_eq!(lock.failures.load(Ordering::SeqCst), 1, "the fault fired");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(
        reason.contains("while renewals failed") && reason.contains("connection refused"),
        "{reason}"
    );
}

/// Defect: one renewal that failed for a reason that passes (a slow node: Redlock's
/// `NoQuorum` with one of the lease's three nodes late) marked the lease lost, though it
/// still stood on the servers. The guard retries, and keeps it.
#[tokio::test]
async fn a_renewal_that_fails_once_is_retried_and_the_lease_kept() {
    let (lock, guard) = faulty_guard("blip", SHORT_TTL).await;
    let k = key("blip");
    lock.failing_next.store(1, Ordering::SeqCst);
    tokio::time::sleep(SHORT_TTL * 3).await;
    assert_eq!(lock.failures.load(Ordering::SeqCst), 1, "the fault fired");
    assert!(!guard.is_lost(), "lost: {:?}", guard.lost_signal().reason());
    assert_eq!(
        lock.inspect(&k).await.unwrap().map(|h| h.token),
        Some(Some(guard.fencing_token()))
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test]
async fn silent_backend_marks_the_lease_lost_by_its_deadline() {
    let lock = Faulty::new(MemoryLock::new());
    let started = Instant::now();
    let guard = lock
        .lock(&key("silent"), &AcquireOptions::new(SHORT_TTL))
        .await
        .unwrap();
    let deadline = guard.lease().await.unwrap().valid_until();
    lock.extend_mode.store(HANGING, Ordering::SeqCst);
    tokio::time::timeout(SHORT_TTL * 2, guard.lost())
        .await
        .expect("loss reported although extend never answers");
    let now = Instant::now();
    assert!(now >= deadline, "not reported before the deadline");
    assert!(now - started < SHORT_TTL + Duration::from_millis(150));
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("deadline"), "{reason}");
}

#[tokio::test]
async fn late_wake_up_after_a_pause_marks_the_lease_lost() {
    let clock = ManualClock::new();
    let lock = Arc::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    let lease = lock
        .try_acquire(&key("paused"), Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let guard = LockGuard::with_clock(lock.clone(), lease, Arc::new(clock.clone()));
    tokio::task::yield_now().await;
    // The whole process "sleeps" through two TTLs at once (GC pause, SIGSTOP).
    clock.advance(Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("loss reported on wake-up");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("deadline"), "{reason}");
    // Never re-acquired: the key is free for others.
    assert!(lock.inspect(&key("paused")).await.unwrap().is_none());
}

/// Defect (issue 58, 17): the guard counted its deadline on `Instant`, which stands still
/// while the machine is suspended, while the servers' clocks, and the lease on them, ran
/// on: a lease that ran out during a suspend was still believed held on wake. Here the
/// backend's lease lives in the suspended process too (a MemoryLock on the same clock),
/// so only the guard's count can tell; a suspend shorter than what is left is no loss.
#[tokio::test]
async fn a_lease_that_ran_out_during_a_suspend_is_lost_on_wake() {
    let clock = ManualClock::new();
    let lock = Arc::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    let ttl = Duration::from_secs(30);
    let short = lock
        .try_acquire(&key("short-nap"), ttl)
        .await
        .unwrap()
        .unwrap();
    let short = LockGuard::with_clock(lock.clone(), short, Arc::new(clock.clone()));
    clock.suspend(Duration::from_secs(5));
    tokio::task::yield_now().await;
    assert!(!short.is_lost(), "a suspend within the lease is no loss");
    let deadline = short.lost_signal().deadline();
    assert!(
        deadline < short.lease().await.unwrap().valid_until(),
        "moved earlier"
    );

    let lease = lock
        .try_acquire(&key("suspended"), ttl)
        .await
        .unwrap()
        .unwrap();
    let guard = LockGuard::with_clock(lock.clone(), lease, Arc::new(clock.clone()));
    tokio::task::yield_now().await;
    // A laptop's lid closed for a minute: `now` stands still, the servers run on.
    clock.suspend(Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("loss reported on wake");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("suspended"), "{reason}");
}

#[tokio::test]
async fn dropping_the_guard_releases_in_the_background() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("dropped");
    let guard = lock
        .lock(&k, &AcquireOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    drop(guard);
    let free_again = async {
        while lock.inspect(&k).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), free_again)
        .await
        .expect("released long before the 60 s TTL");
}

#[test]
fn dropping_the_guard_without_a_runtime_does_not_block() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime.block_on(async {
        let lock = Arc::new(MemoryLock::new());
        lock.lock(&key("no-rt"), &AcquireOptions::new(Duration::from_secs(60)))
            .await
            .unwrap()
    });
    drop(runtime);
    drop(guard); // must neither panic nor block
}

#[tokio::test]
async fn with_lock_runs_work_with_the_token_and_releases() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("work");
    let token = lock
        .with_lock(
            &k,
            &AcquireOptions::new(SHORT_TTL),
            |token, lost| async move {
                assert!(!lost.is_lost());
                token
            },
        )
        .await
        .unwrap();
    assert!(token.get() >= 1);
    assert!(
        lock.inspect(&k).await.unwrap().is_none(),
        "released after work"
    );
}

#[tokio::test]
async fn with_lock_cancels_work_when_the_lease_is_lost() {
    let lock = Faulty::new(MemoryLock::new());
    lock.extend_mode.store(FAILING, Ordering::SeqCst);
    let finished = Arc::new(AtomicU8::new(0));
    let flag = finished.clone();
    let result = tokio::time::timeout(
        Duration::from_secs(2),
        lock.with_lock(
            &key("doomed"),
            &AcquireOptions::new(SHORT_TTL),
            |_, _| async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                flag.store(1, Ordering::SeqCst);
            },
        ),
    )
    .await
    .expect("work was cancelled, not run to the end");
    assert!(matches!(
        result,
        Err(WithLockError::Lock(LockError::LeaseLost { .. }))
    ));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn guard_works_through_a_trait_object() {
    let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    let guard: LockGuard = lock
        .lock(&key("dyn"), &AcquireOptions::new(SHORT_TTL))
        .await
        .unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

const LONG_TTL: Duration = Duration::from_secs(30);

/// A guard on `name` (lease of `ttl`) over a [`Faulty`] memory lock that behaves until
/// told otherwise.
async fn faulty_guard(name: &str, ttl: Duration) -> (Arc<Faulty>, LockGuard<Faulty>) {
    let lock = Faulty::new(MemoryLock::new());
    let guard = lock
        .lock(&key(name), &AcquireOptions::new(ttl))
        .await
        .unwrap();
    (lock, guard)
}

/// A lease that reached the guard with 5 s of its 30 s left (a slow reply, a pause
/// between `acquire` and `LockGuard::new`), on a backend whose extend never answers.
async fn late_guard(
    extend_mode: u8,
) -> (
    Arc<Faulty>,
    ManualClock,
    LockGuard<Faulty>,
    std::time::Instant,
) {
    let clock = ManualClock::new();
    let lock = Faulty::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    lock.extend_mode.store(extend_mode, Ordering::SeqCst);
    let lease = lock
        .try_acquire(&key("late"), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    let deadline = lease.valid_until();
    clock.advance(LONG_TTL - Duration::from_secs(5));
    let guard = LockGuard::with_clock(lock.clone(), lease, Arc::new(clock.clone()));
    (lock, clock, guard, deadline)
}

/// Waits (boundedly) until the guard's renewal task has called `extend`.
async fn renewal_started(lock: &Faulty) {
    let entered = async {
        while !lock.extend_entered.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), entered)
        .await
        .expect("a lease with less than two thirds of its TTL left is renewed at once");
}

/// Defect: `is_lost()` only read a flag the watchdog set after sleeping `ttl/3` from the
/// guard's creation, so a lease that arrived late was reported held past its deadline.
#[tokio::test]
async fn a_late_grant_is_never_reported_held_past_its_deadline() {
    let (_lock, clock, guard, deadline) = late_guard(HANGING).await;
    assert!(!guard.is_lost(), "5 s of validity left");
    assert_eq!(guard.deadline(), deadline);
    clock.advance(Duration::from_secs(5));
    // No yield: the answer must not depend on the renewal task having run.
    assert!(guard.is_lost(), "reported held at its deadline");
    assert!(guard.lost_signal().is_lost());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() fires at the deadline");
    assert!(guard.lost_signal().reason().is_some());
}

/// `lost()` fires at the deadline even when the renewal task cannot report it (here it
/// is stuck in an extend that never answers and the deadline passes in one jump).
#[tokio::test]
async fn lost_fires_at_the_deadline_without_the_renewal_task() {
    let (lock, clock, guard, _) = late_guard(HANGING).await;
    let lost = guard.lost_signal();
    let waiter = tokio::spawn(async move { lost.lost().await });
    renewal_started(&lock).await;
    clock.advance(Duration::from_secs(6));
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("lost() resolved at the deadline")
        .unwrap();
}

/// Defect: the watchdog slept `ttl/3` before its first renewal whatever the lease's
/// validity, so a lease that arrived with less than that left expired unrenewed. It now
/// renews at once.
#[tokio::test]
async fn a_late_grant_is_renewed_at_once() {
    let (_lock, clock, guard, deadline) = late_guard(HEALTHY).await;
    let renewed = async {
        while guard.lease().await.unwrap().valid_until() <= deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), renewed)
        .await
        .expect("renewed without the clock moving");
    assert!(guard.deadline() > deadline);
    clock.advance(Duration::from_secs(6));
    assert!(!guard.is_lost(), "renewed before the old deadline");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Defect: the watchdog held the lease mutex across `extend`, so `guard.lease()` blocked
/// until the deadline whenever the server was slow.
#[tokio::test]
async fn reading_the_lease_never_waits_for_a_renewal_in_flight() {
    let (lock, _clock, guard, deadline) = late_guard(HANGING).await;
    renewal_started(&lock).await;
    let lease = tokio::time::timeout(Duration::from_secs(1), guard.lease())
        .await
        .expect("lease() answered while extend hangs");
    assert_eq!(lease.unwrap().valid_until(), deadline);
}

/// Defect: a panic in the renewal task was swallowed: `lost` never fired.
#[tokio::test]
async fn a_panicking_renewal_task_reports_the_lease_lost() {
    let (_lock, _clock, guard, _) = late_guard(PANICKING).await;
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("loss reported when the renewal task panicked");
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("panicked"), "{reason}");
    // The lease itself was not lost with the task: release still frees the key.
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Defect: `with_lock` started the work on a grant that had already expired when it
/// arrived; `lock()` handed out such a guard.
#[tokio::test]
async fn with_lock_never_starts_work_on_an_expired_grant() {
    let ttl = Duration::from_millis(50);
    let lock = Faulty::late(MemoryLock::new(), ttl * 3);
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    // Every grant is late: the wait runs out on them.
    let result = lock
        .with_lock(
            &key("expired"),
            &AcquireOptions::new(ttl).wait(ttl * 4),
            |_, _| async move {
                flag.store(true, Ordering::SeqCst);
            },
        )
        .await;
    assert!(
        matches!(
            result,
            Err(WithLockError::Lock(LockError::LeaseLost { .. }))
        ),
        "{result:?}"
    );
    assert!(
        !started.load(Ordering::SeqCst),
        "work ran on an expired lease"
    );
    // Every grant is late: once the wait has run out, the error says so.
    let opts = AcquireOptions::new(ttl).wait(ttl * 4);
    let guard = lock.lock(&key("expired"), &opts).await;
    assert!(
        matches!(guard, Err(LockError::LeaseLost { .. })),
        "{guard:?}"
    );
}

/// Defect: `lock()` gave up on the first grant that arrived after its deadline, though
/// its wait had time left (the matrix's ZooKeeper holders, on a loaded machine, failed to
/// start: "the grant … arrived after its lease deadline").
#[tokio::test]
async fn a_late_grant_is_released_and_the_lock_asked_for_again_within_the_wait() {
    let ttl = Duration::from_millis(50);
    let late = Faulty::late_for(MemoryLock::new(), ttl * 3, 1);
    let guard = late
        .lock(&key("late-once"), &AcquireOptions::new(ttl))
        .await
        .expect("the second grant arrives in time");
    assert!(!guard.is_lost());
    assert_eq!(
        late.late_grants.load(Ordering::SeqCst),
        0,
        "a late grant came first"
    );
    // The late grant was released: one holder in the backend's eyes.
    let holder = late
        .inner
        .inspect(&key("late-once"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder.owner, guard.lease().await.unwrap().owner());
    guard.release().await.unwrap();
}

/// Defect: when the release after the work failed, `with_lock` returned only the error
/// and threw the work's result away.
#[tokio::test]
async fn with_lock_returns_the_result_and_the_failed_release() {
    let lock = Faulty::new(MemoryLock::new());
    lock.release_fails.store(true, Ordering::SeqCst);
    let result = lock
        .with_lock(
            &key("kept"),
            &AcquireOptions::new(SHORT_TTL),
            |_, _| async { 42 },
        )
        .await;
    match result {
        Err(WithLockError::Release { value, error }) => {
            assert_eq!(value, 42);
            assert!(error.to_string().contains("release timed out"), "{error}");
        }
        other => panic!("expected the value with the release error, got {other:?}"),
    }
}

/// A lease whose deadline sits well inside its TTL after every renewal (a drift margin
/// of 18 s on 30 s) is renewed at once on arrival, then a third of its remaining
/// validity later — never in a tight loop.
#[tokio::test]
async fn renewals_are_spaced_when_the_deadline_sits_inside_the_ttl() {
    let clock = ManualClock::new();
    let mut lock = Faulty::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    Arc::get_mut(&mut lock).unwrap().margin = Duration::from_secs(18);
    let mut lease = lock
        .try_acquire(&key("margin"), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    lease.tighten(lock.margin);
    let guard = LockGuard::with_clock(lock.clone(), lease, Arc::new(clock.clone()));
    let renewed = async {
        while lock.extends.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), renewed)
        .await
        .expect("renewed at once, without the clock moving");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        lock.extends.load(Ordering::SeqCst),
        1,
        "renewed once, not in a loop"
    );
    for _ in 0..5 {
        clock.advance(Duration::from_secs(4)); // a third of the 12 s left
        let renewed = async {
            while lock.extends.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(2), renewed)
            .await
            .expect("renewed after a third of the remaining validity");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            lock.extends.swap(1, Ordering::SeqCst),
            2,
            "one renewal per step"
        );
        assert!(!guard.is_lost());
    }
}

#[tokio::test]
async fn a_pushed_loss_is_reported_at_once_and_the_last_drop_is_signalled() {
    let lock = Arc::new(MemoryLock::new());
    let lease = lock
        .try_acquire(&key("pushed"), Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let notice = tenure_api::backend::LossNotice::new();
    let (tie, dropped) = tenure_api::backend::LeaseTie::new(notice.clone());
    let lease = lease.with_tie(tie);
    let copy = lease.clone();
    let guard = LockGuard::new(lock.clone(), lease);
    let signal = guard.lost_signal();
    assert!(!signal.is_lost());
    notice.fire("lease lost: the connection closed");
    // No renewal, no deadline: the notice alone makes it lost, at once.
    assert!(signal.is_lost());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() completes on the notice");
    assert_eq!(
        signal.reason().as_deref(),
        Some("lease lost: the connection closed")
    );
    drop(guard);
    assert!(!dropped.is_dropped(), "a copy of the lease is still alive");
    drop(copy);
    // The guard's background release holds the last copies; it ends shortly.
    tokio::time::timeout(Duration::from_secs(5), dropped.wait())
        .await
        .expect("every copy of the lease is gone");
}
