//! What each cell of the matrix must show: a reviewed table of the verdicts the
//! protocols allow per (backend, configuration, fault), each with its reason.
//!
//! Each backend crate writes its own row ([`Protocol`], behind its `testbed` feature),
//! derived from how the backend works, never from a run and never from the backend's
//! own [`Capabilities`]: those are checked against the row's premises ([`Premise`])
//! instead. This module holds what the rows share: the cell type, the verdict sets and
//! the cells every protocol has in common. A cell observed outside its row is a ⚠ in the
//! matrix, and `tenure matrix` fails on it; a backend's fault-suite test fails on it
//! ([`run_fault_suite`](crate::runner::run_fault_suite)).
//!
//! Deliberately broken wrappers over a real backend are judged by the real backend's row
//! ([`Config::of`] with the real backend's testbed), so the matrix judges them by what the
//! real protocol guarantees.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use tenure_api::{Capabilities, ExpiryKind, FencingKind, Replication};

use super::{Fault, Verdict};
use crate::testbed::Testbed;

/// A backend's row of the table, as its URL configures it: what the backend guarantees
/// and what each fault must show. Each backend crate writes its own (feature `testbed`),
/// from how its protocol works; its [`Testbed`] names it.
pub trait Protocol: fmt::Debug + Send + Sync {
    /// What the row assumes the backend guarantees on `nodes` servers.
    fn premise(&self, nodes: usize) -> Premise;

    /// What `fault` must produce on `nodes` servers, and why.
    fn expect(&self, fault: Fault, nodes: usize) -> Expect;
}

/// Reads a backend's row from its URL (its options may change a verdict); `Err` names the
/// option it cannot read.
pub type ProtocolFn = fn(url: &str) -> Result<Arc<dyn Protocol>, String>;

/// What the expected verdicts depend on: the backend's row and its servers.
#[derive(Clone, Debug)]
pub struct Config {
    /// The backend's row, as its URL configures it.
    pub protocol: Arc<dyn Protocol>,
    /// Servers: hosts in the URL, or the voting members the servers list (etcd).
    pub nodes: usize,
}

impl Config {
    /// The configuration of `testbed`'s backend at `url`, on `nodes` servers.
    pub fn of(testbed: &Testbed, url: &str, nodes: usize) -> Result<Config, String> {
        Ok(Config {
            protocol: (testbed.protocol)(url)?,
            nodes: nodes.max(1),
        })
    }

    /// What the table assumes the backend guarantees.
    pub fn premise(&self) -> Premise {
        self.protocol.premise(self.nodes)
    }

    /// What `fault` must produce.
    pub fn expect(&self, fault: Fault) -> Expect {
        self.protocol.expect(fault, self.nodes)
    }

    /// The faults whose cell allows `verdict` (to review a row: which faults may show an
    /// UNSAFE, say).
    pub fn allowing(&self, verdict: Verdict) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|&fault| self.expect(fault).verdicts.contains(&verdict))
            .collect()
    }
}

/// The row of a backend no URL option changes, for its testbed's `protocol`.
pub fn fixed<P: Protocol + Default + 'static>(_url: &str) -> Result<Arc<dyn Protocol>, String> {
    Ok(Arc::new(P::default()))
}

/// The value of query option `name` in `url` (the last one given), for a row that depends
/// on it.
pub fn url_option<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .next_back()
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
    /// A consensus group of `members` (Raft, Zab): tokens ordered by the log, a majority
    /// needed, no clock trusted.
    pub fn consensus(expiry: ExpiryKind, members: usize) -> Premise {
        Premise {
            fencing: FencingKind::ConsensusOrdered,
            expiry,
            replication: Replication::Consensus { members },
            failures_tolerated: members.saturating_sub(1) / 2,
            clock_dependent: false,
        }
    }

    /// One server, no failure survived.
    pub fn single_node(fencing: FencingKind, expiry: ExpiryKind, clock_dependent: bool) -> Premise {
        Premise {
            fencing,
            expiry,
            replication: Replication::SingleNode,
            failures_tolerated: 0,
            clock_dependent,
        }
    }

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

/// Only SAFE.
pub const SAFE: &[Verdict] = &[Verdict::Safe];
/// Only F-SAFE.
pub const F_SAFE: &[Verdict] = &[Verdict::FencedSafe];
/// Only UNSAFE.
pub const UNSAFE: &[Verdict] = &[Verdict::Unsafe];
/// Only UNAVAIL.
pub const UNAVAIL: &[Verdict] = &[Verdict::Unavail];
/// SAFE or UNAVAIL.
pub const SAFE_OR_UNAVAIL: &[Verdict] = &[Verdict::Safe, Verdict::Unavail];
/// SAFE or F-SAFE.
pub const SAFE_OR_F_SAFE: &[Verdict] = &[Verdict::Safe, Verdict::FencedSafe];
/// SAFE or UNSAFE.
pub const SAFE_OR_UNSAFE: &[Verdict] = &[Verdict::Safe, Verdict::Unsafe];
/// SAFE, F-SAFE or UNSAFE.
pub const ANY_CONTAINMENT: &[Verdict] = &[Verdict::Safe, Verdict::FencedSafe, Verdict::Unsafe];
/// F-SAFE or UNSAFE: a violation nothing is sure to contain.
pub const UNFENCED_VIOLATION: &[Verdict] = &[Verdict::FencedSafe, Verdict::Unsafe];
/// None: the fault does not apply.
pub const NOT_APPLICABLE: &[Verdict] = &[];

/// A cell: `verdicts`, because `reason`.
pub const fn cell(verdicts: &'static [Verdict], reason: &'static str) -> Expect {
    Expect { verdicts, reason }
}

// The cells every protocol shares.

/// The holder's machine suspended past its TTL, on every backend.
pub const CLIENT_SUSPEND: Expect = cell(
    SAFE,
    "the servers' clocks run on and end the lease during the suspend, and the \
     contender is granted; the holder's guard counts the time suspended \
     (CLOCK_BOOTTIME) against its deadline, so on waking it knows the lease lost \
     and does not write",
);

/// A late release, on every backend.
pub const STALE_RELEASE: Expect = cell(
    SAFE,
    "a release names the grant it ends (owner id, key revision, node, session): \
     a late one cannot end the next grant",
);

/// A minority of servers lost where there are fewer than three.
pub const NO_MINORITY: Expect = cell(NOT_APPLICABLE, "a single node has no minority to lose");

/// A minority of a consensus group's members lost.
pub const MAJORITY_REMAINS: Expect = cell(
    SAFE,
    "a majority of members remains: after an election, grants and releases commit \
     as before",
);

/// The server frozen where there are fewer than three.
pub const ONLY_SERVER_FROZEN: Expect = cell(
    UNAVAIL,
    "the only server is frozen: no grant and no renewal until it resumes",
);

/// A consensus group's leader frozen.
pub const LEADER_FROZEN: Expect = cell(
    SAFE_OR_UNAVAIL,
    "a frozen leader costs an election: requests stuck on its connections, or made \
     before a new leader is elected, time out",
);

/// A minority of `members` servers lost, on a group that works while a majority does
/// (consensus members, or a primary with standbys): [`NO_MINORITY`] on fewer than three.
pub const fn minority_lost(members: usize) -> Expect {
    if members < 3 {
        NO_MINORITY
    } else {
        MAJORITY_REMAINS
    }
}

/// One of `members` servers frozen (the leader, or the primary): [`ONLY_SERVER_FROZEN`]
/// on fewer than three.
pub const fn server_frozen(members: usize) -> Expect {
    if members < 3 {
        ONLY_SERVER_FROZEN
    } else {
        LEADER_FROZEN
    }
}

/// A failover of a Redis deployment, on a backend that is not one.
pub const NOT_A_REDIS_DEPLOYMENT: Expect = cell(NOT_APPLICABLE, "a failover of a Redis deployment");

/// A replica failover on a consensus group.
pub const NO_ASYNC_REPLICA: Expect = cell(
    NOT_APPLICABLE,
    "replication is synchronous consensus: a member without the grant cannot be \
     elected",
);

/// The holder's connections cut where the grant does not live on a connection.
pub const GRANT_OUTLIVES_CONNECTION: Expect = cell(
    SAFE,
    "the grant outlives the connection: the holder's renewals fail and its guard \
     gives up at its deadline, before the server frees the lock",
);

/// A stalled acquire where every request names its own record.
pub const LATE_REQUEST_NAMES_ITS_RECORD: Expect = cell(
    SAFE,
    "a late request acts only on the record it names (etcd key, ZooKeeper node, \
     Postgres session), never on the retry's",
);

/// A mixed fleet on a backend whose lock layout no other recipe's client shares.
pub const NO_OTHER_RECIPE: Expect = cell(
    NOT_APPLICABLE,
    "no other recipe's client shares this backend's lock layout",
);

/// A minority partition where there are fewer than three servers.
pub const NO_MINORITY_SIDE: Expect =
    cell(NOT_APPLICABLE, "fewer than three servers: no minority side");

/// A minority partition of one server.
pub const ONE_SERVER_NO_MINORITY_SIDE: Expect =
    cell(NOT_APPLICABLE, "one server: no minority side");

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
    config.expect(fault)
}
