//! The fault catalogue: every fault the matrix injects, its name, what it shows and how
//! long a trial of it takes.

use std::time::Duration;

use serde::Serialize;

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
    /// As [`PausedHolder`](Self::PausedHolder), for a reader
    /// ([`acquire_shared`](tenure_api::DistributedLock::acquire_shared)); the contender
    /// is a writer.
    PausedReader,
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
    /// No fault: a mixed fleet. The contender is another recipe's real client sharing the
    /// lock (Curator, `etcdctl lock`, redis-py), the holder tenure's, then the other way
    /// round: each must be refused while the other holds.
    MixedFleet,
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
    pub const ALL: [Fault; 25] = [
        Fault::PausedHolder,
        Fault::PausedPermitHolder,
        Fault::PausedLeader,
        Fault::PausedReader,
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
        Fault::MixedFleet,
    ];

    /// The fault's name in matrix.json and on the command line (`paused-holder`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::PausedHolder => "paused-holder",
            Fault::PausedPermitHolder => "paused-permit-holder",
            Fault::PausedLeader => "paused-leader",
            Fault::PausedReader => "paused-reader",
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
            Fault::MixedFleet => "mixed-fleet",
        }
    }

    /// Short title for tables.
    pub fn title(self) -> &'static str {
        match self {
            Fault::PausedHolder => "holder paused past TTL",
            Fault::PausedPermitHolder => "semaphore: holder paused past TTL",
            Fault::PausedLeader => "election: leader paused past TTL",
            Fault::PausedReader => "read-write lock: reader paused past TTL",
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
            Fault::MixedFleet => "mixed fleet: another recipe's client contends",
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

    /// Whether the fault acts on one holder's links to the servers (its trial's client
    /// reaches them through proxies of its own): the others run on any client.
    pub fn is_link_fault(self) -> bool {
        matches!(
            self,
            Fault::DelayedReply
                | Fault::Blackhole
                | Fault::ConnectionCut
                | Fault::LostReply
                | Fault::StaleAcquire
                | Fault::StaleExtend
                | Fault::StaleRelease
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
