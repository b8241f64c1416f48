//! What each cell of the matrix must show: one reviewed table of the verdicts the
//! protocols allow per (backend, configuration, fault), each with its reason.
//!
//! The table is derived from how each backend works, never from a run and never from the
//! backend's own [`Capabilities`]: those are checked against the table's premises
//! ([`Premise`]) instead. A cell observed outside its row is a ⚠ in the matrix, and
//! `tenure matrix` fails on it; a backend's fault-suite test fails on it
//! ([`run_fault_suite`](crate::runner::run_fault_suite)).
//!
//! Deliberately broken wrappers over a real backend look up the real backend's row with
//! [`Config::of`] (the underlying backend's name and URL), so the matrix judges them by
//! what the real protocol guarantees.

use serde::Serialize;
use tenure_api::{Capabilities, ExpiryKind, FencingKind, Replication};

use super::{Fault, Verdict};

/// How a Redis node advances its per-key fence counter (the `fence` URL option).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fence {
    /// `max(counter + 1, server time in µs)` (the default).
    Clock,
    /// A plain `INCR`.
    Counter,
}

/// The protocol of a backend, with the options that change a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// One Redis server.
    Redis {
        /// Its fence counter.
        fence: Fence,
    },
    /// Redlock over independent Redis masters.
    Redlock {
        /// Each node's fence counter; `None` with `fencing=false` (no fence round).
        fence: Option<Fence>,
    },
    /// etcd (Raft).
    Etcd,
    /// ZooKeeper (Zab).
    Zk,
    /// One PostgreSQL server.
    Postgres,
}

/// What the expected verdicts depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    /// The protocol and its options.
    pub protocol: Protocol,
    /// Servers: hosts in the URL, or the voting members the servers list (etcd).
    pub nodes: usize,
}

impl Config {
    /// The configuration of `backend` (the real backend's name: `redis`, `redlock`,
    /// `etcd`, `zk`, `postgres`) at `url`, on `nodes` servers.
    pub fn of(backend: &str, url: &str, nodes: usize) -> Result<Config, String> {
        let option = |name: &str| -> Option<&str> {
            let query = url.split_once('?')?.1;
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| v)
                .next_back()
        };
        let fence = || match option("fence") {
            None | Some("clock") => Ok(Fence::Clock),
            Some("counter") => Ok(Fence::Counter),
            Some(other) => Err(format!("fence={other:?}: expected clock or counter")),
        };
        let protocol = match backend {
            "redis" => Protocol::Redis { fence: fence()? },
            "redlock" => Protocol::Redlock {
                fence: match option("fencing") {
                    Some("false") => None,
                    _ => Some(fence()?),
                },
            },
            "etcd" => Protocol::Etcd,
            "zk" => Protocol::Zk,
            "postgres" => Protocol::Postgres,
            other => return Err(format!("no expected verdicts for backend {other:?}")),
        };
        Ok(Config {
            protocol,
            nodes: nodes.max(1),
        })
    }

    /// What the table assumes the backend guarantees.
    pub fn premise(&self) -> Premise {
        let n = self.nodes;
        let (fencing, expiry, replication, failures_tolerated, clock_dependent) =
            match self.protocol {
                Protocol::Redis { fence } => (
                    match fence {
                        Fence::Clock => FencingKind::ClockFlooredCounter,
                        Fence::Counter => FencingKind::SingleNodeCounter,
                    },
                    ExpiryKind::ServerTtl,
                    Replication::SingleNode,
                    0,
                    true,
                ),
                Protocol::Redlock { fence } => (
                    match fence {
                        Some(_) => FencingKind::QuorumRegister,
                        None => FencingKind::None,
                    },
                    ExpiryKind::ServerTtl,
                    Replication::IndependentQuorum { nodes: n },
                    (n - 1) / 2,
                    true,
                ),
                Protocol::Etcd => (
                    FencingKind::ConsensusOrdered,
                    ExpiryKind::LeaderTimedLease,
                    Replication::Consensus { members: n },
                    (n - 1) / 2,
                    false,
                ),
                Protocol::Zk => (
                    FencingKind::ConsensusOrdered,
                    ExpiryKind::SessionHeartbeat,
                    Replication::Consensus { members: n },
                    (n - 1) / 2,
                    false,
                ),
                Protocol::Postgres => (
                    FencingKind::Sequence,
                    ExpiryKind::ConnectionTransaction,
                    Replication::SingleNode,
                    0,
                    false,
                ),
            };
        Premise {
            fencing,
            expiry,
            replication,
            failures_tolerated,
            clock_dependent,
        }
    }
}

/// The guarantees a configuration's row of the table rests on; a backend declaring other
/// [`Capabilities`] contradicts the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Premise {
    /// Where tokens come from.
    pub fencing: FencingKind,
    /// What frees a silent holder's lock.
    pub expiry: ExpiryKind,
    /// How the lock state is replicated.
    pub replication: Replication,
    /// Server failures survived.
    pub failures_tolerated: usize,
    /// Whether a server clock jump can free a held lock early.
    pub clock_dependent: bool,
}

impl Premise {
    /// The declared capabilities that differ from the premise, as `name: declared X,
    /// expected Y`.
    pub fn contradictions(&self, caps: &Capabilities) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |name: &str, declared: String, expected: String| {
            if declared != expected {
                out.push(format!("{name}: declared {declared}, expected {expected}"));
            }
        };
        differ(
            "fencing",
            format!("{:?}", caps.fencing),
            format!("{:?}", self.fencing),
        );
        differ(
            "expiry",
            format!("{:?}", caps.expiry),
            format!("{:?}", self.expiry),
        );
        differ(
            "replication",
            format!("{:?}", caps.replication),
            format!("{:?}", self.replication),
        );
        differ(
            "failures tolerated",
            caps.failures_tolerated.to_string(),
            self.failures_tolerated.to_string(),
        );
        differ(
            "clock-dependent",
            caps.clock_dependent.to_string(),
            self.clock_dependent.to_string(),
        );
        out
    }
}

/// One cell of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Expect {
    /// The verdicts the protocol allows (empty: the fault does not apply).
    pub verdicts: &'static [Verdict],
    /// Why, from the protocol.
    pub reason: &'static str,
}

impl Expect {
    /// Whether every verdict in `observed` is allowed.
    pub fn allows(&self, observed: &[Verdict]) -> bool {
        observed.iter().all(|v| self.verdicts.contains(v))
    }
}

const SAFE: &[Verdict] = &[Verdict::Safe];
const F_SAFE: &[Verdict] = &[Verdict::FencedSafe];
const UNSAFE: &[Verdict] = &[Verdict::Unsafe];
const UNAVAIL: &[Verdict] = &[Verdict::Unavail];
const SAFE_OR_UNAVAIL: &[Verdict] = &[Verdict::Safe, Verdict::Unavail];
const SAFE_OR_F_SAFE: &[Verdict] = &[Verdict::Safe, Verdict::FencedSafe];
const SAFE_OR_UNSAFE: &[Verdict] = &[Verdict::Safe, Verdict::Unsafe];
const ANY_CONTAINMENT: &[Verdict] = &[Verdict::Safe, Verdict::FencedSafe, Verdict::Unsafe];
const UNFENCED_VIOLATION: &[Verdict] = &[Verdict::FencedSafe, Verdict::Unsafe];
const NOT_APPLICABLE: &[Verdict] = &[];

/// What a backend the table has no row for must show under any fault: no UNSAFE (a
/// double grant that fencing did not contain). The fault suite's expectation for a third
/// party's backend.
pub fn never_unsafe(fault: Fault) -> Expect {
    let _ = fault;
    Expect {
        verdicts: &[Verdict::Safe, Verdict::FencedSafe, Verdict::Unavail],
        reason: "a backend without a row in the table: any verdict but UNSAFE",
    }
}

/// The table: what `fault` must produce on a backend configured as `config`.
pub fn expect(config: &Config, fault: Fault) -> Expect {
    use Protocol::{Etcd, Postgres, Redis, Redlock, Zk};
    let e = |verdicts, reason| Expect { verdicts, reason };
    let counter = Some(Fence::Counter);
    let single = config.nodes < 3;
    match (fault, config.protocol) {
        // --- a holder paused past its TTL, then writing with its token ---------------
        // (A semaphore's permit is a lock of its own, and an election's leadership is
        // its lock: the same protocol, the same verdicts.)
        (Fault::PausedLeader, Redlock { fence: None }) => e(
            NOT_APPLICABLE,
            "no fencing tokens, so no terms: Election refuses this configuration",
        ),
        (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, Redis { .. }) => e(
            F_SAFE,
            "the key's TTL runs out during the pause and the contender is granted; its token \
             comes from the same counter, larger, so the woken holder's write is rejected",
        ),
        (Fault::PausedHolder | Fault::PausedPermitHolder, Redlock { fence: None }) => e(
            UNFENCED_VIOLATION,
            "every node's TTL runs out during the pause and the contender is granted; with \
             fencing=false tokens promise no order, so nothing is sure to stop the woken \
             holder's write",
        ),
        (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, Redlock { .. }) => {
            e(
                F_SAFE,
                "every node's TTL runs out during the pause; the contender's majority shares a \
             node with the holder's fence round, so its token is larger and the woken \
             holder's write is rejected",
            )
        }
        (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, Etcd) => e(
            F_SAFE,
            "the leader expires the paused holder's lease; the contender's revision is \
             larger, so the woken holder's write is rejected",
        ),
        (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, Zk) => e(
            F_SAFE,
            "the paused holder's session expires; the contender's node has a larger czxid, \
             so the woken holder's write is rejected",
        ),
        (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, Postgres) => e(
            F_SAFE,
            "idle_in_transaction_session_timeout ends the paused holder's transaction; the \
             contender's committed nextval is larger, so the woken holder's write is rejected",
        ),

        // --- the holder's machine suspended past its TTL ------------------------------
        (Fault::ClientSuspend, _) => e(
            SAFE,
            "the servers' clocks run on and end the lease during the suspend, and the \
             contender is granted; the holder's guard counts the time suspended \
             (CLOCK_BOOTTIME) against its deadline, so on waking it knows the lease lost \
             and does not write",
        ),

        // --- a waiter's own queue record removed on the servers ----------------------
        (Fault::VanishedQueueRecord, Etcd) => e(
            SAFE,
            "a grant carries proof that the waiter's own key still exists (a txn comparing \
             its create revision): finding it gone when the holder releases, the waiter \
             queues again, behind the next waiter",
        ),
        (Fault::VanishedQueueRecord, Zk) => e(
            SAFE,
            "the waiter lists the queue when its predecessor goes: its own node is not in \
             it, so it queues again, behind the next waiter",
        ),
        (Fault::VanishedQueueRecord, Redis { .. } | Redlock { .. }) => e(
            NOT_APPLICABLE,
            "waiters keep no record on the servers: they retry when woken",
        ),
        (Fault::VanishedQueueRecord, Postgres) => e(
            NOT_APPLICABLE,
            "a waiter's place is its lock wait inside the server, which only ending its \
             session removes (the connection-cut cell)",
        ),

        // --- the replies to the holder's acquire (or release) arrive late ----------
        (Fault::DelayedReply, Redis { .. }) => e(
            SAFE,
            "the lease's deadline counts from the send: a grant delayed past its TTL \
             arrives expired and is never believed; a release is one script, which frees \
             the lock on arrival however late its reply",
        ),
        (Fault::DelayedReply, Redlock { .. }) => e(
            SAFE,
            "validity is ttl − elapsed − drift from before the first send: a grant delayed \
             past its TTL has none left and is refused; a release is one script per node, \
             all sent at once, each freeing its node on arrival",
        ),
        (Fault::DelayedReply, Etcd) => e(
            SAFE,
            "the lease's deadline counts from the lease grant's send: a late grant arrives \
             expired; a release deletes the grant's own key (its name carries the owner \
             and is never reused), applied on arrival",
        ),
        (Fault::DelayedReply, Zk) => e(
            SAFE,
            "the deadline is min(sent + ttl, anchor + session timeout), both fixed before \
             the reply: a late grant arrives expired; a release is one versioned delete, \
             applied on arrival",
        ),
        (Fault::DelayedReply, Postgres) => e(
            SAFE,
            "the deadline counts from the send, and the server's idle timer from its grant: \
             a late grant arrives expired; a release ends the holder's transaction on \
             arrival",
        ),

        // --- the server's wall clock jumps forward by 2 × the lease TTL + 1 s ----------
        (Fault::ClockJump, Redis { .. }) => e(
            F_SAFE,
            "Redis expires keys by its wall clock: the jump frees the key while the \
             holder's own deadline has not passed; the counter (or its clock floor, which \
             jumps too) still rises, so the stale write is rejected",
        ),
        (Fault::ClockJump, Redlock { fence: None }) => e(
            UNFENCED_VIOLATION,
            "the jump frees the key on the node both majorities share, so the contender \
             forms a majority while the holder's validity lasts; with fencing=false nothing \
             is sure to stop the stale write",
        ),
        (Fault::ClockJump, Redlock { .. }) => e(
            F_SAFE,
            "the jump frees the key on the node both majorities share, so the contender \
             forms a majority while the holder's validity lasts; that node kept the \
             holder's fence, so the contender's token is larger",
        ),
        (Fault::ClockJump, Etcd) => e(
            SAFE,
            "leases are timed by the leader's monotonic clock: a wall-clock jump expires \
             nothing",
        ),
        (Fault::ClockJump, Zk) => e(
            SAFE,
            "sessions are expired by the leader's monotonic clock: a wall-clock jump \
             expires nothing",
        ),
        (Fault::ClockJump, Postgres) => e(
            SAFE,
            "the idle timeout is an interval timer armed at the grant: a forward jump does \
             not fire it early",
        ),

        // --- the server crashes and restarts (Redis: without persistence) ------------
        (
            Fault::Restart,
            Redis {
                fence: Fence::Clock,
            },
        ) => e(
            SAFE_OR_F_SAFE,
            "the restarted server forgot the grant: a double grant unless the holder's \
             guard gave up while the server was down; the restarted counter is floored at \
             the server's clock (µs), above the holder's token",
        ),
        (
            Fault::Restart,
            Redis {
                fence: Fence::Counter,
            },
        ) => e(
            UNSAFE,
            "the INCR counter is forgotten with the data: the next grant of the key is \
             handed the holder's token again",
        ),
        (Fault::Restart, Redlock { fence: None }) => e(
            SAFE_OR_UNSAFE,
            "the node both majorities share restarts empty: a double grant unless the \
             holder's guard gave up meanwhile, and no fence to contain it",
        ),
        (Fault::Restart, Redlock { fence }) if fence == counter => e(
            ANY_CONTAINMENT,
            "the node both majorities share restarts empty, so the contender's majority \
             never saw the holder's count: both counts are equal, and only the owner-id \
             bits of the token decide whether the new one sorts above",
        ),
        (Fault::Restart, Redlock { .. }) => e(
            SAFE_OR_F_SAFE,
            "the node both majorities share restarts empty: a double grant unless the \
             holder's guard gave up meanwhile; its counter restarts at its clock (µs), above \
             the holder's token",
        ),
        (Fault::Restart, Etcd) => e(
            SAFE_OR_UNAVAIL,
            "the lease and the key are in the Raft log and survive the leader's restart: \
             the contender is granted once the holder lets go (UNAVAIL only if the election \
             outlasts its patience)",
        ),
        (Fault::Restart, Zk) => e(
            SAFE_OR_UNAVAIL,
            "the session and its ephemeral node are replicated and survive the leader's \
             restart: the contender is granted once the holder lets go (UNAVAIL only if the \
             election outlasts its patience)",
        ),
        (Fault::Restart, Postgres) => e(
            SAFE,
            "the restart ends the holder's transaction and closes its connection, which \
             its guard sees before the restarted server can grant; fence values were \
             flushed before they were handed out",
        ),

        // --- the holder's links are black-holed past the TTL -------------------------
        (Fault::Blackhole, Redis { .. } | Redlock { .. }) => e(
            SAFE,
            "the holder's renewals fail and its guard gives up at its deadline, counted \
             from a send; the server's TTL counts from later",
        ),
        (Fault::Blackhole, Etcd) => e(
            SAFE,
            "keep-alives fail and the guard gives up at its deadline, before the leader can \
             expire the lease",
        ),
        (Fault::Blackhole, Zk) => e(
            SAFE,
            "the guard gives up at min(sent + ttl, anchor + session timeout), before the \
             leader can expire the session",
        ),
        (Fault::Blackhole, Postgres) => e(
            SAFE,
            "the guard gives up at its deadline, counted from a send, before the server's \
             idle timeout ends the transaction",
        ),

        // --- the holder's connections are reset, and new ones refused ----------------
        (Fault::ConnectionCut, Redis { .. } | Redlock { .. } | Etcd) => e(
            SAFE,
            "the grant outlives the connection: the holder's renewals fail and its guard \
             gives up at its deadline, before the server frees the lock",
        ),
        (Fault::ConnectionCut, Zk) => e(
            SAFE,
            "the session outlives the connection: the guard gives up by its local deadline, \
             before the leader can expire the session",
        ),
        (Fault::ConnectionCut, Postgres) => e(
            SAFE,
            "the reset ends the holder's transaction at once; the closed connection is \
             pushed to its guard before a contender's grant, a round trip and a fence \
             commit later",
        ),

        // --- ⌊(n−1)/2⌋ of n servers are killed ---------------------------------------
        (Fault::MinorityLoss, _) if single => {
            e(NOT_APPLICABLE, "a single node has no minority to lose")
        }
        (Fault::MinorityLoss, Redlock { .. }) => e(
            SAFE,
            "the live masters are still a majority: every grant and release needs them \
             all, and they keep their counters",
        ),
        (Fault::MinorityLoss, _) => e(
            SAFE,
            "a majority of members remains: after an election, grants and releases commit \
             as before",
        ),

        // --- one server (the leader) is frozen with SIGSTOP --------------------------
        (Fault::ServerPause, _) if single => e(
            UNAVAIL,
            "the only server is frozen: no grant and no renewal until it resumes",
        ),
        (Fault::ServerPause, Redlock { .. }) => e(
            SAFE,
            "one frozen master: the holder keeps renewing on the others, and no contender \
             reaches a majority without it",
        ),
        (Fault::ServerPause, _) => e(
            SAFE_OR_UNAVAIL,
            "a frozen leader costs an election: requests stuck on its connections, or made \
             before a new leader is elected, time out",
        ),

        // --- failover to an asynchronous replica that missed the grant --------------
        (Fault::ReplicaFailover, Redlock { .. }) => {
            e(NOT_APPLICABLE, "independent masters without replicas")
        }
        (Fault::ReplicaFailover, Etcd | Zk) => e(
            NOT_APPLICABLE,
            "replication is synchronous consensus: a member without the grant cannot be \
             elected",
        ),
        (Fault::ReplicaFailover, Postgres) => e(
            SAFE_OR_UNSAFE,
            "the holder's transaction dies with the primary, but an asynchronous standby \
             may hand out fence values again",
        ),

        // --- Sentinel / Cluster: the primary dies while its replicas are behind ------
        (Fault::SentinelFailoverConfirmed, Redis { .. }) => e(
            SAFE,
            "no replica can confirm a grant, so wait_replicas refuses it and releases it: \
             nothing is lost in the failover, and the contender is granted on the promoted \
             replica, which the other replica now follows",
        ),
        (Fault::ClusterFailoverConfirmed, Redis { .. }) => e(
            UNAVAIL,
            "no replica can confirm a grant, so wait_replicas refuses it: nothing is lost; \
             but the promoted replica was its shard's only one, so no grant on it can be \
             confirmed either until a replica rejoins the shard",
        ),
        (Fault::SentinelConfirmingReplicaLost, Redis { fence }) => e(
            if fence == Fence::Clock {
                F_SAFE
            } else {
                UNSAFE
            },
            "wait_replicas narrows the window, it does not close it: the replica that \
             confirmed each grant died with the primary, the sentinels promoted the one that \
             missed them, and the contender is granted while the holder's lease runs (the \
             clock floor orders the tokens; a plain counter repeats the holder's)",
        ),
        (
            Fault::ReplicaFailover | Fault::SentinelFailover | Fault::ClusterFailover,
            Redis {
                fence: Fence::Clock,
            },
        ) => e(
            F_SAFE,
            "replication is asynchronous: the promoted replica missed the grant, so the \
             contender is granted while the holder's lease runs; the new primary floors \
             the fence at its clock, above the holder's token",
        ),
        (
            Fault::ReplicaFailover | Fault::SentinelFailover | Fault::ClusterFailover,
            Redis {
                fence: Fence::Counter,
            },
        ) => e(
            UNSAFE,
            "the promoted replica missed the grant and the counter: the contender is granted \
             while the holder's lease runs, with the holder's token",
        ),
        (
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed,
            _,
        ) => e(NOT_APPLICABLE, "a failover of a Redis deployment"),

        // --- the acquire reaches the server, its reply is lost ----------------------
        (Fault::LostReply, Redis { .. }) => e(SAFE, "the orphan key expires after its TTL"),
        (Fault::LostReply, Redlock { .. }) => e(
            SAFE,
            "the failed round releases every node it reached; what it missed expires after \
             the TTL",
        ),
        (Fault::LostReply, Etcd) => e(SAFE, "the orphan's lease is never kept alive and expires"),
        (Fault::LostReply, Zk) => e(
            SAFE,
            "the orphan is an ephemeral node of the holder's session: deleted by the \
             client's clean-up or when the session ends",
        ),
        (Fault::LostReply, Postgres) => e(
            SAFE,
            "the reset ends the orphan's transaction, which frees the row",
        ),

        // --- the holder is partitioned into a minority of the servers -----------------
        (Fault::MinorityPartition, Zk | Redlock { .. } | Etcd) if single => {
            e(NOT_APPLICABLE, "fewer than three servers: no minority side")
        }
        (Fault::MinorityPartition, Zk) => e(
            SAFE,
            "every grant and renewal is preceded by a sync through the leader: a follower \
             cut off from it cannot prove the lease",
        ),
        (Fault::MinorityPartition, Redlock { .. }) => e(
            SAFE,
            "a renewal needs a majority: the holder's guard gives up at its deadline, \
             counted from a send minus drift, before the majority side's TTL runs out and a \
             contender can be granted there",
        ),
        (Fault::MinorityPartition, Etcd) => e(
            SAFE,
            "keep-alives are answered by the leader: a member cut off from it cannot renew, \
             and the guard gives up at its deadline, before the leader expires the lease",
        ),
        (Fault::MinorityPartition, Redis { .. } | Postgres) => {
            e(NOT_APPLICABLE, "one server: no minority side")
        }

        // --- a stalled request lands after the client moved on -----------------------
        (Fault::StaleAcquire, Redis { .. } | Redlock { .. }) => e(
            SAFE,
            "every attempt (every Redlock round) has an owner id of its own, so a late \
             grant and its clean-up act only on that attempt (the clean-up goes behind \
             the grant on its connection, so it lands after it)",
        ),
        (Fault::StaleAcquire, Etcd | Zk | Postgres) => e(
            SAFE,
            "a late request acts only on the record it names (etcd key, ZooKeeper node, \
             Postgres session), never on the retry's",
        ),
        (Fault::StaleExtend, Redis { .. } | Redlock { .. }) => e(
            SAFE,
            "an extension never shortens the key's expiry: the late one is a no-op",
        ),
        (Fault::StaleExtend, Etcd) => e(
            SAFE,
            "a keep-alive renews the lease for its whole granted TTL: a late one only \
             lengthens it",
        ),
        (Fault::StaleExtend, Zk) => e(
            SAFE,
            "the session lives on the client's heartbeats, which only ever push its \
             expiry out: no request can shorten it",
        ),
        (Fault::StaleExtend, Postgres) => e(
            SAFE,
            "the transaction's idle timeout restarts with every statement: a late one only \
             lengthens it",
        ),
        (Fault::StaleRelease, _) => e(
            SAFE,
            "a release names the grant it ends (owner id, key revision, node, session): \
             a late one cannot end the next grant",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_comes_from_the_url() {
        let redis = |url| Config::of("redis", url, 1).unwrap().protocol;
        assert_eq!(
            redis("redis://h:1"),
            Protocol::Redis {
                fence: Fence::Clock
            }
        );
        assert_eq!(
            redis("redis://h:1/0?prefix=a&fence=counter"),
            Protocol::Redis {
                fence: Fence::Counter
            }
        );
        let redlock = |url| Config::of("redlock", url, 5).unwrap().protocol;
        assert_eq!(
            redlock("redlock://a:1,b:2?fencing=false"),
            Protocol::Redlock { fence: None }
        );
        assert_eq!(
            redlock("redlock://a:1,b:2?fence=counter"),
            Protocol::Redlock {
                fence: Some(Fence::Counter)
            }
        );
        assert!(Config::of("redis", "redis://h?fence=lamport", 1).is_err());
        assert!(Config::of("memory", "memory://", 1).is_err());
    }

    #[test]
    fn every_cell_has_a_reason_and_only_violations_need_fencing() {
        let configs = [
            Config::of("redis", "redis://h", 1).unwrap(),
            Config::of("redis", "redis://h?fence=counter", 1).unwrap(),
            Config::of("redlock", "redlock://h", 5).unwrap(),
            Config::of("redlock", "redlock://h?fence=counter", 5).unwrap(),
            Config::of("redlock", "redlock://h?fencing=false", 5).unwrap(),
            Config::of("etcd", "etcd://h", 3).unwrap(),
            Config::of("zk", "zk://h", 3).unwrap(),
            Config::of("zk", "zk://h", 1).unwrap(),
            Config::of("postgres", "postgres://h", 1).unwrap(),
        ];
        for config in configs {
            let fenced = config.premise().fencing != FencingKind::None;
            for fault in Fault::ALL {
                let cell = expect(&config, fault);
                assert!(!cell.reason.is_empty(), "{config:?} {fault:?}");
                // A backend with fencing never expects an uncontained violation unless
                // its tokens can regress (a counter lost with the data).
                if fenced && cell.verdicts.contains(&Verdict::Unsafe) {
                    assert!(
                        matches!(
                            (fault, config.protocol),
                            (
                                Fault::Restart
                                    | Fault::ReplicaFailover
                                    | Fault::SentinelFailover
                                    | Fault::SentinelConfirmingReplicaLost
                                    | Fault::ClusterFailover,
                                Protocol::Redis {
                                    fence: Fence::Counter
                                } | Protocol::Redlock {
                                    fence: Some(Fence::Counter)
                                } | Protocol::Postgres
                            )
                        ),
                        "{config:?} {fault:?}"
                    );
                }
            }
        }
    }
}
