//! A suite that cannot fail proves nothing: deliberately broken backends, each of which
//! must be caught by the scenarios that target its bug.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure_api::{
    async_trait, AcquireOptions, Capabilities, DistributedLock, FencingToken, HolderInfo, Lease,
    LockError, LockKey, MemoryLock, OwnerId, ReleaseOutcome, MAX_TTL,
};
use tenure_conformance::runner::{run_scenario, ScenarioResult};
use tenure_conformance::{scenarios, Harness, MemoryHarness};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    /// `DEL key` without comparing the owner.
    ReleaseWithoutOwnerCheck,
    /// `SETNX` then `EXPIRE` as two steps: a crash in between leaves a lock without TTL.
    SetnxThenExpire,
    /// The fence counter starts over whenever the key is released.
    FenceResetsAfterRelease,
    /// `extend` on a lost lease quietly takes the lock again.
    ExtendReacquires,
    /// `extend` sets the deadline to now + TTL even where that is earlier than the one
    /// already promised (`PEXPIRE` without `GT`).
    ExtendShortens,
}

/// State shared by every client of one broken backend.
#[derive(Debug, Default)]
struct Shared {
    /// The lease the inner lock really granted, by owner (tokens may be rewritten).
    inner_leases: Mutex<HashMap<OwnerId, Lease>>,
    /// Grants per key since its last release (for the resetting fence).
    grants_since_release: Mutex<HashMap<LockKey, u64>>,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryLock,
    bug: Bug,
    shared: Arc<Shared>,
    /// False once this client is dropped ("crashed").
    alive: Arc<AtomicBool>,
}

impl Drop for Broken {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
    }
}

impl Broken {
    fn remember(&self, inner: Lease, shown: Lease) -> Lease {
        let mut leases = self.shared.inner_leases.lock().unwrap();
        leases.insert(inner.owner(), inner);
        shown
    }

    fn inner_lease(&self, shown: &Lease) -> Lease {
        let leases = self.shared.inner_leases.lock().unwrap();
        leases
            .get(&shown.owner())
            .cloned()
            .unwrap_or_else(|| shown.clone())
    }

    fn shown(&self, inner: Lease, ttl: Duration) -> Lease {
        let token = match self.bug {
            Bug::FenceResetsAfterRelease => {
                let mut grants = self.shared.grants_since_release.lock().unwrap();
                let count = grants.entry(inner.key().clone()).or_default();
                *count += 1;
                FencingToken(*count)
            }
            _ => inner.token(),
        };
        let shown = Lease::new(
            inner.key().clone(),
            inner.owner(),
            token,
            inner.acquired_at(),
            ttl,
            Duration::ZERO,
        );
        self.remember(inner, shown)
    }

    async fn grant(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        if self.bug != Bug::SetnxThenExpire {
            return Ok(self
                .inner
                .try_acquire(key, ttl)
                .await?
                .map(|l| self.shown(l, ttl)));
        }
        // SETNX: a lock with no expiry ...
        let Some(lease) = self.inner.try_acquire(key, MAX_TTL).await? else {
            return Ok(None);
        };
        // ... then EXPIRE as a second request, which a crash in between never sends.
        let (inner, alive, mut pending) = (self.inner.clone(), self.alive.clone(), lease.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if alive.load(Ordering::SeqCst) {
                let _ = inner.extend(&mut pending, ttl).await;
            }
        });
        Ok(Some(self.shown(lease, ttl)))
    }
}

#[async_trait]
impl DistributedLock for Broken {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.grant(key, ttl).await
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.refuse_label("broken")?;
        tenure_api::backend::poll_acquire(&tenure_api::SystemClock, opts, || {
            self.grant(key, opts.ttl)
        })
        .await
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let mut inner = self.inner_lease(lease);
        let sent = Instant::now();
        match self.inner.extend(&mut inner, ttl).await {
            Ok(()) => {
                if self.bug == Bug::ExtendShortens {
                    // The server's deadline is now + TTL, whatever it was before.
                    let (lock, ending) = (self.inner.clone(), inner.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(ttl).await;
                        let _ = lock.release(ending).await;
                    });
                }
                lease.renewed(sent, ttl, Duration::ZERO);
                self.remember(inner, lease.clone());
                Ok(())
            }
            Err(LockError::LeaseLost { .. }) if self.bug == Bug::ExtendReacquires => {
                match self.grant(lease.key(), ttl).await? {
                    Some(fresh) => {
                        *lease = fresh;
                        Ok(())
                    }
                    None => Err(LockError::lost("held by another")),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let target = match self.bug {
            Bug::ReleaseWithoutOwnerCheck => match self.inner.inspect(lease.key()).await? {
                // Delete whoever holds the key.
                Some(h) => Lease::new(
                    lease.key().clone(),
                    h.owner,
                    h.token.unwrap_or(lease.token()),
                    Instant::now(),
                    lease.ttl(),
                    Duration::ZERO,
                ),
                None => return Ok(ReleaseOutcome::NotHeld),
            },
            _ => self.inner_lease(&lease),
        };
        let outcome = self.inner.release(target).await?;
        if outcome == ReleaseOutcome::Released {
            self.shared
                .grants_since_release
                .lock()
                .unwrap()
                .remove(lease.key());
        }
        Ok(outcome)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let info = self.inner.inspect(key).await?;
        Ok(info.map(|mut holder| {
            if self.bug == Bug::FenceResetsAfterRelease {
                holder.token = None; // the inner token is not the one handed out
            }
            holder
        }))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "broken",
            labels: false,
            shared: false,
            ..self.inner.capabilities()
        }
    }
}

#[derive(Debug)]
struct BrokenHarness {
    inner: MemoryLock,
    bug: Bug,
    shared: Arc<Shared>,
}

#[async_trait]
impl Harness for BrokenHarness {
    fn name(&self) -> String {
        format!("broken:{:?}", self.bug)
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        Ok(Arc::new(Broken {
            inner: self.inner.clone(),
            bug: self.bug,
            shared: self.shared.clone(),
            alive: Arc::new(AtomicBool::new(true)),
        }))
    }
}

/// Runs every scenario concurrently; returns the names of those that failed.
async fn failing_scenarios(harness: &dyn Harness) -> Vec<&'static str> {
    let caps = harness.client().await.unwrap().capabilities();
    let all = scenarios();
    let results =
        futures::future::join_all(all.iter().map(|s| run_scenario(s, harness, &caps))).await;
    all.iter()
        .zip(results)
        .filter_map(|(s, r)| matches!(r, ScenarioResult::Failed(_)).then_some(s.name))
        .collect()
}

async fn assert_caught(bug: Bug, by: &[&str]) {
    let harness = BrokenHarness {
        inner: MemoryLock::new(),
        bug,
        shared: Arc::default(),
    };
    let failed = failing_scenarios(&harness).await;
    eprintln!("{bug:?} caught by {failed:?}");
    for scenario in by {
        assert!(
            failed.contains(scenario),
            "{bug:?} not caught by {scenario}: {failed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correct_memory_lock_passes_every_scenario() {
    let failed = failing_scenarios(&MemoryHarness::new()).await;
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_without_owner_check_is_caught() {
    assert_caught(
        Bug::ReleaseWithoutOwnerCheck,
        &[
            "non_owner_cannot_extend_or_release",
            "releasing_a_stolen_lease_keeps_the_new_owner",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setnx_then_expire_is_caught() {
    assert_caught(Bug::SetnxThenExpire, &["crashed_client_is_freed"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resetting_fence_is_caught() {
    assert_caught(
        Bug::FenceResetsAfterRelease,
        &[
            "acquire_release_reacquire",
            "tokens_strictly_increase",
            "two_clients_never_share",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_that_reacquires_is_caught() {
    assert_caught(Bug::ExtendReacquires, &["extend_after_expiry_fails"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_that_shortens_is_caught() {
    assert_caught(
        Bug::ExtendShortens,
        &["a_shorter_extension_never_ends_an_earlier_promise"],
    )
    .await;
}

/// The checker itself catches a history with two holders (independent of any backend).
#[test]
fn checker_catches_two_holders() {
    let history = tenure_conformance::History::new();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let a = Lease::new(
        LockKey::new("k").unwrap(),
        OwnerId::random(),
        FencingToken(1),
        t0,
        ms(100),
        Duration::ZERO,
    );
    let b = Lease::new(
        LockKey::new("k").unwrap(),
        OwnerId::random(),
        FencingToken(2),
        t0 + ms(10),
        ms(100),
        Duration::ZERO,
    );
    history.record(0, &a, t0, t0 + ms(1), t0 + ms(50));
    history.record(1, &b, t0 + ms(10), t0 + ms(20), t0 + ms(60));
    let report = history.check();
    assert_eq!(report.overlaps(), 1, "{report}");
}
