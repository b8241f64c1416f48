//! The facts of the decision matrix, as each backend declares them. The conformance
//! suite checks every claim against what it observes.

use std::fmt;

/// Where fencing tokens come from, and so how far they can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingKind {
    /// Ordered by a consensus log (etcd revision, ZooKeeper zxid): survives any minority
    /// failure.
    ConsensusOrdered,
    /// A counter on one server: regresses if that server loses its data.
    SingleNodeCounter,
    /// A counter on one server that never falls below the server's clock (µs since the
    /// epoch): keeps increasing when the server loses its data or fails over to a replica
    /// whose clock is in step, but not if a clock runs backwards past the last token.
    ClockFlooredCounter,
    /// A max-register written to a quorum of independent nodes: survives the loss of any
    /// node that kept its memory, but may regress as soon as one node of the quorum that
    /// recorded the last token restarts empty (a later quorum can then be formed without
    /// any node that saw it).
    QuorumRegister,
    /// A durable, committed database sequence.
    Sequence,
    /// An in-process counter.
    InProcess,
    /// No fencing: tokens carry no ordering guarantee.
    None,
}

/// What frees a lock whose holder went silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpiryKind {
    /// A TTL counted down by the server's clock.
    ServerTtl,
    /// A lease timed by the consensus leader (etcd).
    LeaderTimedLease,
    /// The client's session stops heartbeating (ZooKeeper).
    SessionHeartbeat,
    /// The server ends the holder's connection or transaction (Postgres).
    ConnectionTransaction,
    /// A TTL on the local process's clock.
    LocalClock,
    /// The holder's process: its exit frees the lock (the kernel closes its files), and
    /// its own client times the TTL, so a stopped holder keeps it (file locks).
    HolderProcess,
}

/// How the lock state is replicated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Replication {
    /// In one process's memory.
    InProcess,
    /// One server (replicas, if any, are asynchronous and not part of the protocol).
    SingleNode,
    /// A majority of independent servers that do not talk to each other (Redlock).
    IndependentQuorum {
        /// Number of servers.
        nodes: usize,
    },
    /// A consensus group (Raft, Zab).
    Consensus {
        /// Number of voting members, when known.
        members: usize,
    },
}

/// How a waiter learns that the lock became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitKind {
    /// The backend pushes a signal (pub/sub, watch, server lock queue).
    Push,
    /// The client polls with backoff.
    Poll,
}

/// The order in which waiters get the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fairness {
    /// First come, first served.
    Fifo,
    /// No order is promised.
    None,
}

/// A backend's declared guarantees: the columns of the decision matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// Short backend name (`"memory"`, `"redis"`, `"redlock"`, `"etcd"`, `"zk"`,
    /// `"postgres"`).
    pub backend: &'static str,
    /// Where fencing tokens come from.
    pub fencing: FencingKind,
    /// What frees a silent holder's lock.
    pub expiry: ExpiryKind,
    /// How state is replicated.
    pub replication: Replication,
    /// How waiters are woken.
    pub wait: WaitKind,
    /// The order waiters are served in.
    pub fairness: Fairness,
    /// Server failures this configuration survives without losing safety or liveness.
    pub failures_tolerated: usize,
    /// Whether mutual exclusion depends on the servers' clocks (bounded drift, no jumps):
    /// a server clock jump can free a held lock early. Every lease also depends on its
    /// holder's pauses being shorter than the TTL, whatever this says; fencing contains
    /// that.
    pub clock_dependent: bool,
    /// Whether a grant records the label passed in [`AcquireOptions::label`](crate::AcquireOptions::label)
    /// and [`inspect`](crate::DistributedLock::inspect) reports it (what an
    /// [`Election`](crate::Election) publishes its leader's value with). A backend without
    /// labels refuses an acquire that carries one.
    pub labels: bool,
    /// Whether the backend takes a key shared, as one of several readers
    /// ([`acquire_shared`](crate::DistributedLock::acquire_shared), the read side of an
    /// [`RwLock`](crate::RwLock)). Without it, `acquire_shared` is
    /// [`LockError::Config`](crate::LockError::Config).
    pub shared: bool,
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: fencing {:?}, expiry {:?}, replication {:?}, wait {:?}, fairness {:?}, \
             tolerates {} failure(s), {}{}",
            self.backend,
            self.fencing,
            self.expiry,
            self.replication,
            self.wait,
            self.fairness,
            self.failures_tolerated,
            if self.clock_dependent {
                "clock-dependent"
            } else {
                "clock-independent"
            },
            if self.labels { "" } else { ", no labels" }
        )
    }
}
