//! A waiter's own queue record removed on the servers while it waits: it must queue
//! again (or fail), never be granted beside the waiter that queued after the removal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey};

use super::cell::{Trial, Verdict};
use super::trial::{
    contend_with, describe, patience, setup_failed, short, Contended, Record, CONTENDER, HOLDER,
    WITNESS,
};
use super::{Target, WaiterRecords};

/// How long each waiter works once granted: two grants at one release overlap.
const WORK: Duration = Duration::from_millis(200);

/// The trial: a holder holds; a waiter queues behind it and its record is removed; a
/// next waiter queues (behind the holder, the waiter's record gone); the holder releases.
/// Each waiter, once granted, increments the counter across [`WORK`] and releases. The
/// checker sees the waiter and the next waiter hold at once if the waiter was granted on
/// its vanished record. Fired: the record was removed while the waiter still waited.
pub(super) async fn vanished_record(target: &Target, record: Record) -> Trial {
    let Some(records) = target.waiter_records.clone() else {
        return setup_failed("waiter records", LockError::backend("none declared"));
    };
    let mut clients = Vec::new();
    for (client, name) in [(HOLDER, "holder"), (CONTENDER, "waiter"), (WITNESS, "next")] {
        match target.client().await {
            Ok(lock) => clients.push(record.client(client, lock)),
            Err(e) => return setup_failed(name, e),
        }
    }
    let (holder, waiter, next) = (&clients[0], &clients[1], &clients[2]);
    let patience = patience(target);
    let key = &record.key;
    let held = match holder.try_acquire(key, patience * 4).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return setup_failed("holder", LockError::backend("the key was held")),
        Err(e) => return setup_failed("holder", e),
    };
    let opts = AcquireOptions::new(target.ttl * 4).wait(patience * 2);
    let waiter_returned = AtomicBool::new(false);
    let waiter_turn = async {
        let outcome = turn(waiter, &record, CONTENDER, &opts).await;
        waiter_returned.store(true, Ordering::Release);
        outcome
    };
    let fault = async {
        let removal = async {
            queued(&*records, key, 2, patience).await?;
            records.remove_newest_waiter(key).await
        };
        let removed = match removal.await {
            Ok(removed) => removed,
            Err(e) => {
                // Released here, or its lease (4 × patience) would still hold the key
                // when the next run of this target asks for it.
                let _ = holder.release(held).await;
                return Err(e);
            }
        };
        let while_waiting = !waiter_returned.load(Ordering::Acquire);
        let release = async {
            // The next waiter queues behind the holder before it releases.
            let queued = queued(&*records, key, 2, patience).await;
            let _ = holder.release(held).await;
            queued
        };
        let (next, queued) = tokio::join!(turn(next, &record, WITNESS, &opts), release);
        queued?;
        Ok::<_, LockError>((removed.is_some() && while_waiting, next))
    };
    let (_, fault) = tokio::join!(waiter_turn, fault);
    let (fired, next) = match fault {
        Ok(done) => done,
        Err(e) => return setup_failed("removing the waiter's record", e),
    };
    let report = record.history.check();
    let (verdict, note) = match report.fencing_contained() {
        Some(true) => (Verdict::FencedSafe, report.definite.first().map(describe)),
        Some(false) => (Verdict::Unsafe, report.definite.first().map(describe)),
        None => match &next.error {
            None => (Verdict::Safe, None),
            Some(error) => (
                Verdict::Unavail,
                Some(format!("next waiter: {}", short(error))),
            ),
        },
    };
    Trial {
        verdict,
        fired,
        note,
        updates: record.counter.lost(),
    }
}

/// `lock` (recorded as `client`) asks for the trial's key; granted, it works for
/// [`WORK`] under its increment of the counter (written if it still believes) and
/// releases.
async fn turn(
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
    client: usize,
    opts: &AcquireOptions,
) -> Contended {
    let mut outcome = contend_with(lock, record, opts).await;
    if let Some(lease) = outcome.granted.clone() {
        tokio::time::sleep(WORK).await;
        let believes = record.history.believed_at(client, Instant::now());
        if let Some(increment) = outcome.increment.take().filter(|_| believes) {
            let _ = record.counter.write(increment);
        }
        let _ = lock.release(lease).await;
    }
    outcome
}

/// Waits until the servers queue at least `clients` for `key` (the holder counts).
async fn queued(
    records: &dyn WaiterRecords,
    key: &LockKey,
    clients: usize,
    limit: Duration,
) -> Result<(), LockError> {
    let give_up = Instant::now() + limit;
    loop {
        match records.queued(key).await? {
            Some(n) if n >= clients => return Ok(()),
            None => return Err(LockError::backend("the backend counts no queue")),
            Some(n) if Instant::now() >= give_up => {
                return Err(LockError::backend(format!(
                    "{n} queued after {limit:?}, waiting for {clients}"
                )));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
