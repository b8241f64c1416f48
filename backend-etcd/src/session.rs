//! Session leases: one etcd lease per client and TTL (in whole seconds), shared by the
//! client's lock keys and kept alive by one background task — etcd's own
//! `concurrency.Session` shape, which saves a lease grant and a revoke per lock.
//!
//! A shared lease would keep every key on it alive as long as the client runs, so the
//! session also keeps each key's own deadline: a key not renewed (by `extend`, or by its
//! waiter) by `reap_at` is deleted by the session's task, in a transaction that only
//! matches the key on this lease. `reap_at` is always at least the holder's believed
//! deadline, and an `extend` moves it forward *before* it reads the key, so the task
//! never deletes a key its holder may still believe held: a key the task has taken for
//! deletion is no longer registered, and `extend` then reports `LeaseLost`.
//!
//! A key is registered before it is sent, under a name never used before, and once
//! taken out of the registry it is never renewed again. So a key on the lease that is
//! not registered is one nobody may believe held — a write that landed after its caller
//! gave up (a cancelled or timed-out enqueue or move) — and the task deletes such keys
//! once per TTL (it lists the lease's keys), so none is kept alive for the client's life.
//!
//! If the client stops (crash, pause, last handle dropped), keep-alives stop and the
//! server ends the lease, and every key on it, one lease TTL after the last keep-alive:
//! the same bound as a lease of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use etcd_client::LeaseTimeToLiveOptions;
use tenure_api::{Clock, LockError, SystemClock};
use tokio::sync::Notify;

use crate::rpc::{delete_on_lease, lease_seconds, Rpc};

/// The sessions of one client (shared by its clones), one per lease TTL in whole seconds.
pub(crate) struct Sessions {
    rpc: Rpc,
    /// Never held across a request: `extend` and `release` look sessions up here.
    by_secs: Mutex<HashMap<i64, Arc<Session>>>,
    /// Held by a grant of a new session lease, so that concurrent first uses of one TTL
    /// share one lease; lookups never wait for it.
    granting: tokio::sync::Mutex<()>,
    /// Numbers each key name this client writes, so no name is ever used twice.
    names: AtomicU64,
}

/// One shared etcd lease and the keys on it.
pub(crate) struct Session {
    pub(crate) lease_id: i64,
    /// The TTL the lease may be believed for after a keep-alive.
    pub(crate) granted: Duration,
    state: Mutex<State>,
    wake: Notify,
}

struct State {
    /// When the grant or the last successful keep-alive was sent.
    confirmed_at: Instant,
    /// The machine's time suspended so far when that was sent: after a suspend
    /// (`Instant` stood still, the lease did not), a confirmation counts for nothing.
    confirmed_suspended: Duration,
    /// The lease is known to be gone, or is being closed: no new keys.
    closed: bool,
    /// The keys on this lease and when to delete each unless renewed by then.
    keys: HashMap<String, Instant>,
}

impl Sessions {
    pub(crate) fn new(rpc: Rpc) -> Self {
        Self {
            rpc,
            by_secs: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
            names: AtomicU64::new(0),
        }
    }

    /// A number this client has not used in a key name before.
    pub(crate) fn fresh_name(&self) -> u64 {
        self.names.fetch_add(1, Ordering::Relaxed)
    }

    /// The session for `ttl`, granting its lease if there is none, with the key named
    /// `key_of(lease id)` registered on it until `reap_at` (so the key cannot outlive that
    /// unless renewed, even if the caller is dropped once the key is sent).
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease whose grant was dropped in flight carries no key and runs out
    /// its TTL.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        ttl: Duration,
        key_of: &(dyn Fn(i64) -> String + Sync),
        reap_at: Instant,
    ) -> Result<Arc<Session>, LockError> {
        let secs = lease_seconds(ttl);
        if let Some(session) = self.joined(secs, key_of, reap_at) {
            return Ok(session);
        }
        let _granting = self.granting.lock().await;
        // Granted meanwhile by another caller?
        if let Some(session) = self.joined(secs, key_of, reap_at) {
            return Ok(session);
        }
        let (sent, suspended) = (Instant::now(), SystemClock.suspended());
        let (lease_id, granted) = self
            .rpc
            .grant_lease(Duration::from_secs(secs.unsigned_abs()))
            .await?;
        let session = Arc::new(Session {
            lease_id,
            granted,
            state: Mutex::new(State {
                confirmed_at: sent,
                confirmed_suspended: suspended,
                closed: false,
                keys: HashMap::new(),
            }),
            wake: Notify::new(),
        });
        session.register(&key_of(lease_id), reap_at);
        self.map().insert(secs, session.clone());
        tokio::spawn(keep(
            session.clone(),
            Arc::downgrade(self),
            self.rpc.clone(),
        ));
        Ok(session)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<Session>>> {
        self.by_secs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live session for `secs` with the key named `key_of(lease id)` registered on
    /// it, if there is one that takes new keys.
    fn joined(
        &self,
        secs: i64,
        key_of: &(dyn Fn(i64) -> String + Sync),
        reap_at: Instant,
    ) -> Option<Arc<Session>> {
        let session = self.map().get(&secs)?.clone();
        session
            .register(&key_of(session.lease_id), reap_at)
            .then_some(session)
    }

    /// The live session whose lease is `lease_id`, if it is one of this client's.
    pub(crate) fn find(&self, lease_id: i64) -> Option<Arc<Session>> {
        self.map()
            .values()
            .find(|s| s.lease_id == lease_id && !s.state().closed)
            .cloned()
    }

    /// The instant a key's TTL may be counted from: when `session`'s lease was last
    /// confirmed alive (sending a keep-alive first if that was more than a fifth of the
    /// lease's TTL ago, or of the key's `ttl` if that is shorter — else a short TTL
    /// would be counted from a confirmation older than itself and granted expired; the
    /// task sends one every tenth of the lease's TTL), but no later than `registered`,
    /// the instant the key's deadline was last set from (so the belief never outlasts
    /// the session's deletion of the key). `LeaseLost` if the lease is gone.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub(crate) async fn confirmed(
        &self,
        session: &Session,
        registered: Instant,
        ttl: Duration,
    ) -> Result<Instant, LockError> {
        let (confirmed_at, confirmed_suspended, closed) = {
            let state = session.state();
            (state.confirmed_at, state.confirmed_suspended, state.closed)
        };
        if closed {
            return Err(session.gone());
        }
        let slept = SystemClock.suspended() > confirmed_suspended;
        if !slept && confirmed_at.elapsed() <= session.granted.min(ttl) / 5 {
            return Ok(confirmed_at.min(registered));
        }
        let (sent, suspended) = (Instant::now(), SystemClock.suspended());
        match self.rpc.keep_alive(session.lease_id).await {
            Ok(()) => Ok(session.confirm(sent, suspended).min(registered)),
            Err(e @ LockError::LeaseLost { .. }) => {
                session.close();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

impl Session {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn gone(&self) -> LockError {
        LockError::lost(format!(
            "etcd session lease {:x} has expired or was revoked",
            self.lease_id
        ))
    }

    /// Registers `key` until `reap_at` (or later, if it already was). False if the
    /// session takes no new keys.
    pub(crate) fn register(&self, key: &str, reap_at: Instant) -> bool {
        let mut state = self.state();
        if state.closed {
            return false;
        }
        let at = state.keys.entry(key.to_owned()).or_insert(reap_at);
        *at = (*at).max(reap_at);
        true
    }

    /// Moves a registered key's deadline to at least `reap_at`. `LeaseLost` if the key
    /// is no longer registered (deleted, or taken for deletion) or the lease is gone.
    pub(crate) fn renew(&self, key: &str, reap_at: Instant) -> Result<(), LockError> {
        let mut state = self.state();
        if state.closed {
            drop(state);
            return Err(self.gone());
        }
        match state.keys.get_mut(key) {
            Some(at) => {
                *at = (*at).max(reap_at);
                Ok(())
            }
            None => Err(LockError::lost(format!(
                "the key {key} was deleted at its deadline"
            ))),
        }
    }

    /// Forgets a key that was deleted (or never written).
    pub(crate) fn forget(&self, key: &str) {
        self.state().keys.remove(key);
    }

    /// Asks the task to delete `key` now. Never blocks: usable from `Drop`.
    pub(crate) fn reap_now(&self, key: &str) {
        if let Some(at) = self.state().keys.get_mut(key) {
            *at = Instant::now();
        }
        self.wake.notify_one();
    }

    /// Records a keep-alive sent at `sent` as answered; returns the confirmation time.
    fn confirm(&self, sent: Instant, suspended: Duration) -> Instant {
        let mut state = self.state();
        if sent >= state.confirmed_at {
            state.confirmed_at = sent;
            state.confirmed_suspended = suspended;
        }
        state.confirmed_at
    }

    /// Takes no new keys: the lease is gone.
    pub(crate) fn close(&self) {
        self.state().closed = true;
    }

    /// Takes the keys due for deletion at `now` out of the registry.
    fn due(&self, now: Instant) -> Vec<String> {
        let mut state = self.state();
        let due: Vec<String> = state
            .keys
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &due {
            state.keys.remove(key);
        }
        due
    }
}

/// The session's task: a keep-alive every tenth of the TTL, deletion of keys past their
/// deadline (retried until it succeeds), and once per TTL of keys on the lease that are
/// not registered. It ends when the lease is gone or when the client is dropped (leaving
/// the lease to run out its TTL: a lock taken by a client that exits stays held for that
/// long, as with a lease of its own). Like etcd's `concurrency.Session`, a session lives
/// as long as its client: one per distinct TTL (in whole seconds) the client has used.
async fn keep(session: Arc<Session>, client: Weak<Sessions>, rpc: Rpc) {
    let period = session.granted / 10;
    // Keys taken out of the registry whose deletion failed: retried, never renewed.
    let mut doomed: Vec<String> = Vec::new();
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = session.wake.notified() => {}
        }
        if client.strong_count() == 0 {
            return;
        }
        if session.state().confirmed_at.elapsed() >= period {
            let (sent, suspended) = (Instant::now(), SystemClock.suspended());
            match rpc.keep_alive(session.lease_id).await {
                Ok(()) => {
                    session.confirm(sent, suspended);
                }
                Err(LockError::LeaseLost { .. }) => {
                    session.close();
                    return;
                }
                Err(_) => {} // again next period; holders see the confirmation age
            }
        }
        doomed.extend(session.due(Instant::now()));
        ticks = ticks.wrapping_add(1);
        if ticks % 10 == 0 {
            doomed.extend(unregistered(&session, &rpc).await);
        }
        let mut failed = Vec::new();
        for key in doomed.drain(..) {
            let txn = delete_on_lease(&key, session.lease_id);
            if rpc.txn("expired key delete", txn).await.is_err() {
                failed.push(key);
            }
        }
        doomed = failed;
    }
}

/// The keys on the session's lease that are not registered (listed by the leader; none
/// if that fails — the next pass tries again).
async fn unregistered(session: &Session, rpc: &Rpc) -> Vec<String> {
    let request = || {
        let (mut leases, id) = (rpc.client.lease_client(), session.lease_id);
        let options = LeaseTimeToLiveOptions::new().with_keys();
        async move { leases.time_to_live(id, Some(options)).await }
    };
    let Ok(reply) = rpc.call("lease keys", request).await else {
        return Vec::new();
    };
    let state = session.state();
    reply
        .keys()
        .iter()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .filter(|key| !state.keys.contains_key(key))
        .collect()
}
