//! [`MemoryLock`]: the complete in-process backend, and the suite's reference.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{Backend, Driver};
use crate::{
    validate_ttl, AcquireOptions, Capabilities, Clock, DistributedLock, ExpiryKind, Fairness,
    FencingKind, FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome,
    Replication, SystemClock, WaitKind,
};

/// Locks in this process's memory: TTL expiry on an injectable [`Clock`], fencing tokens
/// from one counter (strictly increasing per key and overall), FIFO waiters woken by push
/// (no polling), owner checks on extend and release. Keys are also taken shared
/// ([`DistributedLock::acquire_shared`]): readers together, a writer alone, writers
/// and readers served in one FIFO line, so a waiting writer holds back later readers.
///
/// Clones share state. Use it as the embedded default for tasks of one process, in
/// examples, and as the reference the conformance suite is checked against.
#[derive(Clone)]
pub struct MemoryLock {
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    keys: HashMap<LockKey, Entry>,
    last_token: u64,
    last_waiter: u64,
    ops_since_sweep: u32,
}

#[derive(Default)]
struct Entry {
    /// One exclusive holder, or any number of shared ones.
    holders: Vec<Holder>,
    waiters: VecDeque<Waiter>,
}

struct Holder {
    owner: OwnerId,
    token: FencingToken,
    expires_at: Instant,
    label: Option<String>,
    shared: bool,
}

impl Holder {
    fn info(&self, now: Instant) -> HolderInfo {
        HolderInfo {
            owner: self.owner,
            token: Some(self.token),
            remaining: Some(self.expires_at.saturating_duration_since(now)),
            label: self.label.clone(),
            foreign: false,
        }
    }
}

struct Waiter {
    id: u64,
    wake: Arc<Notify>,
    shared: bool,
}

impl Entry {
    fn expire(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// Whether a request may be granted now: a shared one when no writer holds the key
    /// and only readers are ahead of it in line, an exclusive one when nobody holds the
    /// key and nobody is ahead. `queued`: the request's place in line, else it is last.
    fn grantable(&self, shared: bool, queued: Option<u64>) -> bool {
        let mut ahead = self.waiters.iter().take_while(|w| Some(w.id) != queued);
        match shared {
            true => self.holders.iter().all(|h| h.shared) && ahead.all(|w| w.shared),
            false => self.holders.is_empty() && ahead.next().is_none(),
        }
    }

    /// Wakes the waiters that may be grantable now: the readers at the front of the
    /// line and the first writer (each re-checks its turn).
    fn wake_next(&self) {
        for waiter in &self.waiters {
            waiter.wake.notify_one();
            if !waiter.shared {
                break;
            }
        }
    }

    fn holds(&self, lease: &Lease, now: Instant) -> bool {
        self.holder_of(lease, now).is_some()
    }

    fn holder_of(&self, lease: &Lease, now: Instant) -> Option<usize> {
        self.holders.iter().position(|h| {
            h.owner == lease.owner() && h.token == lease.token() && h.expires_at > now
        })
    }

    /// Who [`inspect`](DistributedLock::inspect) names: the writer, or the reader whose
    /// lease ends last.
    fn current(&self) -> Option<&Holder> {
        self.holders.iter().max_by_key(|h| h.expires_at)
    }
}

const SWEEP_EVERY: u32 = 1024;

impl State {
    /// The entry for `key`, with an expired holder already cleared.
    fn entry(&mut self, key: &LockKey, now: Instant) -> &mut Entry {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= SWEEP_EVERY {
            self.ops_since_sweep = 0;
            self.keys.retain(|_, entry| {
                entry.expire(now);
                !entry.is_idle()
            });
        }
        let entry = self.keys.entry(key.clone()).or_default();
        entry.expire(now);
        entry
    }

    fn forget_if_idle(&mut self, key: &LockKey) {
        if self.keys.get(key).is_some_and(Entry::is_idle) {
            self.keys.remove(key);
        }
    }

    fn grant(
        &mut self,
        key: &LockKey,
        ttl: Duration,
        label: Option<String>,
        shared: bool,
        now: Instant,
    ) -> Lease {
        self.last_token += 1;
        let token = FencingToken(self.last_token);
        let owner = OwnerId::random();
        self.keys
            .entry(key.clone())
            .or_default()
            .holders
            .push(Holder {
                owner,
                token,
                expires_at: now + ttl,
                label,
                shared,
            });
        let lease = Lease::new(key.clone(), owner, token, now, ttl, Duration::ZERO);
        match shared {
            true => lease.into_shared(),
            false => lease,
        }
    }
}

/// A queued waiter; dropping it (timeout, cancelled future) leaves the queue and hands
/// the turn to the next waiter, so no ghost waiter blocks the key.
struct QueueSlot<'a> {
    lock: &'a MemoryLock,
    key: &'a LockKey,
    id: u64,
    wake: Arc<Notify>,
    queued: bool,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut state = self.lock.state();
        if let Some(entry) = state.keys.get_mut(self.key) {
            entry.waiters.retain(|w| w.id != self.id);
            // A writer leaving the line may let the readers behind it in.
            entry.wake_next();
        }
        state.forget_if_idle(self.key);
    }
}

impl MemoryLock {
    /// This backend for URL dispatch ([`Driver`]): `memory://`, a fresh lock table of its own per connect.
    pub const DRIVER: Driver = Driver {
        name: "memory",
        schemes: &["memory"],
        connect: |_| Box::pin(async { Ok(Backend::new(MemoryLock::new())) }),
    };

    /// A lock service timed by the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// A lock service timed by `clock` (e.g. a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many — the holders (a writer, or every reader) and the waiters — are queued
    /// for `key` now.
    pub fn queued(&self, key: &LockKey) -> usize {
        let state = self.state();
        let now = self.clock.now();
        state.keys.get(key).map_or(0, |entry| {
            let held = entry.holders.iter().filter(|h| h.expires_at > now).count();
            held + entry.waiters.len()
        })
    }

    /// The live holders of keys starting with `prefix`, sorted by key (for
    /// [`crate::LockAdmin`]).
    pub(crate) fn holders_with_prefix(&self, prefix: &str) -> Vec<(LockKey, HolderInfo)> {
        let state = self.state();
        let now = self.clock.now();
        let mut holders: Vec<(LockKey, HolderInfo)> = state
            .keys
            .iter()
            .filter(|(key, _)| key.as_str().starts_with(prefix))
            .filter_map(|(key, entry)| {
                let holder = entry.current().filter(|h| h.expires_at > now)?;
                Some((key.clone(), holder.info(now)))
            })
            .collect();
        holders.sort_by(|a, b| a.0.cmp(&b.0));
        holders
    }

    /// Waits in line for `key`, exclusive or `shared`.
    ///
    /// # Cancel safety
    /// A dropped wait leaves the line (its slot's drop).
    async fn wait_for(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        shared: bool,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let started = self.clock.now();
        let deadline = opts.wait_deadline(started);
        let mut slot = QueueSlot {
            lock: self,
            key,
            id: 0,
            wake: Arc::new(Notify::new()),
            queued: false,
        };
        loop {
            let wake_at = {
                let mut state = self.state();
                let now = self.clock.now();
                let entry = state.entry(key, now);
                if entry.grantable(shared, slot.queued.then_some(slot.id)) {
                    if slot.queued {
                        entry.waiters.retain(|w| w.id != slot.id);
                        slot.queued = false;
                    }
                    let lease = state.grant(key, opts.ttl, opts.label.clone(), shared, now);
                    // The next waiters timed their sleep by the previous holders (or by
                    // their own deadlines): wake them to time themselves by this grant's
                    // expiry instead, and readers behind a reader to share it.
                    if let Some(entry) = state.keys.get(key) {
                        entry.wake_next();
                    }
                    return Ok(lease);
                }
                if now >= deadline {
                    drop(state);
                    return Err(LockError::Timeout {
                        waited: now - started,
                    });
                }
                let expires_at = entry.holders.iter().map(|h| h.expires_at).min();
                if !slot.queued {
                    state.last_waiter += 1;
                    slot.id = state.last_waiter;
                    slot.queued = true;
                    let waiter = Waiter {
                        id: slot.id,
                        wake: slot.wake.clone(),
                        shared,
                    };
                    state.entry(key, now).waiters.push_back(waiter);
                }
                expires_at.map_or(deadline, |at| at.min(deadline))
            };
            tokio::select! {
                _ = slot.wake.notified() => {}
                _ = self.clock.sleep_until(wake_at) => {}
            }
        }
    }
}

impl Default for MemoryLock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryLock")
            .field("keys", &state.keys.len())
            .field("last_token", &state.last_token)
            .finish()
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    /// # Cancel safety
    /// Cancel-safe: the grant happens within a single poll.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let mut state = self.state();
        let now = self.clock.now();
        let lease = state
            .entry(key, now)
            .is_idle()
            .then(|| state.grant(key, ttl, None, false, now));
        state.forget_if_idle(key);
        Ok(lease)
    }

    /// # Cancel safety
    /// Cancel-safe: a dropped wait leaves the queue; the grant happens within one poll.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.wait_for(key, opts, false).await
    }

    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        self.wait_for(key, opts, true).await
    }

    /// # Cancel safety
    /// Cancel-safe: the extension happens within a single poll.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let mut state = self.state();
        let now = self.clock.now();
        let entry = state.entry(lease.key(), now);
        if !entry.holds(lease, now) {
            state.forget_if_idle(lease.key());
            return Err(LockError::lost(format!(
                "`{}` is no longer held by {}",
                lease.key(),
                lease.owner()
            )));
        }
        if let Some(holder) = entry
            .holder_of(lease, now)
            .and_then(|at| entry.holders.get_mut(at))
        {
            // Never earlier than promised: a copy of the lease extended to a shorter TTL
            // must not end the hold while the original still counts on it.
            holder.expires_at = holder.expires_at.max(now + ttl);
        }
        lease.renewed(now, ttl, Duration::ZERO);
        Ok(())
    }

    /// # Cancel safety
    /// Cancel-safe: the release happens within a single poll.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let mut state = self.state();
        let now = self.clock.now();
        let entry = state.entry(lease.key(), now);
        let outcome = if let Some(at) = entry.holder_of(&lease, now) {
            entry.holders.swap_remove(at);
            entry.wake_next();
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        };
        state.forget_if_idle(lease.key());
        Ok(outcome)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let mut state = self.state();
        let now = self.clock.now();
        let info = state.entry(key, now).current().map(|h| h.info(now));
        state.forget_if_idle(key);
        Ok(info)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "memory",
            fencing: FencingKind::InProcess,
            expiry: ExpiryKind::LocalClock,
            replication: Replication::InProcess,
            wait: WaitKind::Push,
            fairness: Fairness::Fifo,
            failures_tolerated: 0,
            clock_dependent: false,
            labels: true,
            shared: true,
        }
    }
}
