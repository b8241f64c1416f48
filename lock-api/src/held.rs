//! What a backend that holds each lock in a session of its own (a connection, a
//! transaction) keeps per held lease: the table of held leases by owner id, the bounds on
//! how many it holds and waits for, and the acquire that waits in the server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{AcquireOptions, FencingToken, Lease, LockError, LockKey, OwnerId};

/// A held lease's entry: the grant it stands for.
pub trait HeldEntry {
    /// The key held.
    fn key(&self) -> &LockKey;
    /// The grant's fencing token.
    fn token(&self) -> FencingToken;
}

/// The leases a client holds, by owner id (each owner id is one grant's).
#[derive(Debug)]
pub struct HeldLeases<E>(Mutex<HashMap<OwnerId, Arc<E>>>);

impl<E> Default for HeldLeases<E> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<E: HeldEntry> HeldLeases<E> {
    /// Records `entry` as `owner`'s grant.
    pub fn insert(&self, owner: OwnerId, entry: Arc<E>) {
        self.table().insert(owner, entry);
    }

    /// The entry of exactly `lease`'s grant (its owner, key and token), taken out of the
    /// table if `remove`.
    pub fn find(&self, lease: &Lease, remove: bool) -> Option<Arc<E>> {
        let mut held = self.table();
        let entry = held.get(&lease.owner())?.clone();
        if entry.key() != lease.key() || entry.token() != lease.token() {
            return None;
        }
        if remove {
            held.remove(&lease.owner());
        }
        Some(entry)
    }

    /// Takes `owner`'s entry out of the table if it is still `entry` (not a later one).
    pub fn forget(&self, owner: OwnerId, entry: &Arc<E>) {
        let mut held = self.table();
        if held.get(&owner).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            held.remove(&owner);
        }
    }

    /// Takes every entry out of the table.
    pub fn drain(&self) -> Vec<Arc<E>> {
        self.table().drain().map(|(_, entry)| entry).collect()
    }

    /// How many leases are held.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerId, Arc<E>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A held-lock slot of `slots`, or [`too_many_held`].
pub fn held_slot(
    slots: &Arc<Semaphore>,
    max_held: usize,
) -> Result<OwnedSemaphorePermit, LockError> {
    slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| too_many_held(max_held))
}

/// The "too many held locks" error, naming the `max_held` option.
pub fn too_many_held(max_held: usize) -> LockError {
    LockError::backend(format!(
        "too many held locks: this client already holds max_held={max_held} locks; release \
         one (a lease dropped without release is freed at once) or raise max_held"
    ))
}

/// A waiting slot of `waiting`, or the "too many blocking acquires" error naming the
/// `max_waiting` option.
pub fn waiting_slot(
    waiting: &Arc<Semaphore>,
    max_waiting: usize,
) -> Result<OwnedSemaphorePermit, LockError> {
    waiting.clone().try_acquire_owned().map_err(|_| {
        LockError::backend(format!(
            "too many blocking acquires: this client already has max_waiting={max_waiting} \
             waiting in the server; raise max_waiting or wait less"
        ))
    })
}

/// `acquire` for a backend whose waiters wait in the server: `attempt(wait)` is one
/// attempt that waits there for up to `wait` (`None`: no time is left, try once), called
/// until it grants, with the time left each time. A busy answer ends the acquire with
/// [`LockError::Timeout`] unless `early(wait, tried)` says the server's wait ended before
/// ours (a cap or a rounding of the server's): then it waits again. A retryable error is
/// retried after `opts.backoff` within the wait.
///
/// # Cancel safety
/// As `attempt`'s.
pub async fn wait_in_server<F, Fut>(
    opts: &AcquireOptions,
    mut attempt: F,
    early: impl Fn(Option<Duration>, Instant, Instant) -> bool,
) -> Result<Lease, LockError>
where
    F: FnMut(Option<Duration>) -> Fut,
    Fut: Future<Output = Result<Option<Lease>, LockError>>,
{
    opts.validate()?;
    let started = Instant::now();
    let deadline = opts.wait_deadline(started);
    let mut failures = 0u32;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wait = (!remaining.is_zero()).then_some(remaining);
        let tried = Instant::now();
        match attempt(wait).await {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) if early(wait, tried, deadline) => {}
            Ok(None) => {
                return Err(LockError::Timeout {
                    waited: started.elapsed(),
                })
            }
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                failures = failures.saturating_add(1);
                let pause = opts
                    .backoff
                    .delay(failures)
                    .min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e),
        }
    }
}
