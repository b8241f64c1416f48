//! The vanished-queue-record fault's trial cleans up after itself when its setup fails,
//! so a run that follows on the same keys starts from a free key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, Finding, HolderInfo, LockAdmin, LockError, LockKey, MemoryLock};
use tenure_conformance::faults::{self, Cell, Fault, FaultTarget, WaiterRecords};
use tenure_conformance::UrlHarness;

/// A memory lock's queue, whose first count fails as a gRPC call on a loaded host can;
/// it removes no record (the memory lock keeps none a lab can reach).
#[derive(Debug)]
struct FlakyQueue {
    lock: MemoryLock,
    failed_once: AtomicBool,
}

#[async_trait]
impl LockAdmin for FlakyQueue {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        self.lock.holders(prefix).await
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        self.lock.doctor().await
    }

    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        if !self.failed_once.swap(true, Ordering::SeqCst) {
            return Err(LockError::backend("queue count: transport error"));
        }
        LockAdmin::queued(&self.lock, key).await
    }
}

#[async_trait]
impl WaiterRecords for FlakyQueue {
    async fn remove_newest_waiter(&self, _key: &LockKey) -> Result<Option<String>, LockError> {
        Ok(None)
    }
}

fn notes(cell: &Cell) -> Vec<String> {
    match cell {
        Cell::Ran { notes, .. } => notes.clone(),
        other => panic!("the fault did not run: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_whose_queue_count_fails_releases_its_holder() {
    let lock = MemoryLock::new();
    let clients = lock.clone();
    let harness = UrlHarness::new("memory", "memory://", Vec::new(), move |_| {
        let lock = clients.clone();
        async move { Ok::<_, LockError>(lock) }
    });
    let records = Arc::new(FlakyQueue {
        lock: lock.clone(),
        failed_once: AtomicBool::new(false),
    });
    let target = FaultTarget::new("memory", harness, Duration::from_millis(100))
        .await
        .unwrap()
        .with_waiter_records(records.clone());

    let failed = faults::run(Fault::VanishedQueueRecord, &target, 1, 1).await;
    assert!(
        records.failed_once.load(Ordering::SeqCst),
        "the queue count never failed"
    );
    let failed_notes = notes(&failed);
    assert!(
        failed_notes.iter().any(|n| n.contains("transport error")),
        "the first trial did not meet the failed count: {failed_notes:?}"
    );
    let left = lock.holders("tenure-matrix/").await.unwrap();
    assert!(left.is_empty(), "the failed trial left {left:?} held");

    // The same target again: the same keys, which must be free.
    let again = faults::run(Fault::VanishedQueueRecord, &target, 1, 1).await;
    let again_notes = notes(&again);
    assert!(again_notes.is_empty(), "the next trial: {again_notes:?}");
}
