//! The file backend's row of the matrix's table of expected verdicts (feature `testbed`):
//! what each fault must show on a lock directory, from how the protocol works.

use tenure_api::{ExpiryKind, FencingKind};
use tenure_conformance::faults::expect::{
    cell, Expect, Premise, Protocol, NOT_APPLICABLE, NOT_A_REDIS_DEPLOYMENT, NO_MINORITY,
    NO_OTHER_RECIPE, UNAVAIL,
};
use tenure_conformance::faults::Fault;

/// Open-file-description locks on one host, a clock-floored counter in a state file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileProtocol;

/// No network between a client and its lock: each call is a system call.
pub(crate) const NO_NETWORK: Expect = cell(
    NOT_APPLICABLE,
    "no network: each call is a system call on this host, answered or failed at once",
);

/// No server process: the lock is the kernel's.
pub(crate) const NO_SERVER: Expect = cell(
    NOT_APPLICABLE,
    "no server: the kernel holds the lock for as long as its holder's open file",
);

/// The TTL is the holder's own.
pub(crate) const NO_SERVER_CLOCK: Expect = cell(
    NOT_APPLICABLE,
    "no server clock: the kernel holds the lock, and the TTL runs on the holder's monotonic \
     clock",
);

/// One host.
pub(crate) const NO_MINORITY_SIDE: Expect = cell(NOT_APPLICABLE, "one host: no minority side");

/// One host's files.
pub(crate) const NO_REPLICA: Expect = cell(NOT_APPLICABLE, "one host's files: no replica");

/// Waiters poll.
pub(crate) const NO_WAITER_RECORD: Expect = cell(
    NOT_APPLICABLE,
    "waiters keep no record: they try again after each pause",
);

/// A stopped holder keeps its open file, so its lock.
const STOPPED_HOLDER_KEEPS_IT: Expect = cell(
    UNAVAIL,
    "the kernel keeps the lock of a stopped process's open file, and its lease's task, \
     which gives it up at the TTL, is stopped with it: the contender is never granted \
     beside it, and waits until it runs again",
);

impl Protocol for FileProtocol {
    fn premise(&self, _nodes: usize) -> Premise {
        Premise::single_node(
            FencingKind::ClockFlooredCounter,
            ExpiryKind::HolderProcess,
            false,
        )
    }

    fn expect(&self, fault: Fault, _nodes: usize) -> Expect {
        match fault {
            Fault::PausedHolder
            | Fault::PausedPermitHolder
            | Fault::PausedLeader
            | Fault::PausedReader => STOPPED_HOLDER_KEEPS_IT,
            Fault::ClientSuspend => STOPPED_HOLDER_KEEPS_IT,
            // Every link fault (`Fault::is_link_fault`), listed: the table names each fault.
            Fault::DelayedReply
            | Fault::Blackhole
            | Fault::ConnectionCut
            | Fault::LostReply
            | Fault::StaleAcquire
            | Fault::StaleExtend
            | Fault::StaleRelease => NO_NETWORK,
            Fault::ClockJump => NO_SERVER_CLOCK,
            Fault::Restart | Fault::ServerPause => NO_SERVER,
            Fault::MinorityLoss => NO_MINORITY,
            Fault::MinorityPartition => NO_MINORITY_SIDE,
            Fault::ReplicaFailover => NO_REPLICA,
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::VanishedQueueRecord => NO_WAITER_RECORD,
            Fault::MixedFleet => NO_OTHER_RECIPE,
        }
    }
}
