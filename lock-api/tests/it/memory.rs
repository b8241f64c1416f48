//! MemoryLock: the contract, on the reference backend.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_api::{
    AcquireOptions, DistributedLock, LockError, LockKey, ManualClock, MemoryLock, ReleaseOutcome,
};

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn acquire_release_reacquire() {
    let lock = MemoryLock::new();
    let k = key("a");
    let first = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_none(), "held");
    assert_eq!(
        lock.release(first.clone()).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        lock.release(first.clone()).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    let second = lock
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free again");
    assert!(second.token() > first.token());
    assert_ne!(second.owner(), first.owner());
}

#[tokio::test]
async fn keys_are_independent() {
    let lock = MemoryLock::new();
    let a = lock.try_acquire(&key("a"), TTL).await.unwrap();
    let b = lock.try_acquire(&key("b"), TTL).await.unwrap();
    assert!(a.is_some() && b.is_some());
}

#[tokio::test]
async fn ttl_expiry_and_takeover_on_manual_clock() {
    let clock = ManualClock::new();
    let lock = MemoryLock::with_clock(Arc::new(clock.clone()));
    let k = key("expiring");
    let mut old = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    clock.advance(TTL - Duration::from_millis(1));
    assert!(
        lock.try_acquire(&k, TTL).await.unwrap().is_none(),
        "not yet expired"
    );
    let info = lock.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.owner, old.owner());
    assert_eq!(info.remaining, Some(Duration::from_millis(1)));
    clock.advance(Duration::from_millis(1));
    assert!(lock.inspect(&k).await.unwrap().is_none(), "expired at ttl");
    let new = lock
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("taken over");
    assert!(new.token() > old.token());

    // The old holder can neither extend nor release the new owner's lock.
    let err = lock.extend(&mut old, TTL).await.unwrap_err();
    assert!(matches!(err, LockError::LeaseLost { .. }), "{err}");
    assert_eq!(lock.release(old).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(lock.inspect(&k).await.unwrap().unwrap().owner, new.owner());
}

#[tokio::test]
async fn extend_after_expiry_never_reacquires() {
    let clock = ManualClock::new();
    let lock = MemoryLock::with_clock(Arc::new(clock.clone()));
    let k = key("k");
    let mut lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    clock.advance(TTL / 2);
    lock.extend(&mut lease, TTL).await.unwrap();
    clock.advance(TTL - Duration::from_millis(1));
    assert!(
        lock.inspect(&k).await.unwrap().is_some(),
        "extension moved the expiry"
    );
    clock.advance(Duration::from_millis(1));
    assert!(lock.extend(&mut lease, TTL).await.is_err());
    assert!(
        lock.inspect(&k).await.unwrap().is_none(),
        "extend did not re-acquire"
    );
}

#[tokio::test]
async fn invalid_ttl_is_invalid_input() {
    let lock = MemoryLock::new();
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_secs(365 * 86400),
    ] {
        let err = lock.try_acquire(&key("k"), ttl).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidInput(_)), "{ttl:?}: {err}");
        let err = lock
            .acquire(&key("k"), &AcquireOptions::new(ttl))
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidInput(_)));
    }
    assert!(lock.inspect(&key("k")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_lose_no_update() {
    let lock = Arc::new(MemoryLock::new());
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (lock, counter, inside, opts) =
            (lock.clone(), counter.clone(), inside.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let lease = lock.acquire(&key("counter"), &opts).await.unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let read = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(read + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                lock.release(lease).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 16 * 20);
}

#[tokio::test]
async fn acquire_times_out_after_waiting() {
    let lock = MemoryLock::new();
    let k = key("busy");
    let _held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let started = std::time::Instant::now();
    let err = lock
        .acquire(
            &k,
            &AcquireOptions::new(TTL).wait(Duration::from_millis(150)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "it really waited"
    );
}

#[tokio::test]
async fn waiter_is_woken_by_release_not_by_polling() {
    let clock = ManualClock::new(); // time never moves: only a push can wake the waiter
    let lock = Arc::new(MemoryLock::with_clock(Arc::new(clock)));
    let k = key("push");
    let held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.acquire(&k, &AcquireOptions::new(TTL)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());
    lock.release(held).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("woken by release")
        .unwrap()
        .unwrap();
    assert_eq!(
        lock.inspect(&k).await.unwrap().unwrap().owner,
        lease.owner()
    );
}

#[tokio::test]
async fn waiter_takes_over_on_expiry() {
    let clock = ManualClock::new();
    let lock = Arc::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    let k = key("expiry-wake");
    let _held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move {
            lock.acquire(&k, &AcquireOptions::new(TTL).wait(TTL * 2))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    clock.advance(TTL);
    let lease = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("woken at expiry")
        .unwrap()
        .unwrap();
    assert_eq!(lease.key(), &k);
}

#[tokio::test]
async fn waiters_are_served_in_fifo_order() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("fifo");
    let held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (lock, k, order) = (lock.clone(), k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = lock.acquire(&k, &AcquireOptions::new(TTL)).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
            lock.release(lease).await.unwrap();
        }));
        // Let waiter i queue before waiter i+1.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    lock.release(held).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[tokio::test]
async fn try_acquire_does_not_jump_the_queue() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("queue");
    let held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.acquire(&k, &AcquireOptions::new(TTL)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    lock.release(held).await.unwrap();
    // Either the waiter already holds it, or it is queued ahead of us: never us.
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_none());
    waiter.await.unwrap().unwrap();
}

#[tokio::test]
async fn cancelled_acquire_leaves_no_ghost_waiter() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("ghost");
    let held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    // Queue a waiter, then drop its future.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(30),
        lock.acquire(&k, &AcquireOptions::new(TTL)),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the acquire was cancelled while waiting"
    );
    lock.release(held).await.unwrap();
    // No ghost: the key is free for a plain try, and nobody holds it.
    assert!(lock.inspect(&k).await.unwrap().is_none());
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_some());
}

#[tokio::test]
async fn cancelled_head_waiter_hands_the_turn_on() {
    let lock = Arc::new(MemoryLock::new());
    let k = key("handoff");
    let held = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let head = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.acquire(&k, &AcquireOptions::new(TTL)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.acquire(&k, &AcquireOptions::new(TTL)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    lock.release(held).await.unwrap();
    // Abort the head right after the release woke it: whether or not it got the lock
    // first, the second waiter must not be stranded.
    head.abort();
    if let Ok(Ok(lease)) = head.await {
        lock.release(lease).await.unwrap();
    }
    let lease = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("the second waiter is not stranded")
        .unwrap()
        .unwrap();
    assert_eq!(
        lock.inspect(&k).await.unwrap().unwrap().owner,
        lease.owner()
    );
}

#[tokio::test]
async fn tokens_strictly_increase_across_release_and_expiry() {
    let clock = ManualClock::new();
    let lock = MemoryLock::with_clock(Arc::new(clock.clone()));
    let k = key("tokens");
    let mut last = None;
    for i in 0..100 {
        let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
        if let Some(prev) = last {
            assert!(lease.token() > prev);
        }
        last = Some(lease.token());
        if i % 2 == 0 {
            lock.release(lease).await.unwrap();
        } else {
            clock.advance(TTL);
        }
    }
}

/// Defect: a waiter timed its sleep by the previous holder's expiry (or its own wait
/// deadline), so when the next holder dropped its lease without releasing, the expiry
/// of that lease never woke the queue and the waiter slept on.
#[tokio::test]
async fn expiry_of_a_dropped_lease_wakes_the_next_waiter() {
    let clock = ManualClock::new();
    let lock = Arc::new(MemoryLock::with_clock(Arc::new(clock.clone())));
    let k = key("queue-expiry");
    let first = lock.try_acquire(&k, TTL * 3).await.unwrap().expect("free");
    let waiter = |ttl: Duration| {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(3600));
            lock.acquire(&k, &opts).await
        })
    };
    let second = waiter(Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(20)).await; // second queues first
    let third = waiter(TTL);
    tokio::time::sleep(Duration::from_millis(20)).await;
    lock.release(first).await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("the release woke the head of the queue")
        .unwrap()
        .unwrap();
    // The second holder vanishes without releasing: only its 1 s TTL frees the key.
    drop(second);
    clock.advance(Duration::from_secs(2));
    let third = tokio::time::timeout(Duration::from_secs(2), third)
        .await
        .expect(
            "the expiry woke the next waiter (not the first holder's 30 s TTL, nor its 1 h wait)",
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        lock.inspect(&k).await.unwrap().unwrap().owner,
        third.owner()
    );
}

/// Defect: `started + opts.wait` overflowed (a panic) for `Duration::MAX`, the natural
/// spelling of "wait forever". It now waits without bound.
#[tokio::test]
async fn a_wait_of_duration_max_waits_without_bound() {
    let lock = MemoryLock::new();
    let k = key("forever");
    let forever = AcquireOptions::new(TTL).wait(Duration::MAX);
    let held = lock
        .acquire(&k, &forever)
        .await
        .expect("free: granted at once");
    let waiting =
        tokio::time::timeout(Duration::from_millis(200), lock.acquire(&k, &forever)).await;
    assert!(
        waiting.is_err(),
        "still waiting, neither panicked nor timed out"
    );
    lock.release(held).await.unwrap();
    let attempt = tenure_api::backend::poll_acquire(&tenure_api::SystemClock, &forever, || async {
        Ok(Some(lock.try_acquire(&k, TTL).await?.expect("free")))
    });
    attempt.await.expect("poll_acquire with an unbounded wait");
}

/// A long wait polling once a minute: a wake-up that ends a pause shows as a wait of
/// seconds, not a minute.
fn slow_polling() -> AcquireOptions {
    AcquireOptions::new(TTL)
        .wait(Duration::from_secs(600))
        .backoff(tenure_api::Backoff {
            initial: Duration::from_secs(60),
            max: Duration::from_secs(60),
            jitter: 0.0,
        })
}

/// A release signalled while an attempt was finding the key held — after its check,
/// before the pause — ends that pause at once: the signal's future is made before the
/// attempt. It was made after, and such a release left the waiter to sleep out its
/// backoff.
#[tokio::test(start_paused = true)]
async fn a_release_signalled_during_the_failed_attempt_is_not_missed() {
    let lock = MemoryLock::new();
    let k = key("woken-early");
    let slow = slow_polling();
    let held = std::sync::Mutex::new(lock.try_acquire(&k, TTL).await.unwrap());
    let released = tokio::sync::Notify::new();
    let started = tokio::time::Instant::now();
    let (lock, k, held, signal) = (&lock, &k, &held, &released);
    let lease = tenure_api::backend::poll_acquire_woken(
        &tenure_api::SystemClock,
        &slow,
        move || async move {
            let granted = lock.try_acquire(k, TTL).await;
            // The holder lets go right after this attempt found the key held.
            let holder = held.lock().unwrap().take();
            if let Some(holder) = holder {
                lock.release(holder).await.unwrap();
                signal.notify_waiters();
            }
            granted
        },
        || released.notified(),
    )
    .await
    .expect("granted once released");
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(2), "woken: {waited:?}");
    lock.release(lease).await.unwrap();
}

/// `poll_acquire_woken` retries as soon as the release signal fires, instead of sleeping
/// out its backoff; without a signal it keeps to the backoff.
#[tokio::test(start_paused = true)]
async fn a_release_signal_cuts_the_backoff_pause_short() {
    let lock = MemoryLock::new();
    let k = key("woken");
    let slow = slow_polling();
    for signalled in [true, false] {
        let held = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = std::sync::Mutex::new(Some(released));
        let started = tokio::time::Instant::now();
        let waiter = tenure_api::backend::poll_acquire_woken(
            &tenure_api::SystemClock,
            &slow,
            || lock.try_acquire(&k, TTL),
            || {
                let signal = released.lock().unwrap().take();
                async move {
                    match signal {
                        Some(signal) if signalled => drop(signal.await),
                        _ => std::future::pending().await,
                    }
                }
            },
        );
        let holder = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lock.release(held).await.unwrap();
            let _ = release.send(());
        };
        let (lease, ()) = tokio::join!(waiter, holder);
        let lease = lease.expect("granted once released");
        let waited = started.elapsed();
        if signalled {
            assert!(waited < Duration::from_secs(2), "woken: {waited:?}");
        } else {
            assert!(waited >= Duration::from_secs(30), "polled: {waited:?}");
        }
        lock.release(lease).await.unwrap();
    }
}
