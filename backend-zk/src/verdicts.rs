//! ZooKeeper's row of the matrix's table of expected verdicts (feature `testbed`): what
//! each fault must show on a Zab ensemble, from how the protocol works.

use tenure_api::ExpiryKind;
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, Expect, Premise, Protocol, CLIENT_SUSPEND, F_SAFE,
    LATE_REQUEST_NAMES_ITS_RECORD, NOT_A_REDIS_DEPLOYMENT, NO_ASYNC_REPLICA, NO_MINORITY_SIDE,
    SAFE, SAFE_OR_UNAVAIL, STALE_RELEASE,
};
use tenure_conformance::faults::Fault;

/// ZooKeeper (Zab): no URL option changes a verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ZkProtocol;

impl Protocol for ZkProtocol {
    fn premise(&self, members: usize) -> Premise {
        Premise::consensus(ExpiryKind::SessionHeartbeat, members)
    }

    fn expect(&self, fault: Fault, members: usize) -> Expect {
        let single = members < 3;
        match fault {
            Fault::PausedHolder
            | Fault::PausedPermitHolder
            | Fault::PausedLeader
            | Fault::PausedReader => cell(
                F_SAFE,
                "the paused holder's session expires; the contender's node has a larger \
                 czxid, so the woken holder's write is rejected",
            ),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::MixedFleet => cell(
                SAFE,
                "tenure names its nodes as Curator does and both order every contender by the sequence ZooKeeper appended: one queue, one holder",
            ),
            Fault::VanishedQueueRecord => cell(
                SAFE,
                "the waiter lists the queue when its predecessor goes: its own node is not \
                 in it, so it queues again, behind the next waiter",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the deadline is min(sent + ttl, anchor + session timeout), both fixed \
                 before the reply: a late grant arrives expired; a release is one versioned \
                 delete, applied on arrival",
            ),
            Fault::ClockJump => cell(
                SAFE,
                "sessions are expired by the leader's monotonic clock: a wall-clock jump \
                 expires nothing",
            ),
            Fault::Restart => cell(
                SAFE_OR_UNAVAIL,
                "the session and its ephemeral node are replicated and survive the leader's \
                 restart: the contender is granted once the holder lets go (UNAVAIL only if \
                 the election outlasts its patience)",
            ),
            Fault::Blackhole => cell(
                SAFE,
                "the guard gives up at min(sent + ttl, anchor + session timeout), before \
                 the leader can expire the session",
            ),
            Fault::ConnectionCut => cell(
                SAFE,
                "the session outlives the connection: the guard gives up by its local \
                 deadline, before the leader can expire the session",
            ),
            Fault::MinorityLoss => minority_lost(members),
            Fault::ServerPause => server_frozen(members),
            Fault::ReplicaFailover => NO_ASYNC_REPLICA,
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::LostReply => cell(
                SAFE,
                "the orphan is an ephemeral node of the holder's session: deleted by the \
                 client's clean-up or when the session ends",
            ),
            Fault::MinorityPartition if single => NO_MINORITY_SIDE,
            Fault::MinorityPartition => cell(
                SAFE,
                "every grant and renewal is preceded by a sync through the leader: a \
                 follower cut off from it cannot prove the lease",
            ),
            Fault::StaleAcquire => LATE_REQUEST_NAMES_ITS_RECORD,
            Fault::StaleExtend => cell(
                SAFE,
                "the session lives on the client's heartbeats, which only ever push its \
                 expiry out: no request can shorten it",
            ),
            Fault::StaleRelease => STALE_RELEASE,
        }
    }
}

#[cfg(test)]
mod tests {
    use tenure_conformance::faults::expect::{Config, NO_MINORITY, ONLY_SERVER_FROZEN};
    use tenure_conformance::faults::Verdict;

    use super::*;
    use crate::lab::TESTBED;

    /// Consensus orders every grant: no fault may show a double grant fencing did not
    /// contain, on an ensemble or on one server.
    #[test]
    fn no_fault_allows_an_uncontained_violation() {
        for members in [1, 3] {
            let config = Config::of(&TESTBED, "zk://h", members).unwrap();
            assert_eq!(config.allowing(Verdict::Unsafe), [], "{members}");
        }
        let one = Config::of(&TESTBED, "zk://h", 1).unwrap();
        assert_eq!(one.expect(Fault::MinorityLoss), NO_MINORITY);
        assert_eq!(one.expect(Fault::ServerPause), ONLY_SERVER_FROZEN);
    }
}
