//! What the fault suite runs against: a backend's harness, and what the harness declares
//! it controls (the servers' processes, their leader, the links between them, their
//! clocks, Redis deployments of the backend's own). A fault that needs what is not
//! declared is reported not injectable, never run half-way.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tenure_api::{async_trait, Capabilities, DistributedLock, LockAdmin, LockError, LockKey};

use super::replicated::Deployments;
use super::rounds::retried;
use super::{Cell, Fault};
use crate::foreign::ForeignRecipe;
use crate::servers::Node;
use crate::{Harness as _, UrlHarness};

/// Finds the index (into [`FaultTarget::with_nodes`]) of the consensus leader, if any.
pub type LeaderFn = Arc<dyn Fn() -> BoxFuture<'static, Option<usize>> + Send + Sync>;

/// A [`LeaderFn`] that asks `cluster` with `find` (e.g. `EtcdCluster::leader_index`).
pub fn leader_of<C, F>(cluster: &Arc<C>, find: F) -> LeaderFn
where
    C: Send + Sync + 'static,
    F: for<'a> Fn(&'a C) -> BoxFuture<'a, Option<usize>> + Send + Sync + Copy + 'static,
{
    let cluster = cluster.clone();
    Arc::new(move || {
        let cluster = cluster.clone();
        Box::pin(async move { find(&cluster).await })
    })
}

/// Cuts one member of a replicated backend off from the others, for partition faults.
pub trait PeerLinks: Send + Sync {
    /// Cuts member `index` (into [`FaultTarget::with_nodes`]) off from every other member.
    fn isolate(&self, index: usize) -> Result<(), String>;
    /// Restores every member-to-member link.
    fn heal(&self);
    /// Bytes of member `index`'s traffic with the others dropped so far: evidence a cut
    /// fired.
    fn dropped(&self, index: usize) -> u64;
}

/// The records a backend's servers keep of its waiters (an etcd queue key, a ZooKeeper
/// sequential node), as a lab can remove them (the backends' `testbed` feature); its
/// [`LockAdmin::queued`] counts them.
#[async_trait]
pub trait WaiterRecords: LockAdmin + 'static {
    /// Removes the newest record of `key`'s queue (its last waiter's) on the servers, as
    /// an operator's delete does, the waiter's session or lease left alive; returns the
    /// record's name, or `None` when the queue holds no waiter.
    ///
    /// # Cancel safety
    /// Cancel-safe: one delete, made or not.
    async fn remove_newest_waiter(&self, key: &LockKey) -> Result<Option<String>, LockError>;
}

/// Why a backend does not run some faults, as its testbed declares: a fault that does not
/// apply to its protocol is reported so in any setup; one it cannot inject, where the
/// suite's own rules leave the fault to the backend (see
/// [`applicability`](super::applicability)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhyNot {
    /// The faults apply to the backend, but cannot be injected into these servers.
    NotInjectable(&'static [Fault], &'static str),
    /// The faults do not apply to the backend's protocol.
    NotApplicable(&'static [Fault], &'static str),
}

impl WhyNot {
    /// The cell to report for `fault`, if this covers it.
    fn cell(&self, fault: Fault) -> Option<Cell> {
        match *self {
            WhyNot::NotInjectable(faults, reason) if faults.contains(&fault) => {
                Some(Cell::NotInjectable {
                    reason: reason.into(),
                })
            }
            WhyNot::NotApplicable(faults, reason) if faults.contains(&fault) => {
                Some(Cell::NotApplicable {
                    reason: reason.into(),
                })
            }
            _ => None,
        }
    }
}

/// A backend under the fault suite: its harness, its declared [`Capabilities`], the
/// trials' TTL, and what the harness controls. Build it with [`FaultTarget::new`] and
/// declare each control the harness has; [`run`](super::run) reports the faults that
/// need an undeclared one as not injectable.
///
/// ```no_run
/// # async fn demo(harness: tenure_conformance::UrlHarness) -> Result<(), tenure_api::LockError> {
/// use std::time::Duration;
/// use tenure_conformance::faults::{self, Fault, FaultTarget, Verdict};
/// let target = FaultTarget::new("redis", harness, Duration::from_millis(500)).await?;
/// let cell = faults::run(Fault::PausedHolder, &target, 4, 1).await;
/// assert!(!cell.verdicts().contains(&Verdict::Unsafe), "{}", cell.summary());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FaultTarget {
    pub(super) name: String,
    pub(super) harness: UrlHarness,
    pub(super) caps: Capabilities,
    pub(super) ttl: Duration,
    pub(super) nodes: Vec<Arc<dyn Node>>,
    pub(super) leader: Option<LeaderFn>,
    pub(super) peer_links: Option<Arc<dyn PeerLinks>>,
    pub(super) clock_shim: bool,
    pub(super) stopping_clock: bool,
    pub(super) waiter_records: Option<Arc<dyn WaiterRecords>>,
    pub(super) secured: bool,
    pub(super) deployments: Option<Deployments>,
    pub(super) patient_query: String,
    pub(super) why_not: &'static [WhyNot],
    pub(super) foreign: Option<(&'static str, ForeignRecipe)>,
    pub(super) run_id: u32,
    pub(super) draw: usize,
}

impl std::fmt::Debug for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultTarget")
            .field("name", &self.name)
            .field("harness", &self.harness)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl FaultTarget {
    /// A target named `name` (for reports) whose clients `harness` makes, holding their
    /// leases for `ttl` in the trials: one client is asked for the backend's
    /// [`Capabilities`]. It controls nothing until declared: only faults on a client's
    /// own links and process run on it.
    ///
    /// # Cancel safety
    /// Cancel-safe: the probing client is dropped.
    pub async fn new(name: &str, harness: UrlHarness, ttl: Duration) -> Result<Self, LockError> {
        let caps = harness.client().await?.capabilities();
        Ok(Self::with_capabilities(name, harness, caps, ttl))
    }

    /// [`new`](Self::new) for a caller that already asked a client for the backend's
    /// capabilities (no client is made here).
    pub fn with_capabilities(
        name: &str,
        harness: UrlHarness,
        caps: Capabilities,
        ttl: Duration,
    ) -> Self {
        Self {
            name: name.to_owned(),
            harness,
            caps,
            ttl,
            nodes: Vec::new(),
            leader: None,
            peer_links: None,
            clock_shim: false,
            stopping_clock: false,
            waiter_records: None,
            secured: false,
            deployments: None,
            patient_query: String::new(),
            why_not: &[],
            foreign: None,
            run_id: rand::random(),
            draw: 0,
        }
    }

    /// Declares control over the servers' processes (kill, pause, restart): the server
    /// faults run on them.
    pub fn with_nodes(mut self, nodes: Vec<Arc<dyn Node>>) -> Self {
        self.nodes = nodes;
        self
    }

    /// Declares how to find the consensus leader among [`nodes`](Self::with_nodes), so
    /// a server fault hits it.
    pub fn with_leader(mut self, leader: LeaderFn) -> Self {
        self.leader = Some(leader);
        self
    }

    /// Declares control over the links between members, for partitions.
    pub fn with_peer_links(mut self, links: Arc<dyn PeerLinks>) -> Self {
        self.peer_links = Some(links);
        self
    }

    /// Declares that the nodes run under the clock shim ([`crate::clock_shim`]), so
    /// their clocks can jump.
    pub fn with_clock_shim(mut self) -> Self {
        self.clock_shim = true;
        self
    }

    /// Declares that the holder times its guard on a clock that stops during a suspend
    /// and cannot tell it (CLOCK_MONOTONIC alone): a deliberately broken client, which
    /// the [`ClientSuspend`](super::Fault::ClientSuspend) fault must catch.
    pub fn with_stopping_clock(mut self) -> Self {
        self.stopping_clock = true;
        self
    }

    /// Declares how to remove a waiter's record from the servers' queue, for the
    /// [`VanishedQueueRecord`](super::Fault::VanishedQueueRecord) fault.
    pub fn with_waiter_records(mut self, records: Arc<dyn WaiterRecords>) -> Self {
        self.waiter_records = Some(records);
        self
    }

    /// Declares that the servers require TLS and a password: the replicated deployments
    /// the testbed starts for the failover faults (which run without) do not stand in
    /// for them.
    pub fn secured(mut self, secured: bool) -> Self {
        self.secured = secured;
        self
    }

    /// Declares the backend's replicated deployments: the failover faults then fail them
    /// over (for Redis: a primary with an asynchronous replica, Sentinel, Cluster),
    /// their clients made by the harness from their URLs.
    pub fn with_deployments(mut self, deployments: Deployments) -> Self {
        self.deployments = Some(deployments);
        self
    }

    /// Query options for clients that must wait out a delayed reply instead of timing
    /// out first. They replace the harness's query options (default: the harness's), so
    /// repeat any that place the locks (a prefix, a database).
    pub fn with_patient_query(mut self, query: &str) -> Self {
        self.patient_query = query.to_owned();
        self
    }

    /// With the backend's reasons for not running some faults (its testbed's
    /// [`WhyNot`]s, as [`Lab::fault_target`](crate::testbed::Lab::fault_target) declares
    /// them). Undeclared, every fault the suite's own rules allow runs: a target on one
    /// of tenure's backends built by hand should declare its testbed's
    /// (`tenure_etcd::TESTBED.why_not`), or a stale-request fault, say, runs where it
    /// cannot be injected.
    pub fn with_why_not(mut self, why_not: &'static [WhyNot]) -> Self {
        self.why_not = why_not;
        self
    }

    /// Declares another recipe (its name, and how to start a client of it on a lock) whose
    /// real client shares the backend's locks, for the
    /// [`MixedFleet`](super::Fault::MixedFleet) fault.
    pub fn with_foreign(mut self, name: &'static str, recipe: ForeignRecipe) -> Self {
        self.foreign = Some((name, recipe));
        self
    }

    /// Names this run in the trials' keys (default: random), so runs never share keys.
    pub fn with_run_id(mut self, run_id: u32) -> Self {
        self.run_id = run_id;
        self
    }

    /// This target for a soak's `draw`: each draw's trials take keys of their own, so
    /// that nothing an earlier draw left held can meet them.
    pub fn for_draw(&self, draw: usize) -> Self {
        Self {
            draw,
            ..self.clone()
        }
    }

    /// The name given to [`new`](Self::new).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The harness.
    pub fn harness(&self) -> &UrlHarness {
        &self.harness
    }

    /// What the backend declares.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The trials' TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The servers under process control.
    pub fn nodes(&self) -> &[Arc<dyn Node>] {
        &self.nodes
    }

    /// Whether the servers require TLS and a password.
    pub fn is_secured(&self) -> bool {
        self.secured
    }

    pub(super) fn key(&self, fault: Fault, round: usize, index: usize) -> LockKey {
        let name = format!(
            "tenure-matrix/{:08x}/{}/{fault:?}/{round}/{index}",
            self.run_id, self.draw
        );
        LockKey::new(name).expect("ascii key well under the length limit")
    }

    /// A fresh client of the servers, for a trial's setup: a connect that fails for a
    /// reason that passes is tried again for up to 20 s ([`retried`]). Setting a trial up
    /// is not what it measures, and a TLS handshake and a password check on a loaded
    /// 2-core machine can outlast a client's 1 s connect timeout: one such timeout of
    /// Redis's contender over TLS used to leave a whole round of `holder paused past TTL`
    /// unfired (`quick_matrix_over_tls_with_least_privilege`, "contender: … connect on
    /// 127.0.0.1:…: timed out", once in a full `./x test`).
    pub(super) async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        retried(|| self.harness.client()).await
    }

    /// The cell the backend declares for `fault` instead of running it, if any.
    pub(super) fn why_not(&self, fault: Fault) -> Option<Cell> {
        self.why_not.iter().find_map(|why| why.cell(fault))
    }

    pub(super) fn patient_query(&self) -> &str {
        match self.patient_query.is_empty() {
            true => self.harness.query_options(),
            false => &self.patient_query,
        }
    }
}
