//! Counting node answers until the outcome is certain, and ordering the requests one
//! owner sends to one node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use tenure_api::{LockError, OwnerId};
use tokio::sync::oneshot;

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

/// Orders the requests of one owner on one node: each request waits until the previous
/// one (request, and the clean-up that belongs to it) has finished — answered or timed
/// out — before it is sent. A late grant therefore cannot overtake the release meant
/// for it, and a failed round's clean-up release cannot delete the next round's grant
/// of the same owner. Entries exist only while requests are in flight.
#[derive(Debug, Default)]
pub(crate) struct Gates {
    tails: Mutex<HashMap<OwnerId, Vec<Option<Tail>>>>,
    next: AtomicU64,
}

/// The last place in one (owner, node) queue: its id and the signal that it finished.
type Tail = (u64, oneshot::Receiver<()>);

/// A place in one (owner, node) queue. Dropping it lets the next request go.
#[derive(Debug)]
pub(crate) struct Ticket {
    gates: Arc<Gates>,
    owner: OwnerId,
    node: usize,
    id: u64,
    previous: Option<oneshot::Receiver<()>>,
    _done: oneshot::Sender<()>,
}

impl Gates {
    /// Takes the next place in the queue of `owner` on `node` (of `nodes`). Synchronous,
    /// so places are handed out in call order.
    pub(crate) fn ticket(self: &Arc<Self>, owner: OwnerId, node: usize, nodes: usize) -> Ticket {
        let (done, waiter) = oneshot::channel();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut tails = self.tails.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = tails
            .entry(owner)
            .or_insert_with(|| (0..nodes).map(|_| None).collect());
        let previous = queue[node].replace((id, waiter)).map(|(_, rx)| rx);
        Ticket {
            gates: self.clone(),
            owner,
            node,
            id,
            previous,
            _done: done,
        }
    }

    #[cfg(test)]
    fn owners(&self) -> usize {
        self.tails
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Ticket {
    /// Whether an earlier request of this owner on this node is still in flight.
    pub(crate) fn is_queued(&self) -> bool {
        self.previous.is_some()
    }

    /// Waits until the previous request of this owner on this node has finished.
    ///
    /// # Cancel safety
    /// Cancel-safe; the place is kept until the ticket is dropped.
    pub(crate) async fn wait_turn(&mut self) {
        if let Some(previous) = self.previous.as_mut() {
            let _ = previous.await; // Err: the previous ticket was dropped, i.e. done
            self.previous = None;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut tails = self
            .gates
            .tails
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = tails.get_mut(&self.owner) {
            if matches!(queue[self.node], Some((id, _)) if id == self.id) {
                queue[self.node] = None;
            }
            if queue.iter().all(Option::is_none) {
                tails.remove(&self.owner);
            }
        }
        // `_done` drops after this, which wakes the next ticket.
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
    async fn tickets_run_in_order_and_leave_nothing_behind() {
        let gates = Arc::new(Gates::default());
        let owner = OwnerId::random();
        let mut first = gates.ticket(owner, 1, 3);
        let mut second = gates.ticket(owner, 1, 3);
        let mut other_node = gates.ticket(owner, 2, 3);
        first.wait_turn().await;
        other_node.wait_turn().await; // independent of node 1
        let waiting = tokio::time::timeout(Duration::from_millis(50), second.wait_turn()).await;
        assert!(waiting.is_err(), "the second request waits for the first");
        drop(first);
        tokio::time::timeout(Duration::from_secs(10), second.wait_turn())
            .await
            .expect("runs once the first is done");
        drop(other_node);
        assert_eq!(gates.owners(), 1);
        drop(second);
        assert_eq!(
            gates.owners(),
            0,
            "no entry is left once nothing is in flight"
        );
    }
}
