//! etcd's row of the matrix's table of expected verdicts (feature `testbed`): what each
//! fault must show on a Raft cluster, from how the protocol works.

use tenure_api::ExpiryKind;
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, Expect, Premise, Protocol, CLIENT_SUSPEND, F_SAFE,
    GRANT_OUTLIVES_CONNECTION, LATE_REQUEST_NAMES_ITS_RECORD, NOT_A_REDIS_DEPLOYMENT,
    NO_ASYNC_REPLICA, NO_MINORITY_SIDE, SAFE, SAFE_OR_UNAVAIL, STALE_RELEASE,
};
use tenure_conformance::faults::Fault;

/// etcd (Raft): no URL option changes a verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EtcdProtocol;

impl Protocol for EtcdProtocol {
    fn premise(&self, members: usize) -> Premise {
        Premise::consensus(ExpiryKind::LeaderTimedLease, members)
    }

    fn expect(&self, fault: Fault, members: usize) -> Expect {
        let single = members < 3;
        match fault {
            Fault::PausedHolder
            | Fault::PausedPermitHolder
            | Fault::PausedLeader
            | Fault::PausedReader => cell(
                F_SAFE,
                "the leader expires the paused holder's lease; the contender's revision is \
                 larger, so the woken holder's write is rejected",
            ),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::MixedFleet => cell(
                SAFE,
                "etcdctl lock (Go's concurrency.Mutex) and tenure queue keys under one prefix, each waiting for every key of a smaller create revision",
            ),
            Fault::VanishedQueueRecord => cell(
                SAFE,
                "a grant carries proof that the waiter's own key still exists (a txn \
                 comparing its create revision): finding it gone when the holder releases, \
                 the waiter queues again, behind the next waiter",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the lease's deadline counts from the lease grant's send: a late grant \
                 arrives expired; a release deletes the grant's own key (its name carries \
                 the owner and is never reused), applied on arrival",
            ),
            Fault::ClockJump => cell(
                SAFE,
                "leases are timed by the leader's monotonic clock: a wall-clock jump \
                 expires nothing",
            ),
            Fault::Restart => cell(
                SAFE_OR_UNAVAIL,
                "the lease and the key are in the Raft log and survive the leader's \
                 restart: the contender is granted once the holder lets go (UNAVAIL only if \
                 the election outlasts its patience)",
            ),
            Fault::Blackhole => cell(
                SAFE,
                "keep-alives fail and the guard gives up at its deadline, before the leader \
                 can expire the lease",
            ),
            Fault::ConnectionCut => GRANT_OUTLIVES_CONNECTION,
            Fault::MinorityLoss => minority_lost(members),
            Fault::ServerPause => server_frozen(members),
            Fault::ReplicaFailover => NO_ASYNC_REPLICA,
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::LostReply => cell(SAFE, "the orphan's lease is never kept alive and expires"),
            Fault::MinorityPartition if single => NO_MINORITY_SIDE,
            Fault::MinorityPartition => cell(
                SAFE,
                "keep-alives are answered by the leader: a member cut off from it cannot \
                 renew, and the guard gives up at its deadline, before the leader expires \
                 the lease",
            ),
            Fault::StaleAcquire => LATE_REQUEST_NAMES_ITS_RECORD,
            Fault::StaleExtend => cell(
                SAFE,
                "a keep-alive renews the lease for its whole granted TTL: a late one only \
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

    use crate::lab::TESTBED;

    /// Consensus orders every grant: no fault may show a double grant fencing did not
    /// contain.
    #[test]
    fn no_fault_allows_an_uncontained_violation() {
        for members in [1, 3, 5] {
            let config = Config::of(&TESTBED, "etcd://h", members).unwrap();
            assert_eq!(config.allowing(Verdict::Unsafe), [], "{members}");
        }
    }
}
