//! Redlock's row of the matrix's table of expected verdicts (feature `testbed`): what each
//! fault must show on independent Redis masters, from how the protocol works. The cells it
//! shares with one Redis server are in `tenure_redis::verdicts`.

use std::sync::Arc;

use tenure_api::{ExpiryKind, FencingKind, Replication};
use tenure_conformance::faults::expect::{
    cell, url_option, Expect, Premise, Protocol, ANY_CONTAINMENT, CLIENT_SUSPEND, F_SAFE,
    GRANT_OUTLIVES_CONNECTION, NOT_APPLICABLE, NOT_A_REDIS_DEPLOYMENT, NO_MINORITY,
    NO_MINORITY_SIDE, NO_OTHER_RECIPE, ONLY_SERVER_FROZEN, SAFE, SAFE_OR_F_SAFE, STALE_RELEASE,
    UNFENCED_VIOLATION,
};
use tenure_conformance::faults::Fault;
use tenure_redis::verdicts::{Fence, BLACKHOLE, NO_WAITER_RECORDS, STALE_ACQUIRE, STALE_EXTEND};

/// Redlock over independent masters, with each node's fence counter (`None` with
/// `fencing=false`: no fence round).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RedlockProtocol {
    /// Each node's fence counter.
    pub(crate) fence: Option<Fence>,
}

/// Reads the row of a `redlock://` URL.
pub(crate) fn protocol(url: &str) -> Result<Arc<dyn Protocol>, String> {
    let fence = match (url_option(url, "fencing"), Fence::of(url)?) {
        (_, Fence::None) => return Err("fence=none: Redlock's is fencing=false".into()),
        (Some("false"), _) => None,
        (_, fence) => Some(fence),
    };
    Ok(Arc::new(RedlockProtocol { fence }))
}

impl Protocol for RedlockProtocol {
    fn premise(&self, nodes: usize) -> Premise {
        Premise {
            fencing: match self.fence {
                Some(_) => FencingKind::QuorumRegister,
                None => FencingKind::None,
            },
            expiry: ExpiryKind::ServerTtl,
            replication: Replication::IndependentQuorum { nodes },
            failures_tolerated: nodes.saturating_sub(1) / 2,
            clock_dependent: true,
        }
    }

    fn expect(&self, fault: Fault, nodes: usize) -> Expect {
        let single = nodes < 3;
        match (fault, self.fence) {
            (Fault::PausedLeader, None) => cell(
                NOT_APPLICABLE,
                "no fencing tokens, so no terms: Election refuses this configuration",
            ),
            (Fault::PausedHolder | Fault::PausedPermitHolder, None) => cell(
                UNFENCED_VIOLATION,
                "every node's TTL runs out during the pause and the contender is granted; \
                 with fencing=false tokens promise no order, so nothing is sure to stop the \
                 woken holder's write",
            ),
            (Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader, _) => cell(
                F_SAFE,
                "every node's TTL runs out during the pause; the contender's majority shares \
                 a node with the holder's fence round, so its token is larger and the woken \
                 holder's write is rejected",
            ),
            (Fault::PausedReader, _) => cell(NOT_APPLICABLE, "Redlock has no shared (read) locks"),
            (Fault::ClientSuspend, _) => CLIENT_SUSPEND,
            (Fault::VanishedQueueRecord, _) => NO_WAITER_RECORDS,
            (Fault::MixedFleet, _) => NO_OTHER_RECIPE,
            (Fault::DelayedReply, _) => cell(
                SAFE,
                "validity is ttl − elapsed − drift from before the first send: a grant \
                 delayed past its TTL has none left and is refused; a release is one script \
                 per node, all sent at once, each freeing its node on arrival",
            ),
            (Fault::ClockJump, None) => cell(
                UNFENCED_VIOLATION,
                "the jump frees the key on the node both majorities share, so the contender \
                 forms a majority while the holder's validity lasts; with fencing=false \
                 nothing is sure to stop the stale write",
            ),
            (Fault::ClockJump, _) => cell(
                F_SAFE,
                "the jump frees the key on the node both majorities share, so the contender \
                 forms a majority while the holder's validity lasts; that node kept the \
                 holder's fence, so the contender's token is larger",
            ),
            // (`Some(Fence::None)` is refused when the row is read.)
            (Fault::Restart, None | Some(Fence::None)) => cell(
                ANY_CONTAINMENT,
                "the node both majorities share restarts empty: a double grant unless the \
                 holder's guard gave up meanwhile, contained only if the clients' clocks \
                 happen to order the two tokens (fencing=false: a token's count is its \
                 client's clock)",
            ),
            (Fault::Restart, Some(Fence::Counter)) => cell(
                ANY_CONTAINMENT,
                "the node both majorities share restarts empty, so the contender's majority \
                 never saw the holder's count: both counts are equal, and only the owner-id \
                 bits of the token decide whether the new one sorts above",
            ),
            (Fault::Restart, Some(Fence::Clock)) => cell(
                SAFE_OR_F_SAFE,
                "the node both majorities share restarts empty: a double grant unless the \
                 holder's guard gave up meanwhile; its counter restarts at its clock (µs), \
                 above the holder's token",
            ),
            (Fault::Blackhole, _) => BLACKHOLE,
            (Fault::ConnectionCut, _) => GRANT_OUTLIVES_CONNECTION,
            (Fault::MinorityLoss, _) if single => NO_MINORITY,
            (Fault::MinorityLoss, _) => cell(
                SAFE,
                "the live masters are still a majority: every grant and release needs them \
                 all, and they keep their counters",
            ),
            (Fault::ServerPause, _) if single => ONLY_SERVER_FROZEN,
            (Fault::ServerPause, _) => cell(
                SAFE,
                "one frozen master: the holder keeps renewing on the others, and no \
                 contender reaches a majority without it",
            ),
            (Fault::ReplicaFailover, _) => {
                cell(NOT_APPLICABLE, "independent masters without replicas")
            }
            (
                Fault::SentinelFailover
                | Fault::SentinelFailoverConfirmed
                | Fault::SentinelConfirmingReplicaLost
                | Fault::ClusterFailover
                | Fault::ClusterFailoverConfirmed,
                _,
            ) => NOT_A_REDIS_DEPLOYMENT,
            (Fault::LostReply, _) => cell(
                SAFE,
                "the failed round releases every node it reached; what it missed expires \
                 after the TTL",
            ),
            (Fault::MinorityPartition, _) if single => NO_MINORITY_SIDE,
            (Fault::MinorityPartition, _) => cell(
                SAFE,
                "a renewal needs a majority: the holder's guard gives up at its deadline, \
                 counted from a send minus drift, before the majority side's TTL runs out \
                 and a contender can be granted there",
            ),
            (Fault::StaleAcquire, _) => STALE_ACQUIRE,
            (Fault::StaleExtend, _) => STALE_EXTEND,
            (Fault::StaleRelease, _) => STALE_RELEASE,
        }
    }
}

#[cfg(test)]
mod tests {
    use tenure_conformance::faults::expect::Config;
    use tenure_conformance::faults::Verdict;

    use super::*;
    use crate::lab::TESTBED;

    fn config(url: &str) -> Config {
        Config::of(&TESTBED, url, 5).unwrap()
    }

    #[test]
    fn the_fence_comes_from_the_url() {
        let fence = |url| format!("{:?}", config(url).protocol);
        assert!(fence("redlock://a:1,b:2?fencing=false").contains("fence: None"));
        assert!(fence("redlock://a:1,b:2?fence=counter").contains("Some(Counter)"));
        assert!(fence("redlock://a:1,b:2").contains("Some(Clock)"));
        assert!(Config::of(&TESTBED, "redlock://h?fence=lamport", 5).is_err());
    }

    /// A fenced Redlock lets a double grant go uncontained only where a restarted node's
    /// plain counter repeats a count; without fencing, every violation may.
    #[test]
    fn only_a_lost_count_or_no_fence_allows_an_uncontained_violation() {
        assert_eq!(config("redlock://h").allowing(Verdict::Unsafe), []);
        assert_eq!(
            config("redlock://h?fence=counter").allowing(Verdict::Unsafe),
            [Fault::Restart]
        );
        assert_eq!(
            config("redlock://h?fencing=false").allowing(Verdict::Unsafe),
            [
                Fault::PausedHolder,
                Fault::PausedPermitHolder,
                Fault::ClockJump,
                Fault::Restart
            ]
        );
    }
}
