//! LockGuard and LockExt: renewal, loss reporting, release on drop.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{
    async_trait, AcquireOptions, Capabilities, DistributedLock, HolderInfo, Lease, LockError,
    LockExt, LockGuard, LockKey, ManualClock, MemoryLock, ReleaseOutcome,
};

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

/// How the injected backend behaves on `extend`.
const HEALTHY: u8 = 0;
const FAILING: u8 = 1;
const HANGING: u8 = 2;

/// MemoryLock with an injectable extend failure: a backend that errors, or one whose
/// server has gone silent.
#[derive(Debug)]
struct Faulty {
    inner: MemoryLock,
    extend_mode: AtomicU8,
}

impl Faulty {
    fn new(inner: MemoryLock) -> Arc<Self> {
        Arc::new(Self {
            inner,
            extend_mode: AtomicU8::new(HEALTHY),
        })
    }
}

#[async_trait]
impl DistributedLock for Faulty {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.inner.acquire(key, opts).await
    }
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        match self.extend_mode.load(Ordering::SeqCst) {
            FAILING => Err(LockError::Unavailable {
                message: "injected: connection refused".into(),
                source: None,
            }),
            HANGING => std::future::pending().await,
            _ => self.inner.extend(lease, ttl).await,
        }
    }
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
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

#[tokio::test]
async fn failed_renewal_marks_the_lease_lost() {
    let lock = Faulty::new(MemoryLock::new());
    let guard = lock
        .lock(&key("flaky"), &AcquireOptions::new(SHORT_TTL))
        .await
        .unwrap();
    lock.extend_mode.store(FAILING, Ordering::SeqCst);
    tokio::time::timeout(SHORT_TTL, guard.lost())
        .await
        .expect("loss reported at the first failed renewal (ttl/3)");
    assert!(guard.is_lost());
    let reason = guard.lost_signal().reason().unwrap();
    assert!(reason.contains("connection refused"), "{reason}");
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
    assert!(guard.lost_signal().reason().unwrap().contains("too late"));
    // Never re-acquired: the key is free for others.
    assert!(lock.inspect(&key("paused")).await.unwrap().is_none());
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
    assert!(matches!(result, Err(LockError::LeaseLost { .. })));
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
