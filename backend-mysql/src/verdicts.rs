//! MySQL's row of the matrix's table of expected verdicts (feature `testbed`): what each
//! fault must show on one MySQL or MariaDB server, from how `GET_LOCK` works.

use tenure_api::{ExpiryKind, FencingKind};
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, Expect, Premise, Protocol, CLIENT_SUSPEND, F_SAFE,
    LATE_REQUEST_NAMES_ITS_RECORD, NOT_APPLICABLE, NOT_A_REDIS_DEPLOYMENT, NO_OTHER_RECIPE,
    ONE_SERVER_NO_MINORITY_SIDE, SAFE, SAFE_OR_F_SAFE, SAFE_OR_UNSAFE, STALE_RELEASE,
};
use tenure_conformance::faults::Fault;

/// One server; a lock is its session's, ended by the session's `wait_timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MySqlProtocol;

impl Protocol for MySqlProtocol {
    fn premise(&self, _nodes: usize) -> Premise {
        Premise::single_node(
            FencingKind::Sequence,
            ExpiryKind::ConnectionTransaction,
            false,
        )
    }

    fn expect(&self, fault: Fault, nodes: usize) -> Expect {
        match fault {
            Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader => cell(
                F_SAFE,
                "wait_timeout ends the paused holder's session, which frees its named lock; \
                 the contender's committed counter is larger, so the woken holder's write \
                 is rejected",
            ),
            Fault::PausedReader => cell(NOT_APPLICABLE, "no shared (read) locks"),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::MixedFleet => NO_OTHER_RECIPE,
            Fault::VanishedQueueRecord => cell(
                NOT_APPLICABLE,
                "a waiter's place is its GET_LOCK wait inside the server, which only ending \
                 its session removes (the connection-cut cell)",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the deadline counts from the send, and the server's idle timer from its \
                 last statement: a late grant arrives expired; a release ends the hold on \
                 arrival",
            ),
            Fault::ClockJump => cell(
                SAFE,
                "the server times an idle session on its monotonic clock (a poll timeout): \
                 a wall-clock step moves no deadline",
            ),
            Fault::Restart => cell(
                SAFE,
                "the restart ends the holder's session and closes its connection, which its \
                 guard sees before the restarted server can grant; counters were committed \
                 before they were handed out",
            ),
            Fault::Blackhole => cell(
                SAFE,
                "the guard gives up at its deadline, counted from a send, before the \
                 server's wait_timeout (whole seconds, rounded up) ends the session",
            ),
            Fault::ConnectionCut => cell(
                SAFE_OR_F_SAFE,
                "the reset ends the holder's session at once; its guard sees the closed \
                 socket at its next peek (every 50 ms: the client library's socket cannot \
                 be waited on), and a contender granted sooner holds a larger committed \
                 token, so the stale write is rejected",
            ),
            Fault::MinorityLoss => minority_lost(nodes),
            Fault::ServerPause => server_frozen(nodes),
            Fault::ReplicaFailover => cell(
                SAFE_OR_UNSAFE,
                "named locks are not replicated, and an asynchronous replica may hand out \
                 counter values again",
            ),
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::LostReply => cell(
                SAFE,
                "the reset ends the orphan's session, which frees its named lock",
            ),
            Fault::MinorityPartition => ONE_SERVER_NO_MINORITY_SIDE,
            Fault::StaleAcquire => LATE_REQUEST_NAMES_ITS_RECORD,
            Fault::StaleExtend => cell(
                SAFE,
                "the session's idle timer restarts with every statement: a late one only \
                 lengthens it",
            ),
            Fault::StaleRelease => STALE_RELEASE,
        }
    }
}

#[cfg(test)]
mod tests {
    use tenure_conformance::faults::expect::Config;
    use tenure_conformance::faults::Verdict;

    use super::*;
    use crate::lab::TESTBED;

    /// Only a failover to an asynchronous replica lets a double grant go uncontained.
    #[test]
    fn only_a_replica_failover_allows_an_uncontained_violation() {
        let config = Config::of(&TESTBED, "mysql://h/db", 1).unwrap();
        assert_eq!(config.allowing(Verdict::Unsafe), [Fault::ReplicaFailover]);
        assert!(!config.premise().clock_dependent);
    }
}
