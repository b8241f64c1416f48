//! The locks this client holds: each lease's locked file, kept until the lease is
//! released, runs out at its TTL, or is dropped with every clone.
//!
//! The file lock outlives nothing but its own process's open file: so a lease's TTL is
//! kept by this client, on this process's monotonic clock. A task per lease gives the
//! file up at the lease's deadline (and fires the lease's loss notice) unless `extend`
//! moved it; a lease whose every clone is dropped gives it up at once. A holder paused
//! (or stopped) keeps its lock until it runs again or exits: nothing else can take it
//! away. The task runs on the runtime that acquired the lease.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tenure_api::backend::LossNotice;
use tenure_api::{FencingToken, LeaseDropped, LockKey, OwnerId};
use tokio::sync::Notify;

use crate::readers::ReaderRecord;
use crate::record::Record;

/// The leases this client holds, by key and owner (a key is held by one writer, or by
/// readers, each with an owner id of its own).
pub(crate) type HeldMap = Arc<Mutex<HashMap<(LockKey, OwnerId), Arc<Held>>>>;

/// One held lease.
#[derive(Debug)]
pub(crate) struct Held {
    grant: Mutex<Grant>,
    /// Wakes the lease's task: its deadline moved, or it ended.
    changed: Notify,
}

/// A grant just made: the locked file, a reader's record, and the record of the grant.
#[derive(Debug)]
pub(crate) struct Granted {
    /// Dropped first: a reader's record is gone before its lock is.
    pub(crate) reader: Option<ReaderRecord>,
    pub(crate) file: File,
    pub(crate) record: Record,
}

/// What a held lease is made of, under its mutex: every change to the lock file and its
/// record happens with it held, so no record is written once the lock is given up.
#[derive(Debug)]
pub(crate) struct Grant {
    /// A reader's record of its grant, while it holds (dropped before the file).
    reader: Option<ReaderRecord>,
    /// The locked file; `None` once given up.
    file: Option<File>,
    /// The record of this grant, as its state file has it.
    pub(crate) record: Record,
    /// The lease's deadline on this process's monotonic clock.
    valid_until: Instant,
}

impl Grant {
    /// Whether this is the live grant made to `owner` with `token`.
    pub(crate) fn is(&self, owner: OwnerId, token: FencingToken) -> bool {
        self.file.is_some()
            && self.record.owner == owner
            && self.record.token == token.get()
            && Instant::now() < self.valid_until
    }

    /// Moves the deadline later, never earlier: a shorter extension (from a copy of the
    /// lease, or a caller that went away) must not end the hold while another copy of
    /// the lease counts on the deadline promised before.
    pub(crate) fn extend_to(&mut self, valid_until: Instant) {
        self.valid_until = self.valid_until.max(valid_until);
    }

    /// Gives the lock up (a reader's record first, so that no one finds it live while a
    /// writer holds the key).
    pub(crate) fn give_up(&mut self) {
        self.reader = None;
        self.file = None;
    }

    /// A reader's record, if this is a reader's grant.
    pub(crate) fn reader(&self) -> Option<&ReaderRecord> {
        self.reader.as_ref()
    }

    /// Whether the lock file's path still names the file this grant locked (a lock on a
    /// file removed or replaced since excludes no one).
    pub(crate) fn still_named(&self, path: &std::path::Path) -> bool {
        self.file
            .as_ref()
            .is_some_and(|file| crate::ofd::names_it(file, path).unwrap_or(false))
    }
}

impl Held {
    /// Holds `granted` until `valid_until`: registers it in `map` under `key` and its
    /// owner and starts its task, which gives the file up at the deadline (firing `lost`)
    /// or once `dropped`.
    pub(crate) fn start(
        map: &HeldMap,
        key: LockKey,
        granted: Granted,
        valid_until: Instant,
        lost: LossNotice,
        dropped: LeaseDropped,
    ) -> Arc<Held> {
        let Granted {
            file,
            reader,
            record,
        } = granted;
        let owner = record.owner;
        let held = Arc::new(Held {
            grant: Mutex::new(Grant {
                file: Some(file),
                reader,
                record,
                valid_until,
            }),
            changed: Notify::new(),
        });
        let key = (key, owner);
        lock(map).insert(key.clone(), held.clone());
        tokio::spawn(watch(map.clone(), key, held.clone(), lost, dropped));
        held
    }

    /// The grant, locked: for a blocking thread (an extension holds it while it writes
    /// the record).
    pub(crate) fn grant(&self) -> MutexGuard<'_, Grant> {
        self.grant.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the grant from async code: at once if no one holds it, else on a
    /// blocking thread, so that a record being written on a slow file system never stalls
    /// the runtime's threads. `None` if the blocking thread could not run it (the runtime
    /// is shutting down).
    ///
    /// # Cancel safety
    /// Dropped while waiting for the grant, `f` still runs once it is free.
    pub(crate) async fn with_grant<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Grant) -> T + Send + 'static,
    ) -> Option<T> {
        match self.grant.try_lock() {
            Ok(mut grant) => return Some(f(&mut grant)),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                return Some(f(&mut poisoned.into_inner()))
            }
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        let held = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Its result comes back by channel, so that `f` runs even if this future is
        // dropped.
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(f(&mut held.grant()));
        });
        rx.await.ok()
    }

    /// Tells the lease's task its grant changed (a new deadline, or given up).
    pub(crate) fn changed(&self) {
        self.changed.notify_one();
    }
}

/// The lease `owner` holds on `key` in `map`, if any.
pub(crate) fn find(map: &HeldMap, key: &LockKey, owner: OwnerId) -> Option<Arc<Held>> {
    lock(map).get(&(key.clone(), owner)).cloned()
}

fn lock(map: &HeldMap) -> MutexGuard<'_, HashMap<(LockKey, OwnerId), Arc<Held>>> {
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lease's task: gives its file up at the deadline or once every clone of the lease is
/// dropped, and forgets it once given up. It runs on the runtime that acquired the lease:
/// a lease must not outlive that runtime (its file would then be given up only with its
/// client).
///
/// # Cancel safety
/// Dropped (its runtime shut down), the file stays open until the client is dropped.
async fn watch(
    map: HeldMap,
    key: (LockKey, OwnerId),
    held: Arc<Held>,
    lost: LossNotice,
    dropped: LeaseDropped,
) {
    loop {
        let until = {
            let grant = held.grant();
            if grant.file.is_none() {
                break;
            }
            grant.valid_until
        };
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => {
                let lost = lost.clone();
                let _ = held.with_grant(move |grant| {
                    if grant.file.is_some() && Instant::now() >= grant.valid_until {
                        grant.give_up();
                        lost.fire("the lease's TTL ran out: the file lock was given up");
                    }
                })
                .await;
            }
            () = held.changed.notified() => {}
            () = dropped.wait() => {
                held.with_grant(Grant::give_up).await;
            }
        }
    }
    let mut map = lock(&map);
    if map.get(&key).is_some_and(|h| Arc::ptr_eq(h, &held)) {
        map.remove(&key);
    }
}
