//! The fault suite: every fault scenario, written once for every backend, run by
//! `tenure matrix`, by the backends' tests and by any harness (see [`FaultTarget`] for
//! what a harness declares it controls).
//!
//! A trial is one holder/contender pair on a key of its own. The holder takes the lock
//! and starts an increment of a [`Counter`] (reads it); the fault is injected; a
//! contender (a healthy client) asks for the lock, and increments the counter if granted.
//! If the contender is granted the lock while the holder still believes it holds it (or,
//! for a paused holder, before the holder's delayed write), mutual exclusion was
//! violated: the holder then finishes its stale increment, and the verdict says whether
//! fencing rejected it. The counter says what that cost: the updates lost by a store that
//! ignores the tokens, and by one that checks them (Jepsen's lock workload).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tenure_api::{
    AcquireOptions, DistributedLock, ExpiryKind, FencingKind, Lease, LockError, LockExt, LockKey,
    ReleaseOutcome, Replication,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::history::{Report, Violation};
use crate::proxy::ProxyMode;
use crate::servers::redis::RedisReplicaPair;
use crate::servers::Node;
use crate::{retrying, Counter, Harness as _, History, Increment, Link, Links, LostUpdates};
use paused::{paused_holder, Primitive, Stop};

pub mod expect;
mod health;
mod paused;
mod redis;
mod target;
mod vanished;

pub use health::ensure;
pub use target::{leader_of, FaultTarget, LeaderFn, PeerLinks, RedisKeyFn, WaiterRecords};

type Target = FaultTarget;

/// A fault the matrix injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The holder's process stops (GC pause, SIGSTOP) past its TTL, then writes.
    PausedHolder,
    /// As [`PausedHolder`](Self::PausedHolder), for the holder of a permit of a
    /// two-permit [`Semaphore`](tenure_api::Semaphore) whose other permit is held
    /// throughout.
    PausedPermitHolder,
    /// As [`PausedHolder`](Self::PausedHolder), for an
    /// [`Election`](tenure_api::Election)'s leader; the contender campaigns.
    PausedLeader,
    /// The holder's machine is suspended past its TTL (a laptop's sleep, a VM suspended
    /// through its guest): its monotonic clock stands still while the servers' run on;
    /// on waking it checks its guard before it writes.
    ClientSuspend,
    /// The server's replies to the holder arrive late: to its acquire, after the TTL; in
    /// every other trial, to its release, after the lease's remaining TTL.
    DelayedReply,
    /// The server's wall clock jumps forward by twice the holders' lease TTL (see
    /// `clock_jump_ttl`) plus a second.
    ClockJump,
    /// The server holding the lock crashes and restarts (Redis: without persistence).
    Restart,
    /// A waiter's own queue record (an etcd key, a ZooKeeper node) is removed on the
    /// servers while it waits, its session left alive (an operator's delete, or what a
    /// suspended waiter finds on waking); a next waiter queues behind the holder, which
    /// then releases.
    VanishedQueueRecord,
    /// The holder's links are black-holed past the TTL.
    Blackhole,
    /// The holder's client↔server connections are reset (RST), and new ones too.
    ConnectionCut,
    /// ⌊(n−1)/2⌋ of n servers are killed.
    MinorityLoss,
    /// One server (the leader, where there is one) is frozen with SIGSTOP.
    ServerPause,
    /// Redis fails over to an asynchronous replica that missed the grant.
    ReplicaFailover,
    /// The acquire request reaches the server but its reply is lost.
    LostReply,
    /// The holder is partitioned into a minority of the servers: ZooKeeper, the follower
    /// it talks to is cut off from the other members; Redlock, its links to a majority of
    /// the masters are black-holed.
    MinorityPartition,
    /// A Sentinel-managed primary (two replicas, three sentinels) dies while its replicas
    /// are behind (frozen, their links closed): the sentinels promote one, and the
    /// contender asks the new primary.
    SentinelFailover,
    /// [`SentinelFailover`](Self::SentinelFailover) with `?wait_replicas=1`.
    SentinelFailoverConfirmed,
    /// [`SentinelFailoverConfirmed`](Self::SentinelFailoverConfirmed), but one replica
    /// stays in step and confirms every grant, then dies with the primary (and restarts
    /// empty): the sentinels promote the other, which missed the grants.
    SentinelConfirmingReplicaLost,
    /// A Redis Cluster primary (of three, a replica each) dies while the replica of the
    /// trials' slots is behind: the cluster promotes it, and the contender asks it.
    ClusterFailover,
    /// [`ClusterFailover`](Self::ClusterFailover) with `?wait_replicas=1`.
    ClusterFailoverConfirmed,
    /// The holder's connections stall (what it sends arrives [`STALL`] late) as it
    /// acquires: its first request gives up, it is granted over a fresh connection, and
    /// the stalled requests (the first attempt, its clean-up) land after that grant.
    StaleAcquire,
    /// The holder's connections stall as it extends its lease by one TTL: it gives up
    /// and extends by the stall plus four TTLs over a fresh connection, and the short
    /// extension lands after.
    StaleExtend,
    /// The holder's connections stall as it releases: it gives up, is granted the lock
    /// again over a fresh connection once its lease expired, and the stalled release
    /// lands after that grant.
    StaleRelease,
}

/// How late a stalled connection delivers what its client sends: longer than any
/// request timeout of the fault clients (300–500 ms), so that the client gives up and
/// carries on over a fresh connection first.
pub const STALL: Duration = Duration::from_millis(1500);

impl Fault {
    /// Every fault, in matrix order.
    pub const ALL: [Fault; 23] = [
        Fault::PausedHolder,
        Fault::PausedPermitHolder,
        Fault::PausedLeader,
        Fault::ClientSuspend,
        Fault::DelayedReply,
        Fault::ClockJump,
        Fault::Restart,
        Fault::Blackhole,
        Fault::ConnectionCut,
        Fault::MinorityLoss,
        Fault::ServerPause,
        Fault::ReplicaFailover,
        Fault::SentinelFailover,
        Fault::SentinelFailoverConfirmed,
        Fault::SentinelConfirmingReplicaLost,
        Fault::ClusterFailover,
        Fault::ClusterFailoverConfirmed,
        Fault::LostReply,
        Fault::MinorityPartition,
        Fault::StaleAcquire,
        Fault::StaleExtend,
        Fault::StaleRelease,
        Fault::VanishedQueueRecord,
    ];

    /// The fault's name in matrix.json and on the command line (`paused-holder`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::PausedHolder => "paused-holder",
            Fault::PausedPermitHolder => "paused-permit-holder",
            Fault::PausedLeader => "paused-leader",
            Fault::ClientSuspend => "client-suspend",
            Fault::DelayedReply => "delayed-reply",
            Fault::ClockJump => "clock-jump",
            Fault::Restart => "restart",
            Fault::Blackhole => "blackhole",
            Fault::ConnectionCut => "connection-cut",
            Fault::MinorityLoss => "minority-loss",
            Fault::ServerPause => "server-pause",
            Fault::ReplicaFailover => "replica-failover",
            Fault::LostReply => "lost-reply",
            Fault::MinorityPartition => "minority-partition",
            Fault::SentinelFailover => "sentinel-failover",
            Fault::SentinelFailoverConfirmed => "sentinel-failover-confirmed",
            Fault::SentinelConfirmingReplicaLost => "sentinel-confirming-replica-lost",
            Fault::ClusterFailover => "cluster-failover",
            Fault::ClusterFailoverConfirmed => "cluster-failover-confirmed",
            Fault::StaleAcquire => "stale-acquire",
            Fault::StaleExtend => "stale-extend",
            Fault::StaleRelease => "stale-release",
            Fault::VanishedQueueRecord => "vanished-queue-record",
        }
    }

    /// Short title for tables.
    pub fn title(self) -> &'static str {
        match self {
            Fault::PausedHolder => "holder paused past TTL",
            Fault::PausedPermitHolder => "semaphore: holder paused past TTL",
            Fault::PausedLeader => "election: leader paused past TTL",
            Fault::ClientSuspend => "holder's machine suspended past TTL",
            Fault::DelayedReply => "delayed replies",
            Fault::ClockJump => "server clock jump",
            Fault::Restart => "restart (Redis: no persistence)",
            Fault::Blackhole => "client↔server blackhole",
            Fault::ConnectionCut => "holder's connection cut",
            Fault::MinorityLoss => "minority node loss",
            Fault::ServerPause => "server SIGSTOP",
            Fault::ReplicaFailover => "failover to async replica",
            Fault::LostReply => "acquire with lost reply",
            Fault::MinorityPartition => "holder partitioned into a minority",
            Fault::SentinelFailover => "Sentinel failover, replicas behind",
            Fault::SentinelFailoverConfirmed => {
                "Sentinel failover, replicas behind, wait_replicas=1"
            }
            Fault::SentinelConfirmingReplicaLost => {
                "Sentinel failover, wait_replicas=1, the confirming replica lost too"
            }
            Fault::ClusterFailover => "Cluster failover, replica behind",
            Fault::ClusterFailoverConfirmed => "Cluster failover, replica behind, wait_replicas=1",
            Fault::StaleAcquire => "stale request: acquire lands after the retry's grant",
            Fault::StaleExtend => "stale request: a short extend lands after a long one",
            Fault::StaleRelease => "stale request: release lands after the next grant",
            Fault::VanishedQueueRecord => "a waiter's queue record removed on the server",
        }
    }

    /// Whether the fault hits servers (injected in rounds, several pairs per round) rather
    /// than one client's links (injected per trial, all trials at once).
    pub fn is_server_fault(self) -> bool {
        matches!(
            self,
            Fault::ClockJump
                | Fault::Restart
                | Fault::MinorityLoss
                | Fault::ServerPause
                | Fault::ReplicaFailover
                | Fault::MinorityPartition
                | Fault::SentinelFailover
                | Fault::SentinelFailoverConfirmed
                | Fault::SentinelConfirmingReplicaLost
                | Fault::ClusterFailover
                | Fault::ClusterFailoverConfirmed
        )
    }

    /// Whether the fault fails a Redis primary over to a replica that missed grants, on
    /// servers each round starts.
    pub fn is_replica_failover(self) -> bool {
        self == Fault::ReplicaFailover || self.is_topology_failover()
    }

    /// Whether the fault is a real failover of Redis as people run it (Sentinel,
    /// Cluster), on servers each round starts.
    pub fn is_topology_failover(self) -> bool {
        matches!(
            self,
            Fault::SentinelFailover
                | Fault::SentinelFailoverConfirmed
                | Fault::SentinelConfirmingReplicaLost
                | Fault::ClusterFailover
                | Fault::ClusterFailoverConfirmed
        )
    }
}

/// The outcome of one trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Verdict {
    /// Mutual exclusion held.
    #[serde(rename = "SAFE")]
    Safe,
    /// Two holders, and fencing rejected the stale holder's write.
    #[serde(rename = "F-SAFE")]
    FencedSafe,
    /// Two holders (or a regressed token), and fencing did not contain it.
    #[serde(rename = "UNSAFE")]
    Unsafe,
    /// No violation, but a healthy client could not get the lock.
    #[serde(rename = "UNAVAIL")]
    Unavail,
}

impl Verdict {
    /// The label used in reports.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Safe => "SAFE",
            Verdict::FencedSafe => "F-SAFE",
            Verdict::Unsafe => "UNSAFE",
            Verdict::Unavail => "UNAVAIL",
        }
    }
}

/// One trial's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial {
    /// The verdict.
    pub verdict: Verdict,
    /// Whether there is evidence that the fault took effect in this trial.
    pub fired: bool,
    /// What was observed, when worth saying.
    pub note: Option<String>,
    /// The trial's counter increments, and those lost with and without fencing.
    pub updates: LostUpdates,
}

/// A cell of the matrix: one backend under one fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Cell {
    /// The fault was injected.
    Ran {
        /// Trials per verdict (only trials where the fault fired).
        counts: BTreeMap<Verdict, usize>,
        /// Trials run.
        trials: usize,
        /// Separate injections of the fault (server faults inject once per round).
        injections: usize,
        /// Trials where there was no evidence the fault fired (not counted above).
        not_fired: usize,
        /// Whether fencing contained every violation observed (`None`: none observed).
        fencing_contained: Option<bool>,
        /// The counter increments of the trials counted above, and those lost.
        updates: LostUpdates,
        /// Distinct observations, for the report.
        notes: Vec<String>,
    },
    /// This setup cannot inject the fault.
    NotInjectable {
        /// Why.
        reason: String,
    },
    /// The fault does not apply to this backend's design.
    NotApplicable {
        /// Why.
        reason: String,
    },
    /// Not run: the backend could not be brought back to health before the cell (a server
    /// down that did not restart, one that does not answer, no lock granted).
    Unhealthy {
        /// What is wrong.
        reason: String,
    },
}

impl Cell {
    /// Whether the fault fired in some trial: a cell that ran with evidence of it in no
    /// trial judged nothing. True for cells that ran no trials (not injectable, not
    /// applicable, failed).
    pub fn judged(&self) -> bool {
        match self {
            Cell::Ran { counts, .. } => counts.values().sum::<usize>() > 0,
            _ => true,
        }
    }

    /// Aggregates trials.
    pub fn from_trials(trials: Vec<Trial>, injections: usize) -> Cell {
        let mut counts = BTreeMap::new();
        let mut notes: Vec<String> = Vec::new();
        let mut not_fired = 0;
        let mut updates = LostUpdates::default();
        for trial in &trials {
            if trial.fired {
                *counts.entry(trial.verdict).or_insert(0) += 1;
                updates += trial.updates;
            } else {
                not_fired += 1;
            }
            if let Some(note) = &trial.note {
                if !notes.contains(note) && notes.len() < 4 {
                    notes.push(note.clone());
                }
            }
        }
        Cell::Ran {
            fencing_contained: contained(&counts),
            counts,
            trials: trials.len(),
            injections,
            not_fired,
            updates,
            notes,
        }
    }

    /// This cell and `later`, another run of the same fault, as one: trials, injections,
    /// verdicts and updates added up. A run that did not happen (an unhealthy backend)
    /// leaves its reason in the notes of one that did.
    pub fn merge(self, later: Cell) -> Cell {
        match (self, later) {
            (
                Cell::Ran {
                    mut counts,
                    trials,
                    injections,
                    not_fired,
                    mut updates,
                    notes,
                    ..
                },
                Cell::Ran {
                    counts: more_counts,
                    trials: more_trials,
                    injections: more_injections,
                    not_fired: more_not_fired,
                    updates: more_updates,
                    notes: more_notes,
                    ..
                },
            ) => {
                let more_unsafe = more_counts.contains_key(&Verdict::Unsafe);
                for (verdict, n) in more_counts {
                    *counts.entry(verdict).or_insert(0) += n;
                }
                updates += more_updates;
                // The notes of a run that saw an uncontained violation come first: they
                // say what happened, and must not be crowded out by earlier runs'.
                let (first, then) = match more_unsafe {
                    true => (more_notes, notes),
                    false => (notes, more_notes),
                };
                let mut notes: Vec<String> = Vec::new();
                for note in first.into_iter().chain(then) {
                    if !notes.contains(&note) && notes.len() < MERGED_NOTES {
                        notes.push(note);
                    }
                }
                Cell::Ran {
                    fencing_contained: contained(&counts),
                    counts,
                    trials: trials + more_trials,
                    injections: injections + more_injections,
                    not_fired: not_fired + more_not_fired,
                    updates,
                    notes,
                }
            }
            (ran @ Cell::Ran { .. }, other) | (other, ran @ Cell::Ran { .. }) => {
                let mut ran = ran;
                if let (Cell::Ran { notes, .. }, Some(reason)) = (&mut ran, other.reason()) {
                    let note = format!("{}: {reason}", other.summary());
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                ran
            }
            (_, later) => later,
        }
    }

    /// Whether the cell's lost updates agree with its verdicts: an update is lost only
    /// where two clients held at once (`F-SAFE`, `UNSAFE`), and the fenced store loses
    /// one only where fencing did not contain it (`UNSAFE`). A holder paused past its TTL
    /// (`fault` one of the paused ones) writes once it wakes, after the contender's
    /// write: where every trial counted held twice, each wrote twice and lost one update
    /// in the store that ignores tokens (Jepsen's lock workload). The reason, if they
    /// disagree.
    pub fn check_updates(&self, fault: Fault) -> Result<(), String> {
        let Cell::Ran {
            counts, updates, ..
        } = self
        else {
            return Ok(());
        };
        let count = |verdict| counts.get(&verdict).copied().unwrap_or(0) as u64;
        let counted: u64 = counts.values().map(|&n| n as u64).sum();
        let held_twice = count(Verdict::FencedSafe) + count(Verdict::Unsafe);
        let summary = self.summary();
        if held_twice == 0 && updates.unfenced > 0 {
            return Err(format!(
                "{summary}, yet the plain store lost {} updates: {updates:?}",
                updates.unfenced
            ));
        }
        if count(Verdict::Unsafe) == 0 && updates.fenced > 0 {
            return Err(format!(
                "{summary}, yet the fenced store lost {} updates: {updates:?}",
                updates.fenced
            ));
        }
        let paused = matches!(
            fault,
            Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader
        );
        // Only where every counted trial was a double grant: a contender never granted
        // (UNAVAIL, allowed by `never_unsafe`) leaves the holder's one write alone.
        let all_twice = held_twice == counted;
        if paused && all_twice && (updates.updates != 2 * counted || updates.unfenced != counted) {
            return Err(format!(
                "{summary}: each paused holder writes once after the contender, losing one \
                 update in the plain store; counted {updates:?}"
            ));
        }
        Ok(())
    }

    /// Why the cell did not run (`None` if it ran).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Cell::Ran { .. } => None,
            Cell::NotInjectable { reason }
            | Cell::NotApplicable { reason }
            | Cell::Unhealthy { reason } => Some(reason),
        }
    }

    /// The verdicts observed (empty unless it ran).
    pub fn verdicts(&self) -> Vec<Verdict> {
        match self {
            Cell::Ran { counts, .. } => counts.keys().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// A short summary: `SAFE 20`, `F-SAFE 18 · UNSAFE 2`, `not injectable`.
    pub fn summary(&self) -> String {
        match self {
            Cell::Ran {
                counts, not_fired, ..
            } => {
                let mut parts: Vec<String> = counts
                    .iter()
                    .map(|(v, n)| format!("{} {n}", v.label()))
                    .collect();
                if *not_fired > 0 {
                    parts.push(format!("not fired {not_fired}"));
                }
                if parts.is_empty() {
                    // Only a soak's fault that was never drawn has no trials.
                    "not drawn".into()
                } else {
                    parts.join(" · ")
                }
            }
            Cell::NotInjectable { .. } => "not injectable".into(),
            Cell::NotApplicable { .. } => "n/a".into(),
            Cell::Unhealthy { .. } => "unhealthy".into(),
        }
    }
}

/// The most distinct notes a merged cell keeps.
const MERGED_NOTES: usize = 8;

/// Whether fencing contained every violation counted (`None`: none counted).
fn contained(counts: &BTreeMap<Verdict, usize>) -> Option<bool> {
    let violations = |v| counts.get(&v).copied().unwrap_or(0);
    match (violations(Verdict::FencedSafe), violations(Verdict::Unsafe)) {
        (0, 0) => None,
        (_, 0) => Some(true),
        _ => Some(false),
    }
}

/// The clients of a trial, as its history records them.
const HOLDER: usize = 0;
const CONTENDER: usize = 1;
const WITNESS: usize = 2;

/// What a trial records: every grant, renewal, release and loss of its clients on one
/// clock, and a counter the holder and the contender increment with their tokens.
struct Record {
    history: History,
    counter: Arc<Counter>,
    key: LockKey,
    /// The witness's client, made before the fault (a fresh one of the target when the
    /// witness asks, if none).
    witness: Option<Arc<dyn DistributedLock>>,
}

impl Record {
    fn new(key: LockKey) -> Self {
        Self {
            history: History::new(),
            counter: Arc::new(Counter::new()),
            key,
            witness: None,
        }
    }

    /// `lock`, recorded as `client`.
    fn client(&self, client: usize, lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        self.history.recorded(client, lock)
    }

    /// Judges the trial. Each client's increment of the counter spans its work: read when
    /// granted, written when the work ends if the client still believes it holds the
    /// lock. The holder writes first, if it believed it held the lock when the contender
    /// was granted (it checked then, and wrote later) or still believes; then it ends; a
    /// witness asks for the lock while the contender still holds it (and increments at
    /// once if granted); the contender writes last and releases. Then the checker examines every hold the history recorded, on intervals:
    /// any two clients' believed holds that overlap are a double grant (F-SAFE when
    /// their tokens let a fence reject the stale one, else UNSAFE), as are a duplicate or
    /// regressed token and a belief past what the server promised (UNSAFE).
    async fn judge(
        &self,
        target: &Target,
        holder: Holder,
        contender: &Arc<dyn DistributedLock>,
        mut outcome: Contended,
        fired: bool,
    ) -> Trial {
        let holder_believed = self.history.believed_at(HOLDER, outcome.at);
        let mut holder = holder;
        let writes = holder_believed || self.history.believed_at(HOLDER, Instant::now());
        if let Some(increment) = holder.increment.take().filter(|_| writes) {
            let _ = self.counter.write(increment);
        }
        let stale_write = holder.stale_write;
        let limit = patience(target);
        let mut stuck = None;
        let granted = match tokio::time::timeout(limit, holder.finish()).await {
            Ok(granted) => granted,
            Err(_) => {
                stuck = Some("the holder's release did not return");
                None
            }
        };
        if let Some(lease) = outcome.granted.clone() {
            let increment = outcome.increment.take();
            let after_takeover = async {
                self.witness(target).await;
                // Like every client, it checks its lease before it writes.
                let believes = self.history.believed_at(CONTENDER, Instant::now());
                if let Some(increment) = increment.filter(|_| believes) {
                    let _ = self.counter.write(increment);
                }
                let _ = contender.release(lease).await;
                if let Some((lock, stale)) = granted {
                    stale_extend(target, &lock, stale).await;
                }
            };
            if tokio::time::timeout(limit * 2, after_takeover)
                .await
                .is_err()
            {
                stuck = Some("the witness, the contender's release or the stale extend hung");
            }
        }
        let report = self.history.check();
        let (verdict, note) = verdict(&report, &outcome, stale_write, holder_believed);
        Trial {
            verdict,
            fired,
            note: note.or(stuck.map(String::from)),
            updates: self.counter.lost(),
        }
    }

    /// A third client asks once for the lock the contender holds: a grant is a double
    /// grant the checker sees (a release that freed someone else's lock, a shared value).
    /// Granted, it increments the counter at once, inside the contender's increment.
    async fn witness(&self, target: &Target) {
        let client = match &self.witness {
            Some(client) => client.clone(),
            None => match target.client().await {
                Ok(client) => client,
                Err(_) => return,
            },
        };
        let witness = self.client(WITNESS, client);
        if let Ok(Some(lease)) = witness.try_acquire(&self.key, target.ttl).await {
            let _ = self.counter.increment(lease.token());
            let _ = witness.release(lease).await;
        }
    }
}

/// The holder tries once to extend the lease the contender has since taken and given
/// back (retrying only while its connection recovers from the fault): a correct backend
/// refuses; a success tells the holder it held all along, and the checker sees its hold
/// span the contender's.
async fn stale_extend(target: &Target, lock: &Arc<dyn DistributedLock>, mut stale: Lease) {
    let give_up = Instant::now() + patience(target);
    loop {
        match lock.extend(&mut stale, target.ttl).await {
            Ok(()) => {
                let _ = lock.release(stale).await;
                return;
            }
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return,
        }
    }
}

/// The verdict on a trial from the checker's report, the contender's outcome and, for a
/// paused holder, whether its write after waking was accepted by the fenced store.
fn verdict(
    report: &Report,
    outcome: &Contended,
    stale_write: Option<bool>,
    holder_believed: bool,
) -> (Verdict, Option<String>) {
    let granted = outcome.granted.is_some();
    // A holder frozen between its check and its write writes after the takeover.
    let stale = stale_write.filter(|_| granted);
    let mut contained = report.fencing_contained();
    if let Some(accepted) = stale {
        contained = Some(contained.unwrap_or(true) && !accepted);
    }
    let note = report.definite.first().map(describe).or(match stale {
        Some(true) => Some("the woken holder's write after the takeover was accepted".into()),
        Some(false) => Some("the woken holder's write after the takeover was fenced off".into()),
        None => None,
    });
    match contained {
        Some(true) => return (Verdict::FencedSafe, note),
        Some(false) => return (Verdict::Unsafe, note),
        None => {}
    }
    match &outcome.error {
        _ if granted => (Verdict::Safe, None),
        // Still held by the holder: that is mutual exclusion working.
        Some(LockError::Timeout { .. }) if holder_believed => (Verdict::Safe, None),
        Some(LockError::Timeout { .. }) => (
            Verdict::Unavail,
            Some("the lock stayed held after its holder lost it".into()),
        ),
        Some(error) => (Verdict::Unavail, Some(short(error))),
        None => (Verdict::Unavail, None),
    }
}

/// A violation in a few words, without the times that make every note distinct.
fn describe(violation: &Violation) -> String {
    let who = |client: usize| match client {
        HOLDER => "holder",
        CONTENDER => "contender",
        WITNESS => "witness",
        _ => "client",
    };
    match violation {
        Violation::Overlap { first, second } => format!(
            "checker: {} and {} held at once; {}",
            who(first.client),
            who(second.client),
            if first.token == second.token {
                "same token: no fence can tell them apart"
            } else {
                "the stale write was fenced off"
            }
        ),
        Violation::DuplicateToken { .. } => "checker: a token was issued twice".into(),
        Violation::TokenRegressed { earlier, later } => format!(
            "fence regressed: token {} after {}",
            later.token, earlier.token
        ),
        Violation::BelievedPastPromise { hold } => format!(
            "checker: the {} believed its lease past the TTL its server promised",
            who(hold.client)
        ),
    }
}

/// The holder of a trial.
struct Holder {
    lock: Arc<dyn DistributedLock>,
    ending: Ending,
    /// Its increment of the trial's counter, read when it was granted.
    increment: Option<Increment>,
    /// For a paused holder: whether its write after waking was accepted.
    stale_write: Option<bool>,
}

impl Holder {
    /// Until when it believes it holds the lock, as far as its lease says (now for a
    /// guard, which may learn of a loss at any time, or for no lease).
    fn believed_until(&self) -> Instant {
        match &self.ending {
            Ending::Lease(lease) => lease.valid_until(),
            Ending::Guard(..) | Ending::Nothing => Instant::now(),
        }
    }

    /// A holder that has nothing to write when its work ends.
    fn idle(lock: Arc<dyn DistributedLock>, ending: Ending) -> Self {
        Self {
            lock,
            ending,
            increment: None,
            stale_write: None,
        }
    }
}

/// How the holder's part of a trial ends.
enum Ending {
    /// A renewing guard, watched by a task that records its loss (the holder stops
    /// believing then) and releases when told at the end of the trial, like an
    /// application whose work ends after it learned of the loss.
    Guard(oneshot::Sender<()>, JoinHandle<()>, Option<Lease>),
    /// A bare lease, released at the end of the trial.
    Lease(Lease),
    /// Nothing left to release.
    Nothing,
}

impl Holder {
    /// Ends the trial for the holder: releases what it may still hold. Returns the lease
    /// it was granted, with its client, for the stale-extend probe.
    async fn finish(self) -> Option<(Arc<dyn DistributedLock>, Lease)> {
        let granted = match self.ending {
            Ending::Guard(done, task, granted) => {
                let _ = done.send(());
                let _ = task.await;
                granted
            }
            Ending::Lease(lease) => {
                let _ = self.lock.release(lease.clone()).await;
                Some(lease)
            }
            Ending::Nothing => None,
        };
        granted.map(|lease| (self.lock, lease))
    }
}

/// What the contender got, and when its call returned.
struct Contended {
    at: Instant,
    granted: Option<Lease>,
    error: Option<LockError>,
    /// Its increment of the trial's counter, read when it was granted.
    increment: Option<Increment>,
}

/// Asks for the trial's key with `lock` (the contender, recorded), waiting up to
/// [`patience`]; if granted, starts its increment of the trial's counter at once (it
/// writes when its work ends, see [`Record::judge`]). It takes a lease longer than the
/// holder's, so that the witness asks while it still holds.
async fn contend(target: &Target, lock: &Arc<dyn DistributedLock>, record: &Record) -> Contended {
    contend_for(target, lock, record, target.ttl * 4).await
}

/// [`contend`] with a lease of `ttl`.
async fn contend_for(
    target: &Target,
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
    ttl: Duration,
) -> Contended {
    contend_with(
        lock,
        record,
        &AcquireOptions::new(ttl).wait(patience(target)),
    )
    .await
}

/// [`contend`] with these options.
async fn contend_with(
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
    opts: &AcquireOptions,
) -> Contended {
    let result = lock.acquire(&record.key, opts).await;
    let at = Instant::now();
    match result {
        Ok(lease) => Contended {
            at,
            increment: Some(record.counter.read(lease.token())),
            granted: Some(lease),
            error: None,
        },
        Err(error) => Contended {
            at,
            granted: None,
            error: Some(error),
            increment: None,
        },
    }
}

fn short(error: &LockError) -> String {
    let text = error.to_string();
    match text.char_indices().nth(90) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// Takes the trial's key for its holder (`lock`, recorded), with a renewing guard or as a
/// bare lease, and starts its increment.
async fn hold(
    record: &Record,
    lock: Arc<dyn DistributedLock>,
    ttl: Duration,
    guard: bool,
) -> Result<Holder, LockError> {
    let lock = record.client(HOLDER, lock);
    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
    let (token, ending) = if guard {
        let guard = lock.lock(&record.key, &opts).await?;
        let token = guard.fencing_token();
        let granted = guard.lease().await;
        let (done, finished) = oneshot::channel();
        let history = record.history.clone();
        let task = tokio::spawn(async move {
            let mut finished = finished;
            let ended = tokio::select! {
                _ = guard.lost() => {
                    history.lost(HOLDER, Instant::now());
                    false
                }
                _ = &mut finished => true,
            };
            // It stops believing at the loss, but releases when its work ends with the
            // trial (after any takeover): a release that frees another client's lock is
            // then the witness's to see.
            if !ended {
                let _ = finished.await;
            }
            let _ = guard.release().await;
        });
        (token, Ending::Guard(done, task, granted))
    } else {
        let lease = lock.acquire(&record.key, &opts).await?;
        (lease.token(), Ending::Lease(lease))
    };
    Ok(Holder {
        lock,
        ending,
        increment: Some(record.counter.read(token)),
        stale_write: None,
    })
}

/// A trial that could not be set up (a client or the holder's lock failed before any
/// fault): counted as not fired, with the reason in the notes.
fn setup_failed(what: &str, error: LockError) -> Trial {
    Trial {
        verdict: Verdict::Unavail,
        fired: false,
        note: Some(format!("{what}: {}", short(&error))),
        updates: LostUpdates::default(),
    }
}

/// A round that could not be set up: each of its `pairs` trials counts as not fired (so a
/// cell keeps its number of trials).
fn round_failed(pairs: usize, what: &str, error: LockError) -> Vec<Trial> {
    vec![setup_failed(what, error); pairs]
}

/// How long a contender waits: past any TTL or session expiry in play.
fn patience(target: &Target) -> Duration {
    target.ttl * 4 + Duration::from_secs(3)
}

/// Runs `trials` trials of `fault` against `target`.
///
/// # Cancel safety
/// Dropping it abandons the trials; their locks expire and faults stay injected until the
/// servers are dropped.
pub async fn run(fault: Fault, target: &Target, trials: usize, rounds: usize) -> Cell {
    if let Some(cell) = applicability(fault, target) {
        return cell;
    }
    if !fault.is_server_fault() {
        let all = futures::future::join_all((0..trials).map(|i| client_trial(fault, target, i)));
        return Cell::from_trials(all.await, trials);
    }
    let rounds = rounds.clamp(1, trials.max(1));
    let mut results = Vec::with_capacity(trials);
    let mut injections = 0;
    for round in 0..rounds {
        let pairs = trials / rounds + usize::from(round < trials % rounds);
        if pairs == 0 {
            continue;
        }
        injections += 1;
        results.extend(server_round(fault, target, round, pairs).await);
    }
    Cell::from_trials(results, injections)
}

/// Why `fault` cannot run on `target`, if it cannot: the cell to report instead.
pub fn applicability(fault: Fault, target: &Target) -> Option<Cell> {
    let backend = target.caps.backend;
    let not_injectable = |reason: &str| {
        Some(Cell::NotInjectable {
            reason: reason.into(),
        })
    };
    let no_process = target.nodes.is_empty() && fault.is_server_fault();
    // Client faults run on a client whose every server link passes through a proxy.
    let no_links = !fault.is_server_fault() && !target.harness.can_cut_links();
    match fault {
        _ if no_process => not_injectable("no process control over these servers"),
        _ if no_links => not_injectable("the harness cannot put a client's links behind proxies"),
        Fault::ClockJump if !target.clock_shim => not_injectable(match backend {
            "etcd" | "zk" => "the clock shim cannot shift Go or JVM clocks",
            "postgres" => "the harness runs no clock shim under postgres",
            _ => "servers not started under the clock shim",
        }),
        Fault::PausedLeader if target.caps.fencing == FencingKind::None => {
            Some(Cell::NotApplicable {
                reason: "no fencing tokens, so no terms: Election refuses this configuration"
                    .into(),
            })
        }
        Fault::MinorityLoss if target.nodes.len() < 3 => Some(Cell::NotApplicable {
            reason: "a single node has no minority to lose".into(),
        }),
        _ if fault.is_replica_failover() => {
            let redis = target.redis_key.is_some();
            match target.caps.replication {
                _ if redis && target.secured => not_injectable(if fault.is_topology_failover() {
                    "the harness starts its Sentinel and Cluster groups without TLS and ACL users"
                } else {
                    "the harness's primary-replica pair does not run with TLS and ACL users"
                }),
                _ if redis => None,
                _ if backend == "redis" => {
                    not_injectable("the harness declares no Redis deployments of this backend")
                }
                _ if fault.is_topology_failover() => Some(Cell::NotApplicable {
                    reason: "a failover of a Redis deployment".into(),
                }),
                Replication::IndependentQuorum { .. } => Some(Cell::NotApplicable {
                    reason: "independent masters without replicas".into(),
                }),
                Replication::Consensus { .. } => Some(Cell::NotApplicable {
                    reason: "replication is synchronous consensus".into(),
                }),
                _ => not_injectable("the harness starts no replica for this backend"),
            }
        }
        Fault::StaleAcquire | Fault::StaleExtend | Fault::StaleRelease => match backend {
            "etcd" => not_injectable(
                "the etcd client sends every request over one HTTP/2 connection per \
                 endpoint and keeps it: a stalled connection holds up its later requests \
                 (the lease's keep-alive too), so it never moves on before the stalled \
                 ones land",
            ),
            "zk" => not_injectable(
                "a ZooKeeper session has one connection: the client moves on only by \
                 reconnecting the session, and the server closes the stalled connection \
                 with it",
            ),
            "postgres" => not_injectable(
                "a Postgres lock is its session's transaction: the client cannot move a \
                 held lock to a fresh connection, and gives up a stalled connection with \
                 what it was doing",
            ),
            _ => None,
        },
        Fault::VanishedQueueRecord if target.waiter_records.is_none() => match backend {
            "redis" | "redlock" => Some(Cell::NotApplicable {
                reason: "waiters keep no record on the servers: they retry when woken".into(),
            }),
            "postgres" => Some(Cell::NotApplicable {
                reason: "a waiter's place is its lock wait inside the server, which only \
                         ending its session removes (the connection-cut cell)"
                    .into(),
            }),
            _ => not_injectable("the harness declares no way to remove a waiter's record"),
        },
        Fault::MinorityPartition => match target.caps.replication {
            Replication::SingleNode => Some(Cell::NotApplicable {
                reason: "one server: no minority side".into(),
            }),
            _ if target.nodes.len() < 3 => Some(Cell::NotApplicable {
                reason: "fewer than three servers: no minority side".into(),
            }),
            Replication::IndependentQuorum { .. } => None,
            // The holder's follower is cut off from the leader's side: which is which
            // must be known.
            _ if target.peer_links.is_some() && target.leader.is_some() => None,
            _ if target.peer_links.is_some() => {
                not_injectable("member links declared, but no way to find the leader")
            }
            _ if backend == "etcd" => not_injectable(
                "the harness has no control over the links between etcd members (its \
                 members reach each other directly)",
            ),
            _ => not_injectable("no control over the links between the members"),
        },
        _ => None,
    }
}

/// What a trial on one holder's links works with.
struct ClientTrial<'a> {
    target: &'a Target,
    /// The holder's client, reaching every server through its own proxies.
    lock: Arc<dyn DistributedLock>,
    links: Links,
    /// A healthy client, recorded.
    contender: Arc<dyn DistributedLock>,
    record: Record,
}

/// One trial of a fault on the holder's own links.
async fn client_trial(fault: Fault, target: &Target, index: usize) -> Trial {
    let mut record = Record::new(target.key(fault, 0, index));
    if fault == Fault::VanishedQueueRecord {
        return vanished::vanished_record(target, record).await;
    }
    // The witness connects now, not after the contender's grant: a connection made then
    // (a TLS handshake and a password check, on a loaded machine) could outlast the
    // contender's lease, which would then end before the contender writes.
    match target.client().await {
        // A semaphore's witness asks the semaphore: refused while the contender holds
        // the permit and the other permit is held.
        Ok(c) if fault == Fault::PausedPermitHolder => {
            record.witness = Some(Primitive::Permit.wrap(c));
        }
        Ok(c) => record.witness = Some(c),
        Err(e) => return setup_failed("witness", e),
    }
    match fault {
        Fault::PausedHolder => {
            return paused_holder(target, record, Primitive::Lock, Stop::Pause).await;
        }
        Fault::PausedPermitHolder => {
            return paused_holder(target, record, Primitive::Permit, Stop::Pause).await;
        }
        Fault::PausedLeader => {
            return paused_holder(target, record, Primitive::Leadership, Stop::Pause).await;
        }
        Fault::ClientSuspend => {
            let tells = !target.stopping_clock;
            return paused_holder(target, record, Primitive::Lock, Stop::Suspend { tells }).await;
        }
        _ => {}
    }
    let query = match fault {
        Fault::DelayedReply | Fault::LostReply => target.patient_query(),
        _ => target.harness.cut_options(),
    };
    let (lock, links) = match target.harness.proxied_client(query).await {
        Ok(client) => client,
        Err(e) => return setup_failed("proxied client", e),
    };
    let contender = match target.client().await {
        Ok(c) => record.client(CONTENDER, c),
        Err(e) => return setup_failed("contender", e),
    };
    let trial = ClientTrial {
        target,
        lock,
        links,
        contender,
        record,
    };
    match fault {
        // Every other trial delays a release instead of an acquire.
        Fault::DelayedReply if index % 2 == 1 => trial.delayed_release().await,
        Fault::DelayedReply => trial.delayed_reply().await,
        Fault::Blackhole => trial.blackhole().await,
        Fault::ConnectionCut => trial.connection_cut().await,
        Fault::StaleAcquire => trial.stale_acquire().await,
        Fault::StaleExtend => trial.stale_extend().await,
        Fault::StaleRelease => trial.stale_release().await,
        _ => trial.lost_reply().await,
    }
}

impl ClientTrial<'_> {
    fn set_mode(&self, mode: ProxyMode) {
        for proxy in self.links.proxies() {
            proxy.set_mode(mode);
        }
    }

    async fn contend(&self) -> Contended {
        contend(self.target, &self.contender, &self.record).await
    }

    async fn judge(self, holder: Holder, outcome: Contended, fired: bool) -> Trial {
        self.record
            .judge(self.target, holder, &self.contender, outcome, fired)
            .await
    }

    /// The holder's acquire is answered late, after a TTL; the contender asks meanwhile.
    /// The checker sees the holder's belief from the reply to its deadline: a deadline
    /// counted from the reply overlaps the contender and outlives the server's promise.
    async fn delayed_reply(self) -> Trial {
        let delay = self.target.ttl + Duration::from_millis(500);
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
        let lock = self.record.client(HOLDER, self.lock.clone());
        let sent = Instant::now();
        let holder = async {
            let granted = lock.try_acquire(&self.record.key, self.target.ttl).await;
            (granted, Instant::now())
        };
        // The contender starts once the holder's request is surely on the server.
        let contender = async {
            tokio::time::sleep(self.target.ttl / 4).await;
            self.contend().await
        };
        let ((granted, replied), outcome) = tokio::join!(holder, contender);
        self.set_mode(ProxyMode::Pass);
        let fired = replied - sent >= delay;
        let note = match &granted {
            Ok(Some(l)) if l.valid_until() <= replied => {
                Some("granted after its deadline: the holder knows it is already expired".into())
            }
            Ok(Some(_)) => None,
            Ok(None) | Err(_) => Some("the holder refused the late grant".into()),
        };
        let (ending, increment) = match granted {
            Ok(Some(lease)) => {
                let increment = self.record.counter.read(lease.token());
                (Ending::Lease(lease), Some(increment))
            }
            Ok(None) | Err(_) => (Ending::Nothing, None),
        };
        let holder = Holder {
            increment,
            ..Holder::idle(lock, ending)
        };
        let mut trial = self.judge(holder, outcome, fired).await;
        trial.note = trial.note.or(note);
        trial
    }

    /// The holder releases while the server's replies to it are delayed past its lease's
    /// remaining TTL, a contender waiting. A release that runs on the server at once frees
    /// the lock for the contender after the holder stopped believing; a release whose
    /// owner check and delete are two requests deletes, after the late check, whatever
    /// lock is there by then: the contender's, which the witness is then granted. Fired:
    /// the release took at least the delay, and the contender was granted before it
    /// returned.
    async fn delayed_release(self) -> Trial {
        let delay = match self.target.caps.expiry {
            // ZooKeeper's client drops a connection silent for 2/5 of the session timeout
            // (the TTL): a longer delay fails the release before its reply is due.
            ExpiryKind::SessionHeartbeat => self.target.ttl / 5,
            _ => self.target.ttl + Duration::from_millis(500),
        };
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
        // It releases at once, still believing (its belief ends at this call).
        let started = Instant::now();
        let release = tokio::spawn({
            let lock = lock.clone();
            async move {
                let released = lock.release(lease).await;
                (released, Instant::now())
            }
        });
        // The contender's lease outlasts the late release and the witness's request.
        let outcome = contend_for(
            self.target,
            &self.contender,
            &self.record,
            self.target.ttl * 4 + delay * 2,
        )
        .await;
        // Replies already on their way keep their delay; later ones pass.
        self.set_mode(ProxyMode::Pass);
        // The holder's release returns before the witness asks.
        let (fired, note) = match tokio::time::timeout(patience(self.target), release).await {
            Ok(Ok((released, returned))) => (
                returned - started >= delay && outcome.at < returned,
                released.err().map(|e| format!("release: {}", short(&e))),
            ),
            _ => (false, Some("the holder's release did not return".into())),
        };
        let holder = Holder::idle(lock, Ending::Nothing);
        let mut trial = self.judge(holder, outcome, fired).await;
        trial.note = trial.note.or(note);
        trial
    }

    async fn blackhole(self) -> Trial {
        let holder = match hold(&self.record, self.lock.clone(), self.target.ttl, true).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        self.links.cut();
        let outcome = self.contend().await;
        let fired = self.links.fired();
        self.links.heal();
        self.judge(holder, outcome, fired).await
    }

    /// The holder's connections reset while it holds; they stay refused while a contender
    /// asks. Fired: the proxy reset at least one of the holder's connections.
    async fn connection_cut(self) -> Trial {
        let holder = match hold(&self.record, self.lock.clone(), self.target.ttl, true).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        self.set_mode(ProxyMode::Reset);
        let outcome = self.contend().await;
        let fired = self.links.proxies().iter().any(|p| p.stats().resets > 0);
        self.set_mode(ProxyMode::Pass);
        self.judge(holder, outcome, fired).await
    }

    /// The holder's acquire reaches the server, which grants it; the reply is lost with
    /// the connection. Fired: the request's bytes went through the proxy, the holder got
    /// no lease, and a healthy client saw the orphaned grant held. The note says how long
    /// the orphan blocked the contender.
    async fn lost_reply(self) -> Trial {
        let sent_up = || -> u64 {
            self.links
                .proxies()
                .iter()
                .map(|p| p.stats().bytes_up)
                .sum()
        };
        let before = sent_up();
        // Replies are held back long enough for a healthy client to see the grant the
        // request made while its reply is still on the way; acquires of several steps
        // (ZooKeeper's sync, etcd's lease grant) get their earlier replies, later. The
        // lease is long enough for its server not to end it while replies lag
        // (Postgres's idle-in-transaction timer is the TTL). The orphan exists only
        // between the granting step and the reply to the last step: a delay of 400 ms
        // leaves a loaded machine's `inspect` time to see it (at 100 ms, 1 Postgres trial
        // in 20 read "the reply got through").
        let ttl = self.target.ttl * 4;
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: (self.target.ttl / 2).min(Duration::from_millis(400)),
        });
        let lock = self.record.client(HOLDER, self.lock.clone());
        let attempt = tokio::spawn({
            let (lock, key) = (lock.clone(), self.record.key.clone());
            async move { lock.try_acquire(&key, ttl).await }
        });
        // The orphan: held on the server while the holder waits for its answer. Once it
        // is seen, the connection (and the reply on its way) is lost.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut orphan_seen = false;
        while !orphan_seen && !attempt.is_finished() && Instant::now() < deadline {
            orphan_seen = matches!(self.contender.inspect(&self.record.key).await, Ok(Some(_)));
        }
        let reached = sent_up() > before;
        self.set_mode(ProxyMode::Reset);
        let holder_result = tokio::time::timeout(patience(self.target), attempt).await;
        self.set_mode(ProxyMode::Pass);
        let reply_lost = !matches!(holder_result, Ok(Ok(Ok(Some(_)))));
        let lost_at = Instant::now();
        let outcome = self.contend().await;
        let blocked = outcome.at - lost_at;
        let note = match (&outcome.granted, reply_lost, orphan_seen) {
            (_, false, _) => "the reply got through".to_string(),
            (_, true, false) => "no orphaned grant was seen on the server".to_string(),
            (Some(_), true, true) => format!("orphan blocked others for {}", round_secs(blocked)),
            (None, true, true) => "the orphan was never cleared".to_string(),
        };
        let ending = match holder_result {
            Ok(Ok(Ok(Some(lease)))) => Ending::Lease(lease),
            _ => Ending::Nothing,
        };
        let holder = Holder::idle(lock, ending);
        let fired = reached && reply_lost && orphan_seen;
        let mut trial = self.judge(holder, outcome, fired).await;
        if matches!(trial.verdict, Verdict::Safe | Verdict::Unavail) {
            trial.note = Some(note);
        }
        trial
    }
}

/// The holder's proxies' counts of stalled bytes: read, and delivered.
#[derive(Clone, Copy, Debug, Default)]
struct Stalled {
    read: u64,
    delivered: u64,
}

impl ClientTrial<'_> {
    /// Stalls every connection the holder has open now (see [`STALL`]).
    fn stall(&self, late: Duration) {
        for proxy in self.links.proxies() {
            proxy.stall(late);
        }
    }

    fn stalled(&self) -> Stalled {
        self.links
            .proxies()
            .iter()
            .map(|p| p.stats())
            .fold(Stalled::default(), |sum, s| Stalled {
                read: sum.read + s.bytes_stalled,
                delivered: sum.delivered + s.bytes_stalled_delivered,
            })
    }

    /// Whether the stalled requests all landed after `then`, the holder's next grant or
    /// extension, and in time to test it: at `then` something was stalled and nothing
    /// stalled had been delivered yet (so the request the client gave up on was still
    /// on its way), and every stalled byte is delivered (waited for, then a moment for
    /// the servers to act on it) a margin before `believed_until`, so the contender can
    /// still ask while the holder believes.
    async fn stalled_landed(&self, then: Stalled, believed_until: Instant) -> bool {
        if then.read == 0 || then.delivered > 0 {
            return false;
        }
        let margin = self.target.ttl.min(Duration::from_millis(500));
        let give_up = believed_until
            .checked_sub(margin * 2)
            .unwrap_or(believed_until);
        loop {
            let now = self.stalled();
            if now.delivered >= now.read {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Instant::now() + margin < believed_until;
            }
            if Instant::now() >= give_up {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A grant and release on a key of its own: the holder's connections are up (and a
    /// Redis server has the scripts) before its connections stall.
    async fn warm_up(&self) -> Result<(), LockError> {
        let key = LockKey::new(format!("{}/warm-up", self.record.key))?;
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = self.lock.acquire(&key, &opts).await?;
        let _ = self.lock.release(lease).await;
        Ok(())
    }

    /// The contender asks while the holder (a healthy client all along) still believes
    /// it holds the lock, and gives up before the holder's belief ends: granted only if
    /// a late request freed the holder's lock on the server.
    async fn contend_while_held(&self, believed_until: Instant) -> Contended {
        let margin = self.target.ttl.min(Duration::from_millis(500));
        let wait = believed_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        let opts = AcquireOptions::new(self.target.ttl * 4).wait(wait);
        contend_with(&self.contender, &self.record, &opts).await
    }

    /// See [`Fault::StaleAcquire`]. The holder takes the lock as a bare lease that
    /// outlasts the stall by four TTLs while its connections stall; once the stalled
    /// requests have landed, the contender asks. A late request (or a clean-up of one,
    /// sent behind it) that acts on the retry's grant frees the lock under the holder,
    /// who works on until its deadline (a guard would learn of it at its next renewal,
    /// after the contender could be granted). Fired: stalled bytes were delivered after
    /// the holder's grant.
    async fn stale_acquire(self) -> Trial {
        if let Err(e) = self.warm_up().await {
            return setup_failed("holder's warm-up", e);
        }
        self.stall(STALL);
        let long = STALL + self.target.ttl * 4;
        let holder = match hold(&self.record, self.lock.clone(), long, false).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        let granted = self.stalled();
        let fired = self.stalled_landed(granted, holder.believed_until()).await;
        self.stall(Duration::ZERO);
        let outcome = self.contend_while_held(holder.believed_until()).await;
        self.judge(holder, outcome, fired).await
    }

    /// See [`Fault::StaleExtend`]. The holder holds a bare lease and extends it by one
    /// TTL while its connections stall; it gives up, then extends it by the stall plus
    /// four TTLs over a fresh connection; once the short extension has landed, the
    /// contender asks. An extension that sets the expiry to its own argument ends the
    /// lock on the server some three TTLs before the holder believes. Fired: the short
    /// extension failed, the long one succeeded, and stalled bytes were delivered after
    /// it.
    async fn stale_extend(self) -> Trial {
        let long = STALL + self.target.ttl * 4;
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(long).wait(Duration::from_secs(10));
        let mut lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        let increment = Some(self.record.counter.read(lease.token()));
        self.stall(STALL);
        let short = lock.extend(&mut lease.clone(), self.target.ttl).await;
        let give_up = Instant::now() + patience(self.target);
        let extended = loop {
            match lock.extend(&mut lease, long).await {
                Ok(()) => break Ok(()),
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => break Err(e),
            }
        };
        let after = self.stalled();
        let landed = self.stalled_landed(after, lease.valid_until()).await;
        self.stall(Duration::ZERO);
        let note = match (&short, &extended) {
            (Ok(()), _) => Some("the stalled extension got its reply in time".to_string()),
            (_, Err(e)) => Some(format!("the long extension failed: {}", short_text(e))),
            _ => None,
        };
        let fired = short.is_err() && extended.is_ok() && landed;
        let outcome = self.contend_while_held(lease.valid_until()).await;
        let holder = Holder {
            increment,
            ..Holder::idle(lock, Ending::Lease(lease))
        };
        let mut trial = self.judge(holder, outcome, fired).await;
        if !fired {
            trial.note = trial.note.or(note);
        }
        trial
    }

    /// See [`Fault::StaleRelease`]. The holder releases a lease of one TTL while its
    /// connections stall for longer than that; it gives up, and takes the lock again
    /// (a bare lease that outlasts the stall by four TTLs, over a fresh connection) once
    /// the first expired; once the stalled release has landed, the contender asks. A release that does not name the
    /// grant it ends frees the new one. Fired: the release failed, the holder was granted
    /// again, and stalled bytes were delivered after that grant.
    async fn stale_release(self) -> Trial {
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        let late = self.target.ttl + STALL;
        self.stall(late);
        let released = lock.release(lease).await;
        let again = late + self.target.ttl * 4;
        let holder = match hold(&self.record, self.lock.clone(), again, false).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder's second grant", e),
        };
        let granted = self.stalled();
        let landed = self.stalled_landed(granted, holder.believed_until()).await;
        self.stall(Duration::ZERO);
        let fired = released.is_err() && landed;
        let outcome = self.contend_while_held(holder.believed_until()).await;
        let mut trial = self.judge(holder, outcome, fired).await;
        if released.is_ok() && trial.note.is_none() {
            trial.note = Some("the stalled release got its reply in time".into());
        }
        trial
    }
}

fn short_text(error: &LockError) -> String {
    short(error)
}

fn round_secs(d: Duration) -> String {
    match d.as_millis() {
        ms if ms < 1000 => "<1 s".to_string(),
        ms => format!("~{} s", (ms + 500) / 1000),
    }
}

/// Which nodes each side of a partitioned Redlock trial reaches: the holder the first
/// majority, the contender the last; they share one node (the middle one).
fn redlock_sides(nodes: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let quorum = nodes / 2 + 1;
    let holder: Vec<usize> = (0..quorum).collect();
    let contender: Vec<usize> = (nodes - quorum..nodes).collect();
    (holder, contender, quorum - 1)
}

/// A client reaching only the nodes in `reach` (the others black-holed).
async fn partitioned(
    target: &Target,
    reach: &[usize],
) -> Result<(Arc<dyn DistributedLock>, Links), LockError> {
    let (lock, links) = target
        .harness
        .proxied_client(target.harness.cut_options())
        .await?;
    for (i, proxy) in links.proxies().iter().enumerate() {
        if !reach.contains(&i) {
            proxy.set_mode(ProxyMode::Blackhole);
        }
    }
    Ok((lock, links))
}

/// Whether the servers are independent masters a client asks a majority of (Redlock).
fn independent_quorum(target: &Target) -> bool {
    matches!(
        target.caps.replication,
        Replication::IndependentQuorum { .. }
    )
}

/// The node a server fault hits: the leader if there is one, else node 0; for a
/// partitioned Redlock, the node both sides share.
async fn victim(target: &Target) -> usize {
    if independent_quorum(target) {
        return redlock_sides(target.nodes.len()).2;
    }
    match &target.leader {
        Some(leader) => leader().await.unwrap_or(0),
        None => 0,
    }
}

/// One injection of a server fault with `pairs` trials around it.
async fn server_round(fault: Fault, target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    if fault == Fault::ReplicaFailover {
        return replica_failover(target, round, pairs).await;
    }
    if fault.is_topology_failover() {
        return redis::round(fault, target, round, pairs).await;
    }
    if fault == Fault::MinorityLoss {
        return minority_loss(target, round, pairs).await;
    }
    let n = target.nodes.len();
    let redlock = independent_quorum(target) && fault != Fault::ServerPause;
    let (mut holder_side, mut contender_side, _) = redlock_sides(n);
    // A minority partition on ZooKeeper: the holder talks to one follower only, the
    // contender to the others (the leader's side).
    let follower = match fault {
        Fault::MinorityPartition if !redlock => Some((victim(target).await + 1) % n),
        _ => None,
    };
    if let Some(f) = follower {
        holder_side = vec![f];
        contender_side = (0..n).filter(|&i| i != f).collect();
    }
    // On Redlock: the holder takes the lock on every master, then loses its links to a
    // majority (it keeps the first ⌊n/2⌋); the contender reaches only that majority.
    let cut: Vec<usize> = match fault {
        Fault::MinorityPartition if redlock => (n / 2..n).collect(),
        _ => Vec::new(),
    };
    if !cut.is_empty() {
        holder_side = (0..n).collect();
        contender_side = cut.clone();
    }
    let mut clients = Vec::with_capacity(pairs);
    let mut early = Vec::new();
    for pair in 0..pairs {
        let record = Record::new(target.key(fault, round, pair));
        let sides = if redlock || follower.is_some() {
            // The follower may still be rejoining after the previous round.
            let side =
                |reach| retrying(Duration::from_secs(30), move || partitioned(target, reach));
            (side(&holder_side).await.0, side(&contender_side).await.0)
        } else {
            // A server restarted by the previous round may still be recovering (slowly,
            // with every other backend's trials running on the same two cores).
            let direct = |_| async {
                let (client, _) = retrying(Duration::from_secs(30), || target.client()).await;
                client.map(|c| (c, Links::empty()))
            };
            (direct(0).await, direct(1).await)
        };
        match sides {
            (Ok((lock, holder_links)), Ok((contender, contender_links))) => {
                let contender = record.client(CONTENDER, contender);
                clients.push((record, lock, contender, [holder_links, contender_links]));
            }
            (Err(e), _) | (_, Err(e)) => early.push(setup_failed("clients", e)),
        }
    }
    // A clock jump is judged against the holder's own deadline (a bare lease: what a
    // holder between two renewals relies on); other faults against a renewing guard.
    // Bare leases are taken all at once, just before the injection, so that each still
    // runs when the fault lands.
    let guard = fault != Fault::ClockJump;
    let ttl = match guard {
        true => target.ttl,
        false => clock_jump_ttl(target),
    };
    let holds = clients
        .iter()
        .map(|(record, lock, _, _)| hold(record, lock.clone(), ttl, guard));
    let taken = if guard {
        // Renewing holders keep their locks: one after another spares the two cores.
        let mut taken = Vec::with_capacity(clients.len());
        for hold in holds {
            taken.push(hold.await);
        }
        taken
    } else {
        futures::future::join_all(holds).await
    };
    let mut pairs_held = Vec::with_capacity(taken.len());
    for (taken, (record, _, contender, links)) in taken.into_iter().zip(clients) {
        match taken {
            Ok(holder) => pairs_held.push((record, holder, contender, links)),
            Err(e) => early.push(setup_failed("holder", e)),
        }
    }
    let node = match follower {
        Some(f) => f,
        None => victim(target).await,
    };
    let dropped = || match (follower, &target.peer_links) {
        (Some(f), Some(links)) => links.dropped(f),
        _ => 0,
    };
    let dropped_before = dropped();
    // Bytes black-holed on each holder's cut links.
    let blackholed = |links: &[Links; 2]| -> u64 {
        cut.iter()
            .filter_map(|&i| links[0].proxies().get(i))
            .map(|p| p.stats().bytes_blackholed)
            .sum()
    };
    let blackholed_before: Vec<u64> = pairs_held
        .iter()
        .map(|(_, _, _, links)| blackholed(links))
        .collect();

    let fired = if cut.is_empty() {
        inject(fault, target, node).await
    } else {
        for (_, _, _, links) in &pairs_held {
            for &i in &cut {
                if let Some(proxy) = links[0].proxies().get(i) {
                    proxy.set_mode(ProxyMode::Blackhole);
                }
            }
        }
        Ok(Evidence(
            "the holder's traffic to a majority of the masters was black-holed".into(),
        ))
    };
    // By now the server sees the fault (a clock jump has been read and applied).
    let landed = Instant::now();
    let outcomes = futures::future::join_all(
        pairs_held
            .iter()
            .map(|(record, _, contender, _)| contend(target, contender, record)),
    )
    .await;
    let mut trials = early;
    // Every pair is judged at once, as its contender got the lock: one after another,
    // the later pairs' witnesses would ask (and their contenders write) after their
    // leases ran out, waiting on the earlier pairs' stale holders.
    let (injected, dropped, blackholed) = (&fired, &dropped, &blackholed);
    let partitioned = !cut.is_empty();
    let judged = pairs_held
        .into_iter()
        .zip(outcomes)
        .zip(blackholed_before)
        .map(
            |(((record, holder, contender, links), outcome), before)| async move {
                let mut fired = injected.is_ok();
                if fault == Fault::ClockJump {
                    // The jump counts only where it landed while the holder still believed.
                    fired &= record.history.believed_at(HOLDER, landed);
                }
                if follower.is_some() {
                    // Evidence: the follower's traffic with the other members was dropped.
                    fired &= dropped() > dropped_before;
                }
                if partitioned {
                    // Evidence: the holder's requests to the cut-off majority were dropped.
                    fired &= blackholed(&links) > before;
                }
                record
                    .judge(target, holder, &contender, outcome, fired)
                    .await
            },
        );
    trials.extend(futures::future::join_all(judged).await);
    let healed = heal(fault, target, node).await;
    for trial in &mut trials {
        let note = match (&fired, &healed) {
            (Err(e), _) => format!("injection failed: {e}"),
            (Ok(_), Err(e)) => format!("heal failed: {e}"),
            (Ok(evidence), Ok(())) => evidence.to_string(),
        };
        trial.note.get_or_insert(note);
    }
    trials
}

/// Observed evidence that an injected fault took effect: what the system showed (a new
/// pid, a stopped process, the offset the shimmed server read, dropped member traffic),
/// never that a call returned `Ok`. Its text goes into the cell's notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence(pub String);

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fired: {}", self.0)
    }
}

/// How long to wait for a fault's effect to show.
const EVIDENCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `observe` every 10 ms until it returns `Some`, for up to [`EVIDENCE_TIMEOUT`].
async fn observed<T>(mut observe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + EVIDENCE_TIMEOUT;
    loop {
        if let Some(seen) = observe() {
            return Some(seen);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the process `pid` is gone (or a zombie).
fn exited(pid: u32) -> bool {
    !crate::servers::pid_alive(pid)
}

/// Injects a server fault on node `index` (into [`FaultTarget::nodes`]) and returns the
/// evidence that it took effect, or why there is none. [`run`] injects its server faults
/// with it; [`heal`] undoes it.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, the fault may be left injected ([`ensure`] repairs).
pub async fn inject(fault: Fault, target: &Target, index: usize) -> Result<Evidence, String> {
    let node = &target.nodes[index];
    match fault {
        Fault::ClockJump => {
            let jump = clock_jump_offset_ms(target);
            set_clock(node.as_ref(), jump).await?;
            Ok(Evidence(format!(
                "the server read its +{} s clock offset",
                jump / 1000
            )))
        }
        Fault::Restart => {
            let before = node.pid().ok_or("the server was not running")?;
            let moved_from = node.addr();
            node.restart().await.map_err(|e| e.to_string())?;
            let after = node
                .pid()
                .ok_or("the server is not running after its restart")?;
            if after == before || !exited(before) {
                return Err(format!("pid {before} is still the server after a restart"));
            }
            let moved = match node.addr() {
                a if a == moved_from => String::new(),
                a => format!(" (its port was taken: moved to {})", a.port()),
            };
            Ok(Evidence(format!("a new server process{moved}")))
        }
        Fault::ServerPause => {
            node.pause().map_err(|e| e.to_string())?;
            observed(|| (node.state() == Some('T')).then_some(()))
                .await
                .ok_or_else(|| format!("SIGSTOP sent, but the state is {:?}", node.state()))?;
            Ok(Evidence("the server process is stopped (state T)".into()))
        }
        Fault::MinorityPartition => {
            let links = target
                .peer_links
                .as_ref()
                .ok_or("no control over the links between the members")?;
            let before = links.dropped(index);
            links.isolate(index)?;
            observed(|| (links.dropped(index) > before).then_some(()))
                .await
                .ok_or("the member's links were cut, but none of its traffic was dropped")?;
            Ok(Evidence(
                "the member's traffic with the others was dropped".into(),
            ))
        }
        other => Err(format!("{other:?} is not injected on one server")),
    }
}

/// The lease TTL of a clock-jump trial's holders: the trial TTL, but at least
/// [`CLOCK_JUMP_MIN_TTL`]. The jump is judged only where it lands while the holder still
/// believes it holds, and landing takes the server's reading its new offset plus its
/// cron's 100 ms: with Redis's 500 ms trial TTL a loaded machine (TLS handshakes, every
/// backend's trials on two cores) left too little of the lease for that.
pub fn clock_jump_ttl(target: &Target) -> Duration {
    target.ttl.max(CLOCK_JUMP_MIN_TTL)
}

/// See [`clock_jump_ttl`].
pub const CLOCK_JUMP_MIN_TTL: Duration = Duration::from_secs(3);

/// How far a clock jump moves the server's clock: past every holder's lease on the
/// server (twice the lease TTL, plus a second).
pub fn clock_jump_offset_ms(target: &Target) -> i64 {
    i64::try_from((clock_jump_ttl(target) * 2).as_millis()).unwrap_or(i64::MAX) + 1000
}

/// Shifts a node's clock and waits until the server has read the new offset (the shim's
/// record, with the server's pid) and redis-server has refreshed its cached clock (its
/// 100 ms cron).
async fn set_clock(node: &dyn Node, offset_ms: i64) -> Result<(), String> {
    node.set_clock_offset(offset_ms)
        .map_err(|e| e.to_string())?;
    observed(|| (node.clock_applied()? == (offset_ms, node.pid()?)).then_some(()))
        .await
        .ok_or_else(|| {
            format!(
                "offset {offset_ms} ms written, but the server's last read is {:?}",
                node.clock_applied()
            )
        })?;
    tokio::time::sleep(Duration::from_millis(110)).await;
    Ok(())
}

/// Undoes [`inject`], and checks the undo took effect.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, the fault may be left half undone ([`ensure`]
/// repairs).
pub async fn heal(fault: Fault, target: &Target, node: usize) -> Result<(), String> {
    let node = &target.nodes[node];
    match fault {
        // Back to real time before the next round takes locks: a grant made on the
        // jumped clock would carry an expiry that far in the future.
        Fault::ClockJump => set_clock(node.as_ref(), 0).await,
        Fault::ServerPause => {
            node.resume().map_err(|e| e.to_string())?;
            observed(|| (node.state() != Some('T')).then_some(()))
                .await
                .ok_or_else(|| "SIGCONT sent, but the server is still stopped".to_string())
        }
        Fault::MinorityPartition => {
            if let Some(links) = &target.peer_links {
                links.heal();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Kills a minority (the leader first, where there is one), runs hand-offs between two
/// healthy clients per pair, and restarts the killed nodes.
async fn minority_loss(target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let n = target.nodes.len();
    let leader = victim(target).await;
    let doomed: Vec<usize> = std::iter::once(leader)
        .chain((0..n).filter(|&i| i != leader))
        .take((n - 1) / 2)
        .collect();
    // Evidence: every doomed server's process exited.
    let mut killed = Ok(());
    for &i in &doomed {
        let node = &target.nodes[i];
        let Some(pid) = node.pid() else {
            killed = Err(format!("node {i} was not running"));
            continue;
        };
        if let Err(e) = node.kill().await {
            killed = Err(e.to_string());
        } else if !exited(pid) || node.is_running() {
            killed = Err(format!(
                "node {i} (pid {pid}) is still running after SIGKILL"
            ));
        }
    }
    let mut trials = futures::future::join_all((0..pairs).map(|pair| {
        let key = target.key(Fault::MinorityLoss, round, pair);
        let fired = killed.is_ok();
        async move { hand_off(target, &key, fired).await }
    }))
    .await;
    let mut restarted = Ok(());
    for &i in &doomed {
        if let Err(e) = target.nodes[i].restart().await {
            restarted = Err(format!("node {i} did not come back: {e}"));
        }
    }
    for trial in &mut trials {
        let note = match (&killed, &restarted) {
            (Err(e), _) => format!("injection failed: {e}"),
            (Ok(()), Err(e)) => format!("heal failed: {e}"),
            (Ok(()), Ok(())) => {
                Evidence(format!("{} server process(es) exited", doomed.len())).to_string()
            }
        };
        trial.note.get_or_insert(note);
    }
    trials
}

/// [`retrying`] for up to 20 s: a cluster that lost its leader recovers after an
/// election, which on two loaded cores can take longer than 5 s (ZooKeeper's hand-offs
/// once read UNAVAIL ⚠ with "connect … timeout" after 5 s).
async fn retried<T, F, Fut>(op: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    retrying(Duration::from_secs(20), op).await.0
}

/// A hand-off between two healthy clients: the second must see the lock held, then get
/// it after the release, with a larger token; the checker examines both holds.
async fn hand_off(target: &Target, key: &LockKey, fired: bool) -> Trial {
    let history = History::new();
    let attempt = async {
        let (a, b) = (
            history.recorded(HOLDER, retried(|| target.client()).await?),
            history.recorded(CONTENDER, retried(|| target.client()).await?),
        );
        let opts = AcquireOptions::new(target.ttl * 4).wait(Duration::from_secs(10));
        let first = a.acquire(key, &opts).await?;
        let sneaked = retried(|| b.try_acquire(key, target.ttl)).await?;
        let released = retried(|| a.release(first.clone())).await?;
        let second = b.acquire(key, &opts).await?;
        let ok = sneaked.is_none() && released == ReleaseOutcome::Released;
        if let Some(lease) = sneaked {
            let _ = b.release(lease).await;
        }
        let _ = b.release(second).await;
        Ok::<bool, LockError>(ok)
    };
    let result = attempt.await;
    let report = history.check();
    let (verdict, note) = match result {
        _ if !report.is_safe() => (Verdict::Unsafe, report.definite.first().map(describe)),
        Ok(true) => (Verdict::Safe, None),
        Ok(false) => (
            Verdict::Unsafe,
            Some("a hand-off broke exclusion or token order".into()),
        ),
        Err(e) => (Verdict::Unavail, Some(short(&e))),
    };
    Trial {
        verdict,
        fired,
        note,
        updates: LostUpdates::default(),
    }
}

/// Redis primary + asynchronous replica: the replication link is cut, the holder is
/// granted on the primary, the primary dies, the replica is promoted, a contender asks
/// the new primary.
async fn replica_failover(target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let pair = match RedisReplicaPair::start().await {
        Ok(p) => p,
        Err(e) => {
            let error = LockError::backend(format!("replica pair: {e}"));
            return round_failed(pairs, "servers", error);
        }
    };
    let connect = |url: String| target.harness.client_of(url);
    let setup = async {
        pair.wait_synced()
            .await
            .map_err(|e| LockError::backend(e.to_string()))?;
        let primary = connect(pair.primary().url()).await?;
        Ok::<_, LockError>(primary)
    };
    let primary = match setup.await {
        Ok(p) => p,
        Err(e) => return round_failed(pairs, "primary", e),
    };
    pair.replication_link().set_mode(ProxyMode::Blackhole);
    let mut holders = Vec::new();
    let mut trials = Vec::new();
    for i in 0..pairs {
        let record = Record::new(target.key(Fault::ReplicaFailover, round, i));
        match hold(&record, primary.clone(), target.ttl * 10, false).await {
            Ok(holder) => holders.push((record, holder)),
            Err(e) => trials.push(setup_failed("holder", e)),
        }
    }
    let failover = async {
        pair.primary().kill().await.map_err(|e| e.to_string())?;
        pair.replica().promote().await.map_err(|e| e.to_string())
    };
    let fired = failover.await;
    let url = pair.replica().url();
    let judged = after_failover(target, holders, || connect(url.clone()), fired.is_ok()).await;
    match judged {
        Ok(judged) => trials.extend(judged),
        Err(e) => return round_failed(pairs, "contender", e),
    }
    trials
}

/// The end of a failover round: a contender and a witness connect (`connect`, to the
/// promoted primary); every contender asks at once, so each trial is judged at its own
/// takeover while its holder's lease still runs. A client that cannot connect is the
/// round's error.
async fn after_failover<F, Fut>(
    target: &Target,
    mut holders: Vec<(Record, Holder)>,
    connect: F,
    fired: bool,
) -> Result<Vec<Trial>, LockError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn DistributedLock>, LockError>>,
{
    let contender = connect().await?;
    // The witness must ask the promoted primary too, never the target's own servers.
    let witness = connect().await?;
    let contenders: Vec<_> = holders
        .iter_mut()
        .map(|(record, _)| {
            record.witness = Some(witness.clone());
            record.client(CONTENDER, contender.clone())
        })
        .collect();
    let outcomes = futures::future::join_all(
        holders
            .iter()
            .zip(&contenders)
            .map(|((record, _), contender)| contend(target, contender, record)),
    )
    .await;
    // Judged at once, as in `server_round`.
    let judged = holders.into_iter().zip(&contenders).zip(outcomes).map(
        |(((record, holder), contender), outcome)| async move {
            record
                .judge(target, holder, contender, outcome, fired)
                .await
        },
    );
    Ok(futures::future::join_all(judged).await)
}

#[cfg(test)]
mod cell_tests {
    use super::*;

    #[test]
    fn a_fault_is_named_as_in_the_json() {
        for fault in Fault::ALL {
            let json = serde_json::to_value(fault).unwrap();
            assert_eq!(json.as_str(), Some(fault.name()));
        }
    }

    fn trial(verdict: Verdict, fired: bool, lost_unfenced: u64) -> Trial {
        Trial {
            verdict,
            fired,
            note: None,
            updates: LostUpdates {
                updates: 2,
                unfenced: lost_unfenced,
                fenced: 0,
            },
        }
    }

    /// A soak adds up each fault's draws: verdicts, trials, injections and updates; a
    /// draw on an unhealthy backend leaves its reason in the notes.
    #[test]
    fn draws_of_a_fault_add_up_to_one_cell() {
        let first = Cell::from_trials(vec![trial(Verdict::Safe, true, 0)], 1);
        let second = Cell::from_trials(
            vec![
                trial(Verdict::FencedSafe, true, 1),
                trial(Verdict::Safe, false, 1),
            ],
            1,
        );
        let unhealthy = Cell::Unhealthy {
            reason: "node 0 is down".into(),
        };
        let merged = Cell::from_trials(Vec::new(), 0)
            .merge(first)
            .merge(unhealthy)
            .merge(second);
        let Cell::Ran {
            counts,
            trials,
            injections,
            not_fired,
            fencing_contained,
            updates,
            notes,
        } = &merged
        else {
            panic!("{merged:?}")
        };
        let expected = BTreeMap::from([(Verdict::Safe, 1), (Verdict::FencedSafe, 1)]);
        assert_eq!(counts, &expected);
        assert_eq!((*trials, *injections, *not_fired), (3, 2, 1));
        assert_eq!(*fencing_contained, Some(true));
        // The trial that did not fire counts no updates, as it counts no verdict.
        assert_eq!(
            *updates,
            LostUpdates {
                updates: 4,
                unfenced: 1,
                fenced: 0
            }
        );
        assert_eq!(notes, &["unhealthy: node 0 is down"]);
        assert_eq!(merged.summary(), "SAFE 1 · F-SAFE 1 · not fired 1");
        // A fault never drawn says so.
        assert_eq!(Cell::from_trials(Vec::new(), 0).summary(), "not drawn");
    }

    /// A long soak's notes fill up; the note of a later draw's uncontained violation is
    /// kept, first.
    #[test]
    fn the_note_of_an_unsafe_draw_is_never_crowded_out() {
        let noted = |verdict, note: String| Trial {
            note: Some(note),
            ..trial(verdict, true, 0)
        };
        let mut merged = Cell::from_trials(Vec::new(), 0);
        for i in 0..20 {
            let run = Cell::from_trials(vec![noted(Verdict::Safe, format!("safe {i}"))], 1);
            merged = merged.merge(run);
        }
        let unsafe_run = Cell::from_trials(vec![noted(Verdict::Unsafe, "the fence".into())], 1);
        let merged = merged.merge(unsafe_run);
        let Cell::Ran { notes, .. } = &merged else {
            panic!("{merged:?}")
        };
        assert_eq!(notes.len(), MERGED_NOTES);
        assert_eq!(notes[0], "the fence");
        assert_eq!(merged.summary(), "SAFE 20 · UNSAFE 1");
    }
}
