//! Redis's row of the matrix's table of expected verdicts (feature `testbed`), and the
//! cells Redlock's row shares with it: what each fault must show on one Redis server, from
//! how the protocol works.

use std::sync::Arc;

use tenure_api::{ExpiryKind, FencingKind};
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, url_option, Expect, Premise, Protocol, ANY_CONTAINMENT,
    CLIENT_SUSPEND, F_SAFE, GRANT_OUTLIVES_CONNECTION, NOT_APPLICABLE, ONE_SERVER_NO_MINORITY_SIDE,
    SAFE, SAFE_OR_F_SAFE, STALE_RELEASE, UNAVAIL, UNFENCED_VIOLATION, UNSAFE,
};
use tenure_conformance::faults::Fault;

/// How a Redis node advances its per-key fence counter (the `fence` URL option).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// `max(counter + 1, server time in µs)` (the default).
    Clock,
    /// A plain `INCR`.
    Counter,
    /// No counter (`fence=none`): tokens promise no order.
    None,
}

impl Fence {
    /// The fence counter `url` asks for.
    pub fn of(url: &str) -> Result<Fence, String> {
        match url_option(url, "fence") {
            None | Some("clock") => Ok(Fence::Clock),
            Some("counter") => Ok(Fence::Counter),
            Some("none") => Ok(Fence::None),
            Some(other) => Err(format!("fence={other:?}: expected clock, counter or none")),
        }
    }
}

/// One Redis server, with its fence counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisProtocol {
    /// Its fence counter.
    pub fence: Fence,
}

/// Reads the row of a `redis://` URL.
pub(crate) fn protocol(url: &str) -> Result<Arc<dyn Protocol>, String> {
    Ok(Arc::new(RedisProtocol {
        fence: Fence::of(url)?,
    }))
}

/// A holder's links black-holed: renewals fail where the TTL counts from later.
pub const BLACKHOLE: Expect = cell(
    SAFE,
    "the holder's renewals fail and its guard gives up at its deadline, counted from a \
     send; the server's TTL counts from later",
);

/// Waiters keep no record on the servers.
pub const NO_WAITER_RECORDS: Expect = cell(
    NOT_APPLICABLE,
    "waiters keep no record on the servers: they retry when woken",
);

/// A stalled acquire: every attempt has an owner id of its own.
pub const STALE_ACQUIRE: Expect = cell(
    SAFE,
    "every attempt (every Redlock round) has an owner id of its own, so a late grant and \
     its clean-up act only on that attempt (the clean-up goes behind the grant on its \
     connection, so it lands after it)",
);

/// A stalled extension: `PEXPIRE` only ever lengthens.
pub const STALE_EXTEND: Expect = cell(
    SAFE,
    "an extension never shortens the key's expiry: the late one is a no-op",
);

/// The cells of `fence=none` that differ from the fenced modes': wherever a fenced mode
/// counts on the token to contain a double grant, nothing is sure to (a token's count is
/// the granting client's clock, so a later grant's is larger only by luck of the clocks).
fn unfenced(fault: Fault) -> Option<Expect> {
    let reason = match fault {
        Fault::PausedLeader => {
            return Some(cell(
                NOT_APPLICABLE,
                "no fencing tokens, so no terms: Election refuses fence=none",
            ))
        }
        Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedReader => {
            "the key's TTL runs out during the pause and the contender is granted; with \
             fence=none tokens promise no order, so nothing is sure to stop the woken \
             holder's write"
        }
        Fault::ClockJump => {
            "Redis expires keys by its wall clock: the jump frees the key while the holder's \
             own deadline has not passed; with fence=none nothing is sure to stop the stale \
             write"
        }
        Fault::Restart => {
            return Some(cell(
                ANY_CONTAINMENT,
                "the restarted server forgot the grant: a double grant unless the holder's \
                 guard gave up while the server was down, contained only if the clocks \
                 happen to order the two tokens",
            ))
        }
        Fault::ReplicaFailover
        | Fault::SentinelFailover
        | Fault::ClusterFailover
        | Fault::SentinelConfirmingReplicaLost => {
            "the promoted replica missed the grant: the contender is granted while the \
             holder's lease runs, and with fence=none nothing is sure to stop the stale write"
        }
        _ => return None,
    };
    Some(cell(UNFENCED_VIOLATION, reason))
}

impl Protocol for RedisProtocol {
    fn premise(&self, _nodes: usize) -> Premise {
        let fencing = match self.fence {
            Fence::Clock => FencingKind::ClockFlooredCounter,
            Fence::Counter => FencingKind::SingleNodeCounter,
            Fence::None => FencingKind::None,
        };
        Premise::single_node(fencing, ExpiryKind::ServerTtl, true)
    }

    /// On `nodes` hosts of the URL (one, or a Sentinel group's or a Cluster's seeds).
    fn expect(&self, fault: Fault, nodes: usize) -> Expect {
        let clock = self.fence == Fence::Clock;
        if self.fence == Fence::None {
            if let Some(unfenced) = unfenced(fault) {
                return unfenced;
            }
        }
        match fault {
            // (A semaphore's permit is a lock of its own, and an election's leadership is
            // its lock: the same protocol, the same verdicts.)
            Fault::PausedHolder
            | Fault::PausedPermitHolder
            | Fault::PausedLeader
            | Fault::PausedReader => cell(
                F_SAFE,
                "the key's TTL runs out during the pause and the contender is granted; its \
                 token comes from the same counter, larger, so the woken holder's write is \
                 rejected",
            ),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::VanishedQueueRecord => NO_WAITER_RECORDS,
            Fault::MixedFleet => cell(
                SAFE,
                "redis-py and tenure set one string key only where none is: whoever set it holds until it is deleted or expires",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the lease's deadline counts from the send: a grant delayed past its TTL \
                 arrives expired and is never believed; a release is one script, which \
                 frees the lock on arrival however late its reply",
            ),
            Fault::ClockJump => cell(
                F_SAFE,
                "Redis expires keys by its wall clock: the jump frees the key while the \
                 holder's own deadline has not passed; the counter (or its clock floor, \
                 which jumps too) still rises, so the stale write is rejected",
            ),
            Fault::Restart if clock => cell(
                SAFE_OR_F_SAFE,
                "the restarted server forgot the grant: a double grant unless the holder's \
                 guard gave up while the server was down; the restarted counter is floored \
                 at the server's clock (µs), above the holder's token",
            ),
            Fault::Restart => cell(
                UNSAFE,
                "the INCR counter is forgotten with the data: the next grant of the key is \
                 handed the holder's token again",
            ),
            Fault::Blackhole => BLACKHOLE,
            Fault::ConnectionCut => GRANT_OUTLIVES_CONNECTION,
            Fault::MinorityLoss => minority_lost(nodes),
            Fault::ServerPause => server_frozen(nodes),
            // --- Sentinel / Cluster: the primary dies while its replicas are behind ----
            Fault::SentinelFailoverConfirmed => cell(
                SAFE,
                "no replica can confirm a grant, so wait_replicas refuses it and releases \
                 it: nothing is lost in the failover, and the contender is granted on the \
                 promoted replica, which the other replica now follows",
            ),
            Fault::ClusterFailoverConfirmed => cell(
                UNAVAIL,
                "no replica can confirm a grant, so wait_replicas refuses it: nothing is \
                 lost; but the promoted replica was its shard's only one, so no grant on it \
                 can be confirmed either until a replica rejoins the shard",
            ),
            Fault::SentinelConfirmingReplicaLost => cell(
                if clock { F_SAFE } else { UNSAFE },
                "wait_replicas narrows the window, it does not close it: the replica that \
                 confirmed each grant died with the primary, the sentinels promoted the one \
                 that missed them, and the contender is granted while the holder's lease \
                 runs (the clock floor orders the tokens; a plain counter repeats the \
                 holder's)",
            ),
            Fault::ReplicaFailover | Fault::SentinelFailover | Fault::ClusterFailover if clock => {
                cell(
                    F_SAFE,
                    "replication is asynchronous: the promoted replica missed the grant, so \
                     the contender is granted while the holder's lease runs; the new primary \
                     floors the fence at its clock, above the holder's token",
                )
            }
            Fault::ReplicaFailover | Fault::SentinelFailover | Fault::ClusterFailover => cell(
                UNSAFE,
                "the promoted replica missed the grant and the counter: the contender is \
                 granted while the holder's lease runs, with the holder's token",
            ),
            Fault::LostReply => cell(SAFE, "the orphan key expires after its TTL"),
            Fault::MinorityPartition => ONE_SERVER_NO_MINORITY_SIDE,
            Fault::StaleAcquire => STALE_ACQUIRE,
            Fault::StaleExtend => STALE_EXTEND,
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

    fn config(url: &str) -> Config {
        Config::of(&TESTBED, url, 1).unwrap()
    }

    #[test]
    fn the_fence_comes_from_the_url() {
        assert_eq!(Fence::of("redis://h:1"), Ok(Fence::Clock));
        assert_eq!(
            Fence::of("redis://h:1/0?prefix=a&fence=counter"),
            Ok(Fence::Counter)
        );
        assert_eq!(
            Fence::of("redis://h:1/0?fence=counter&fence=clock"),
            Ok(Fence::Clock)
        );
        let error = Config::of(&TESTBED, "redis://h?fence=lamport", 1).unwrap_err();
        assert!(error.contains("fence=\"lamport\""), "{error}");
    }

    /// Without a fence, every fault a fence contains may go uncontained, and an election
    /// does not apply.
    #[test]
    fn without_a_fence_every_double_grant_may_go_uncontained() {
        let config = config("redis://h?fence=none");
        assert_eq!(
            config.allowing(Verdict::Unsafe),
            [
                Fault::PausedHolder,
                Fault::PausedPermitHolder,
                Fault::PausedReader,
                Fault::ClockJump,
                Fault::Restart,
                Fault::ReplicaFailover,
                Fault::SentinelFailover,
                Fault::SentinelConfirmingReplicaLost,
                Fault::ClusterFailover,
            ]
        );
        assert_eq!(
            RedisProtocol { fence: Fence::None }.premise(1).fencing,
            FencingKind::None
        );
    }

    /// Only a counter lost with the data lets a double grant go uncontained; the clock
    /// floor contains every one.
    #[test]
    fn only_a_plain_counter_allows_an_uncontained_violation() {
        assert_eq!(config("redis://h").allowing(Verdict::Unsafe), []);
        assert_eq!(
            config("redis://h?fence=counter").allowing(Verdict::Unsafe),
            [
                Fault::Restart,
                Fault::ReplicaFailover,
                Fault::SentinelFailover,
                Fault::SentinelConfirmingReplicaLost,
                Fault::ClusterFailover,
            ]
        );
    }
}
