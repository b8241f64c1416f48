//! Postgres's row of the matrix's table of expected verdicts (feature `testbed`): what
//! each fault must show on one PostgreSQL server, from how the protocol works.

use tenure_api::{ExpiryKind, FencingKind};
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, Expect, Premise, Protocol, CLIENT_SUSPEND, F_SAFE,
    LATE_REQUEST_NAMES_ITS_RECORD, NOT_APPLICABLE, NOT_A_REDIS_DEPLOYMENT, NO_OTHER_RECIPE,
    ONE_SERVER_NO_MINORITY_SIDE, SAFE, SAFE_OR_UNSAFE, STALE_RELEASE,
};
use tenure_conformance::faults::Fault;

/// One PostgreSQL server: no URL option changes a verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PostgresProtocol;

impl Protocol for PostgresProtocol {
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
                "idle_in_transaction_session_timeout ends the paused holder's transaction; \
                 the contender's committed nextval is larger, so the woken holder's write \
                 is rejected",
            ),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::MixedFleet => NO_OTHER_RECIPE,
            Fault::VanishedQueueRecord => cell(
                NOT_APPLICABLE,
                "a waiter's place is its lock wait inside the server, which only ending its \
                 session removes (the connection-cut cell)",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the deadline counts from the send, and the server's idle timer from its \
                 grant: a late grant arrives expired; a release ends the holder's \
                 transaction on arrival",
            ),
            Fault::ClockJump => cell(
                SAFE,
                "the idle timeout is an interval timer armed at the grant: a forward jump \
                 does not fire it early",
            ),
            Fault::Restart => cell(
                SAFE,
                "the restart ends the holder's transaction and closes its connection, which \
                 its guard sees before the restarted server can grant; fence values were \
                 flushed before they were handed out",
            ),
            Fault::Blackhole => cell(
                SAFE,
                "the guard gives up at its deadline, counted from a send, before the \
                 server's idle timeout ends the transaction",
            ),
            Fault::ConnectionCut => cell(
                SAFE,
                "the reset ends the holder's transaction at once; the closed connection is \
                 pushed to its guard before a contender's grant, a round trip and a fence \
                 commit later",
            ),
            Fault::MinorityLoss => minority_lost(nodes),
            Fault::ServerPause => server_frozen(nodes),
            Fault::ReplicaFailover => cell(
                SAFE_OR_UNSAFE,
                "the holder's transaction dies with the primary, but an asynchronous \
                 standby may hand out fence values again",
            ),
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::LostReply => cell(
                SAFE,
                "the reset ends the orphan's transaction, which frees the row",
            ),
            Fault::MinorityPartition => ONE_SERVER_NO_MINORITY_SIDE,
            Fault::StaleAcquire => LATE_REQUEST_NAMES_ITS_RECORD,
            Fault::StaleExtend => cell(
                SAFE,
                "the transaction's idle timeout restarts with every statement: a late one \
                 only lengthens it",
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

    /// Only a failover to an asynchronous standby, which may hand out fence values again,
    /// lets a double grant go uncontained.
    #[test]
    fn only_a_standby_failover_allows_an_uncontained_violation() {
        let config = Config::of(&TESTBED, "postgres://h/db", 1).unwrap();
        assert_eq!(config.allowing(Verdict::Unsafe), [Fault::ReplicaFailover]);
    }
}
