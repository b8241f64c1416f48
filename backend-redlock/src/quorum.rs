//! Counting node answers until the outcome is certain, and queueing an owner's requests
//! to each node behind its earlier ones still in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use tenure_api::{LockError, OwnerId};
use tokio::sync::Notify;

/// What the nodes said so far in one phase (grant, fence, extend or release).
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) nodes: usize,
    pub(crate) quorum: usize,
    /// Granted / still ours / extended / released.
    pub(crate) yes: usize,
    /// Held by another / not ours.
    pub(crate) no: usize,
    /// Retryable failures (unreachable, timed out).
    pub(crate) retryable: usize,
    /// Failures retrying cannot cure (script error, auth, configuration).
    pub(crate) fatal: usize,
    first_fatal: Option<LockError>,
    last_retryable: Option<LockError>,
}

/// The certain outcome of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority said yes.
    Majority,
    /// More nodes failed for good than a majority can spare: retrying cannot succeed.
    Fatal,
    /// A majority can no longer say yes (for now).
    NoMajority,
}

impl Tally {
    pub(crate) fn new(nodes: usize, quorum: usize) -> Self {
        Self {
            nodes,
            quorum,
            yes: 0,
            no: 0,
            retryable: 0,
            fatal: 0,
            first_fatal: None,
            last_retryable: None,
        }
    }

    pub(crate) fn record(&mut self, answer: Result<bool, LockError>) {
        match answer {
            Ok(true) => self.yes += 1,
            Ok(false) => self.no += 1,
            Err(e) if e.is_retryable() => {
                self.retryable += 1;
                self.last_retryable = Some(e);
            }
            Err(e) => {
                self.fatal += 1;
                self.first_fatal.get_or_insert(e);
            }
        }
    }

    /// Nodes that have not answered yet.
    pub(crate) fn pending(&self) -> usize {
        self.nodes
            .saturating_sub(self.yes + self.no + self.retryable + self.fatal)
    }

    /// Nodes that answered the question (yes or no).
    pub(crate) fn answered(&self) -> usize {
        self.yes + self.no
    }

    /// Counts every node still pending as a retryable failure (its task is gone).
    pub(crate) fn abandon_pending(&mut self) {
        self.retryable += self.pending();
    }

    /// The outcome, once no pending answer can change it.
    pub(crate) fn verdict(&self) -> Option<Verdict> {
        if self.yes >= self.quorum {
            Some(Verdict::Majority)
        } else if self.fatal > self.nodes - self.quorum {
            Some(Verdict::Fatal)
        } else if self.yes + self.pending() < self.quorum {
            Some(Verdict::NoMajority)
        } else {
            None
        }
    }

    /// Whether the phase's answer is certain: a verdict and — when no majority can say
    /// yes — also whether a majority said no (the lock is another's: contention, a lost
    /// lease) or a majority cannot answer (an outage). Without the second part, the quick
    /// refusals of a dead minority decided a round on a held lock before the live nodes
    /// said "held", and contention came back as `NoQuorum`.
    pub(crate) fn settled(&self) -> bool {
        match self.verdict() {
            None => false,
            Some(Verdict::NoMajority) => {
                self.answered() >= self.quorum || self.answered() + self.pending() < self.quorum
            }
            Some(_) => true,
        }
    }

    /// The first non-retryable node error (it names its node).
    pub(crate) fn take_fatal(&mut self) -> LockError {
        self.first_fatal
            .take()
            .unwrap_or_else(|| LockError::backend("Redlock: a node failed without an error"))
    }

    /// The last retryable node error, as an error source.
    pub(crate) fn take_retryable(&mut self) -> Option<tenure_api::BoxError> {
        self.last_retryable.take().map(|e| Box::new(e) as _)
    }
}

/// Reads answers into `tally` until `done` says the outcome is certain (or every answer
/// is in); the answers that were values, in arrival order. Answers still in flight are
/// not waited for.
pub(crate) async fn gather<T>(
    mut answers: impl Stream<Item = Result<T, LockError>> + Unpin,
    tally: &mut Tally,
    yes: impl Fn(&T) -> bool,
    done: impl Fn(&Tally) -> bool,
) -> Vec<T> {
    let mut values = Vec::new();
    while !done(tally) {
        match answers.next().await {
            Some(Ok(value)) => {
                tally.record(Ok(yes(&value)));
                values.push(value);
            }
            Some(Err(e)) => tally.record(Err(e)),
            None => {
                tally.abandon_pending();
                break;
            }
        }
    }
    values
}

/// The requests of each owner still in flight, as batches (a round's grants, a release),
/// queued per node: a batch's request to a node waits until the previous batch's request
/// there has finished, answered or timed out. A round's request to a node — its grant,
/// and the clean-up or fence raise that follows it — is the first its owner sends there
/// (every round has an owner id of its own), so a late grant cannot overtake the release
/// meant for it, a round's clean-up cannot land after the release, and a second release
/// lands after the first. The latest batch of an owner is kept only while its requests
/// are in flight, so a release after a settled round waits for nothing. Extensions and
/// the fence round's raises are not queued: both check the owner and never create a key.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    batches: Mutex<HashMap<OwnerId, Arc<Batch>>>,
}

/// One batch of an owner's requests, one per node: which are still in flight, and a signal
/// as each ends.
#[derive(Debug)]
struct Batch {
    busy: Box<[AtomicBool]>,
    finished: Notify,
}

/// A batch's request to one node, in flight until dropped.
#[derive(Debug)]
pub(crate) struct Request {
    in_flight: Arc<InFlight>,
    owner: OwnerId,
    batch: Arc<Batch>,
    node: usize,
}

/// What a batch waits for: the owner's previous batch, if its requests are still
/// in flight, with the nodes where one was when this batch was queued.
#[derive(Debug, Clone)]
pub(crate) struct Behind(Option<(Arc<Batch>, Box<[bool]>)>);

impl InFlight {
    /// Notes a batch of requests of `owner` about to go to each of `nodes` nodes (a
    /// round's grants, or a release), one [`Request`] per node, each in flight until
    /// dropped; and what each must wait for first: the owner's previous batch's request
    /// to the same node, while it is in flight. Synchronous and under one lock, so
    /// batches queue per node in call order: a release asked for once the round has
    /// begun goes behind it, and a second release behind the first (which answers
    /// `Released` where it deletes the key, the second `NotHeld`).
    pub(crate) fn queue(self: &Arc<Self>, owner: OwnerId, nodes: usize) -> (Behind, Vec<Request>) {
        let batch = Arc::new(Batch {
            busy: (0..nodes).map(|_| AtomicBool::new(true)).collect(),
            finished: Notify::new(),
        });
        let previous = self.locked().insert(owner, batch.clone());
        let behind = Behind(previous.map(|previous| {
            let busy = (0..previous.busy.len())
                .map(|i| previous.is_busy(i))
                .collect();
            (previous, busy)
        }));
        let requests = (0..nodes)
            .map(|node| Request {
                in_flight: self.clone(),
                owner,
                batch: batch.clone(),
                node,
            })
            .collect();
        (behind, requests)
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerId, Arc<Batch>>> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn owners(&self) -> usize {
        self.locked().len()
    }
}

impl Behind {
    /// On how many nodes a request of the previous batch was in flight when this one was
    /// queued.
    pub(crate) fn busy(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |(_, busy)| busy.iter().filter(|b| **b).count())
    }

    /// Whether a request of the previous batch was in flight on node `node` when this one
    /// was queued.
    pub(crate) fn was_busy(&self, node: usize) -> bool {
        self.0
            .as_ref()
            .is_some_and(|(_, busy)| busy.get(node) == Some(&true))
    }

    /// Waits until the previous batch's request to node `node` has finished.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub(crate) async fn wait(&self, node: usize) {
        let Some((batch, _)) = &self.0 else { return };
        loop {
            let finished = batch.finished.notified();
            tokio::pin!(finished);
            // Registered before the check, so an end between the two still wakes it.
            finished.as_mut().enable();
            if !batch.is_busy(node) {
                return;
            }
            finished.await;
        }
    }
}

impl Batch {
    fn is_busy(&self, node: usize) -> bool {
        self.busy
            .get(node)
            .is_some_and(|b| b.load(Ordering::SeqCst))
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.batch.busy[self.node].store(false, Ordering::SeqCst);
        self.batch.finished.notify_waiters();
        if self.batch.busy.iter().all(|b| !b.load(Ordering::SeqCst)) {
            let mut batches = self.in_flight.locked();
            if batches
                .get(&self.owner)
                .is_some_and(|r| Arc::ptr_eq(r, &self.batch))
            {
                batches.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn unavailable() -> LockError {
        LockError::Unavailable {
            message: "n1: no reply".into(),
            source: None,
        }
    }

    /// Two dead nodes refuse at once, then the first live node says "held": no majority
    /// can grant any more, but whether this is contention or an outage is not known
    /// until a majority has answered.
    #[test]
    fn quick_refusals_do_not_settle_contention_as_an_outage() {
        let mut t = Tally::new(5, 3);
        t.record(Err(unavailable()));
        t.record(Err(unavailable()));
        t.record(Ok(false));
        assert_eq!(t.verdict(), Some(Verdict::NoMajority));
        assert!(!t.settled(), "two live nodes have yet to answer");
        t.record(Ok(false));
        assert!(!t.settled());
        t.record(Ok(false));
        assert!(t.settled() && t.answered() >= t.quorum, "contention: held");

        let mut t = Tally::new(5, 3);
        t.record(Err(unavailable()));
        t.record(Err(unavailable()));
        t.record(Err(unavailable()));
        assert!(
            t.settled(),
            "an outage is certain once a majority cannot answer"
        );
        let mut t = Tally::new(5, 3);
        for _ in 0..3 {
            t.record(Ok(true));
        }
        assert!(t.settled());
    }

    #[test]
    fn verdicts_come_as_soon_as_they_are_certain() {
        let mut t = Tally::new(5, 3);
        assert_eq!(t.verdict(), None);
        t.record(Ok(true));
        t.record(Ok(true));
        assert_eq!(t.verdict(), None);
        t.record(Ok(true));
        assert_eq!(
            t.verdict(),
            Some(Verdict::Majority),
            "two nodes still pending"
        );

        let mut t = Tally::new(5, 3);
        t.record(Ok(false));
        t.record(Ok(false));
        assert_eq!(t.verdict(), None);
        t.record(Ok(false));
        assert_eq!(t.verdict(), Some(Verdict::NoMajority));

        let mut t = Tally::new(5, 3);
        t.record(Err(LockError::backend("n1: WRONGTYPE")));
        t.record(Err(unavailable()));
        t.record(Err(LockError::Config("n3: auth".into())));
        assert_eq!(
            t.verdict(),
            Some(Verdict::NoMajority),
            "2 fatal of 5: the timeout may heal"
        );
        t.record(Err(LockError::backend("n4: WRONGTYPE")));
        assert_eq!(t.verdict(), Some(Verdict::Fatal));
        assert!(t.take_fatal().to_string().contains("n1"));

        let mut t = Tally::new(5, 3);
        for _ in 0..3 {
            t.record(Err(LockError::backend("script")));
        }
        assert_eq!(
            t.verdict(),
            Some(Verdict::Fatal),
            "a majority failed for good, two pending"
        );
    }

    #[tokio::test]
    async fn batches_queue_per_node_and_nothing_is_left() {
        let in_flight = Arc::new(InFlight::default());
        let owner = OwnerId::random();
        let (nothing, mut round) = in_flight.queue(owner, 3);
        assert_eq!(nothing.busy(), 0, "a fresh owner waits for nothing");
        let (behind_round, mut first) = in_flight.queue(owner, 3);
        assert_eq!(behind_round.busy(), 3);
        drop(round.remove(2));
        assert!(
            behind_round.was_busy(2),
            "in flight when the release was asked for"
        );
        tokio::time::timeout(Duration::from_secs(10), behind_round.wait(2))
            .await
            .expect("node 2's grant has finished");
        let waiting = tokio::time::timeout(Duration::from_millis(50), behind_round.wait(1)).await;
        assert!(waiting.is_err(), "node 1's grant is in flight");
        // A second release queues behind the first, not only behind the round.
        let (behind_first, second) = in_flight.queue(owner, 3);
        assert_eq!(
            behind_first.busy(),
            3,
            "the first release is in flight everywhere"
        );
        drop(round);
        let waiting = tokio::time::timeout(Duration::from_millis(50), behind_first.wait(1)).await;
        assert!(
            waiting.is_err(),
            "the first release's request to node 1 is in flight"
        );
        let wait = tokio::spawn({
            let behind_first = behind_first.clone();
            async move { behind_first.wait(1).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first.remove(1));
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("woken once the first release's request finished")
            .unwrap();
        drop(first);
        assert_eq!(in_flight.owners(), 1, "the second release is in flight");
        drop(second);
        assert_eq!(
            in_flight.owners(),
            0,
            "nothing left once no request is in flight"
        );
    }
}
