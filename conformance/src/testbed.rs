//! A backend's testbed: how its servers start on this machine and how the lab's clients
//! reach them. Each backend crate exports one (`TESTBED`, behind its `testbed` feature);
//! the lab (`tenure matrix`, `tenure bench --all-local`) reads a table of them as
//! `tenure::connect` reads its drivers, and the backend's own fault suite starts the same
//! servers through it, so the recipe is written once, in the backend's crate.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use futures::future::BoxFuture;
use tenure_api::{async_trait, DistributedLock, LockError};

use crate::broken::BrokenVariant;
use crate::faults::expect::{Config, ProtocolFn};
use crate::faults::{Deployments, FaultTarget, LeaderFn, PeerLinks, WaiterRecords, WhyNot};
use crate::foreign::ForeignRecipeFn;
use crate::servers::Node;
use crate::{Harness as _, UrlHarness};

/// The error of a testbed that could not start.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Connects, to the URL given, a client that removes waiters' records from the servers.
pub type WaiterRecordsFn =
    fn(String) -> BoxFuture<'static, Result<Arc<dyn WaiterRecords>, LockError>>;

/// Asks the servers behind a harness what they impose on a trial's lease of the duration
/// given (see [`Testbed::server_bounds`]).
pub type ServerBoundsFn =
    for<'a> fn(&'a UrlHarness, Duration) -> BoxFuture<'a, Result<ServerBounds, LockError>>;

/// The backend's replicated deployments, for clients configured as the URL given.
pub type DeploymentsFn = fn(&str) -> Result<Deployments, LockError>;

/// What a backend's servers impose on the fault suite's trials, asked of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBounds {
    /// The shortest lease the servers free a silent holder's lock after.
    pub ttl: Duration,
    /// What sets it (for the report: "the negotiated ZooKeeper session timeout").
    pub why: &'static str,
    /// The voting members, where the servers list them (the URL may name only some).
    pub members: Option<usize>,
}

/// The trials' lease and the servers' count, as the servers gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The trials' TTL: the short TTL asked for, or longer where the servers cannot free a
    /// silent holder's lock that soon.
    pub ttl: Duration,
    /// Why it is longer than the short TTL (empty if it is not).
    pub ttl_why: String,
    /// The voting members, where the servers list them.
    pub members: Option<usize>,
}

/// Takes and releases a lock once: a cycle of `tenure bench`, by tenure or by a floor.
#[async_trait]
pub trait Locker: Send + Sync {
    /// One acquire + release of `key`; calls `held` while holding it.
    ///
    /// # Cancel safety
    /// Dropped midway, the lock may stay held until its lease runs out.
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String>;
}

/// A [`Locker::cycle`] error: the step that failed (`"delete"`) and why.
pub fn cycle_failed(step: &str, error: impl fmt::Display) -> String {
    format!("{step}: {error}")
}

/// Connects a floor (the protocol floor, or the same-work floor) to the URL given, able to
/// serve the number of concurrent cycles given, its grants on leases of the duration given.
pub type FloorFn =
    for<'a> fn(&'a str, usize, Duration) -> BoxFuture<'a, Result<Arc<dyn Locker>, LockError>>;

/// The locker `connect` makes, boxed as a [`FloorFn`] or a [`PeerFn`] returns it.
pub fn boxed_locker<'a, L, F>(connect: F) -> BoxFuture<'a, Result<Arc<dyn Locker>, LockError>>
where
    L: Locker + 'static,
    F: Future<Output = Result<L, LockError>> + Send + 'a,
{
    Box::pin(async move {
        let locker: Arc<dyn Locker> = Arc::new(connect.await?);
        Ok(locker)
    })
}

/// Connects one client of a peer library (another library's lock on the same servers)
/// to the URL given.
pub type PeerFn = for<'a> fn(&'a str) -> BoxFuture<'a, Result<Arc<dyn Locker>, LockError>>;

/// A configuration of a backend that `tenure bench --all-local` measures too, and reports
/// apart from the default (Postgres: advisory locking, against a floor of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchVariant {
    /// Its name, after the backend's (`postgres advisory`).
    pub name: &'static str,
    /// The query options that configure it (`locking=advisory`), as a URL spells them.
    pub query: &'static str,
    /// Whether `tenure matrix` also measures it as a column of its own (`postgres
    /// lease`, on servers of its own started the same way): a configuration whose
    /// protocol differs from the default's, not only its cost.
    pub matrix_column: bool,
}

impl BenchVariant {
    /// Whether `url`'s query options include every one of this variant's, spelled as the
    /// variant spells them.
    pub fn configured_by(&self, url: &str) -> bool {
        let url = url.split_once('#').map_or(url, |(url, _)| url);
        let options: Vec<&str> = url
            .split_once('?')
            .map_or("", |(_, query)| query)
            .split('&')
            .collect();
        self.query
            .split('&')
            .all(|option| options.contains(&option))
    }

    /// `url` configured as this variant.
    pub fn url(&self, url: &str) -> String {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}{}", self.query)
    }
}

/// What to start (by default, [`TestbedOptions::PLAIN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestbedOptions {
    /// Run the servers under the clock shim where the backend's servers can take it
    /// (Redis, Postgres), so fault scenarios can jump their clocks (it turns `clock_gettime` into a
    /// syscall: leave it off for benchmarks).
    pub clock_shim: bool,
    /// Servers that require TLS with client certificates from a throwaway CA and a
    /// password, and clients as a user with only the privileges docs/security.md lists.
    pub secured: bool,
    /// Route the links between members through proxies that faults can cut, where the
    /// backend's servers need them for that (ZooKeeper's ensemble). The proxies run in
    /// this process, so a benchmark leaves them out: they would spend its CPU relaying
    /// the servers' replication.
    pub cuttable_links: bool,
}

impl TestbedOptions {
    /// Plain servers (the shared suite's).
    pub const PLAIN: Self = Self {
        clock_shim: false,
        secured: false,
        cuttable_links: true,
    };
    /// Servers that require TLS and a password, clients of least privilege.
    pub const SECURED: Self = Self {
        secured: true,
        ..Self::PLAIN
    };
    /// The fault suite's servers: the matrix's, under the clock shim where the backend's
    /// servers can run under it.
    pub const FAULTS: Self = Self {
        clock_shim: true,
        ..Self::PLAIN
    };
    /// `tenure bench`'s: plain, and nothing of the lab's in the measured process.
    pub const BENCH: Self = Self {
        cuttable_links: false,
        ..Self::PLAIN
    };
}

impl Default for TestbedOptions {
    fn default() -> Self {
        Self::PLAIN
    }
}

/// How one backend's lab starts.
#[derive(Clone, Copy)]
pub struct Testbed {
    /// The backend's name, as its capabilities give it (`etcd`, `zk`, …).
    pub name: &'static str,
    /// Starts the backend's servers on free loopback ports, and a harness on them (see
    /// [`Testbed::start`]).
    pub servers: fn(TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>>,
    /// The client options of the fault suite's patient client, which waits out a delayed
    /// or lost reply instead of giving up on it (every bound the backend has, raised).
    pub patient_query: &'static str,
    /// Where the backend's servers keep a record of each waiter (an etcd key, a ZooKeeper
    /// node): a client that removes them, for the vanished-queue-record fault.
    pub waiter_records: Option<WaiterRecordsFn>,
    /// Where the servers bound a lease from below (a negotiated session, a granted lease
    /// TTL) or know their members: how to ask them.
    pub server_bounds: Option<ServerBoundsFn>,
    /// Where the backend's servers replicate asynchronously: the deployments the
    /// failover faults start and fail over (for Redis: a primary/replica pair, a
    /// Sentinel group, a Redis Cluster).
    pub deployments: Option<DeploymentsFn>,
    /// The protocol floor `tenure bench --floor` measures the backend against: the
    /// cheapest acquire + release of a fresh key its plain client crate can do, with
    /// none of tenure's work (fencing, deadlines, owner checks beyond compare-and-delete).
    pub floor: Option<FloorFn>,
    /// The same-work floor `tenure bench --floor` also measures: the plain client crate
    /// sending exactly the server work of tenure's cycle (its scripts, txns, statements,
    /// in the same round trips), so that tenure / same-work is what tenure's client costs
    /// and same-work / protocol floor what the guarantee costs the servers.
    pub same_work_floor: Option<FloorFn>,
    /// The peer library `tenure bench --peers` runs interleaved with tenure, where the
    /// bench has one: its name and how to connect one of its clients.
    pub peer: Option<(&'static str, PeerFn)>,
    /// The configurations `tenure bench` measures and reports apart from the default.
    pub bench_variants: &'static [BenchVariant],
    /// Why the backend does not run some faults (not injectable into its servers, or not
    /// applying to its protocol), in its own words.
    pub why_not: &'static [WhyNot],
    /// The backend's row of the table of expected verdicts, as a URL configures it.
    pub protocol: ProtocolFn,
    /// Its deliberately broken variants (`tenure matrix --backends broken:NAME`), judged
    /// by its row.
    pub broken: &'static [BrokenVariant],
    /// Another recipe whose real client shares the backend's locks (Curator, `etcdctl
    /// lock`, redis-py), for the mixed-fleet fault on plain servers.
    pub foreign: Option<ForeignRecipeFn>,
}

impl Testbed {
    /// Starts the backend's servers on free loopback ports, and a harness on them.
    ///
    /// # Cancel safety
    /// Cancel-safe: the servers started so far are stopped when dropped.
    pub async fn start(&self, options: TestbedOptions) -> Result<Lab, BoxError> {
        let lab = (self.servers)(options).await?;
        Ok(Lab {
            testbed: *self,
            ..lab
        })
    }

    /// The trials' TTL — `short`, or longer where the servers behind `harness` cannot
    /// free a silent holder's lock that soon — and their members, asked of them.
    ///
    /// # Cancel safety
    /// Cancel-safe: the probing clients are dropped (an etcd probe lease expires).
    pub async fn probe(&self, harness: &UrlHarness, short: Duration) -> Result<Probe, LockError> {
        let bounds = match self.server_bounds {
            Some(ask) => Some(ask(harness, short).await?),
            None => None,
        };
        let members = bounds.as_ref().and_then(|b| b.members);
        let (ttl, ttl_why) = match bounds {
            Some(bounds) if bounds.ttl > short => {
                let why = format!(
                    "{} ms instead of {} ms: {}",
                    bounds.ttl.as_millis(),
                    short.as_millis(),
                    bounds.why
                );
                (bounds.ttl, why)
            }
            _ => (short, String::new()),
        };
        Ok(Probe {
            ttl,
            ttl_why,
            members,
        })
    }
}

impl fmt::Debug for Testbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Testbed").field("name", &self.name).finish()
    }
}

/// A backend on servers its testbed started. Dropping it (every clone) stops them.
#[derive(Clone)]
pub struct Lab {
    /// The testbed that started it.
    pub testbed: Testbed,
    /// A harness on the servers; it owns them.
    pub harness: UrlHarness,
    /// The servers, for process faults.
    pub nodes: Vec<Arc<dyn Node>>,
    /// Whether the nodes run under the clock shim.
    pub clock_shim: bool,
    /// Whether the servers require TLS and a password.
    pub secured: bool,
    /// The consensus leader, where there is one.
    pub leader: Option<LeaderFn>,
    /// The links between members, where they can be cut.
    pub peer_links: Option<Arc<dyn PeerLinks>>,
}

impl fmt::Debug for Lab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lab")
            .field("testbed", &self.testbed.name)
            .field("harness", &self.harness)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Lab {
    /// A lab of `testbed` with `harness` on `nodes` (no clock shim, not secured, no
    /// leader or member links until declared).
    pub fn new(testbed: Testbed, harness: UrlHarness, nodes: Vec<Arc<dyn Node>>) -> Self {
        Self {
            testbed,
            harness,
            nodes,
            clock_shim: false,
            secured: false,
            leader: None,
            peer_links: None,
        }
    }

    /// Whether the nodes run under the clock shim.
    pub fn clock_shim(mut self, clock_shim: bool) -> Self {
        self.clock_shim = clock_shim;
        self
    }

    /// Whether the servers require TLS and a password.
    pub fn secured(mut self, secured: bool) -> Self {
        self.secured = secured;
        self
    }

    /// With the consensus leader found by `leader`.
    pub fn with_leader(mut self, leader: LeaderFn) -> Self {
        self.leader = Some(leader);
        self
    }

    /// With the links between members, which faults can cut.
    pub fn with_peer_links(mut self, links: Arc<dyn PeerLinks>) -> Self {
        self.peer_links = Some(links);
        self
    }

    /// The lab of the backend's configuration `variant` on the same servers: every client
    /// — direct, cuttable and patient ones — carries its query options (the harness's
    /// queue counter, if any, stays the one the testbed connected). A client of it
    /// connects first, so what the configuration needs is created (Postgres's lease
    /// table) before clients that create nothing (the cuttable ones) connect.
    ///
    /// # Cancel safety
    /// Cancel-safe: the first client is dropped.
    pub async fn configured(mut self, variant: &BenchVariant) -> Result<Lab, LockError> {
        self.harness = self.harness.configured(variant.query);
        self.harness.client().await?;
        Ok(self)
    }

    /// The backend's fault suite on these servers: its target, its trials on the shortest
    /// lease the servers honour, and the configuration the table of expected verdicts
    /// judges it by.
    ///
    /// # Cancel safety
    /// Cancel-safe: the clients it connects are dropped.
    pub async fn fault_suite(self) -> Result<(FaultTarget, Config), BoxError> {
        let url = self.harness.url();
        let probe = self
            .testbed
            .probe(&self.harness, self.harness.short_ttl())
            .await?;
        let nodes = probe.members.unwrap_or(self.harness.targets().len());
        let config = Config::of(&self.testbed, &url, nodes)?;
        Ok((self.fault_target(probe.ttl).await?, config))
    }

    /// The fault suite's target on these servers, its trials on leases of `ttl`, with
    /// every control the lab has (processes, leader, member links, clock, waiters'
    /// records, Redis deployments) and its patient client.
    ///
    /// # Cancel safety
    /// Cancel-safe: the clients it connects are dropped.
    pub async fn fault_target(self, ttl: Duration) -> Result<FaultTarget, LockError> {
        let url = self.harness.url();
        let testbed = self.testbed;
        let mut target = FaultTarget::new(testbed.name, self.harness, ttl)
            .await?
            .with_nodes(self.nodes)
            .with_patient_query(testbed.patient_query)
            .with_why_not(testbed.why_not)
            .secured(self.secured);
        if let Some(leader) = self.leader {
            target = target.with_leader(leader);
        }
        if let Some(links) = self.peer_links {
            target = target.with_peer_links(links);
        }
        if self.clock_shim {
            target = target.with_clock_shim();
        }
        if let Some(connect) = testbed.waiter_records {
            target = target.with_waiter_records(connect(url.clone()).await?);
        }
        if let Some(deployments) = testbed.deployments {
            target = target.with_deployments(deployments(&url)?);
        }
        if let Some(foreign) = testbed.foreign.filter(|_| !self.secured) {
            let (name, recipe) = foreign(url.clone()).await?;
            target = target.with_foreign(name, recipe);
        }
        Ok(target)
    }
}

/// A harness named `name` whose clients `connect` to `template` on `nodes`, following
/// them when a restart moves one to another port.
pub fn harness_on<F, Fut, L>(
    name: &str,
    template: &str,
    nodes: &[Arc<dyn Node>],
    connect: F,
) -> UrlHarness
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<L, LockError>> + Send + 'static,
    L: DistributedLock + 'static,
{
    let targets = nodes.iter().map(|n| n.addr()).collect();
    UrlHarness::new(name, template, targets, connect).follow_nodes(nodes)
}

#[cfg(test)]
mod bench_variant_tests {
    use super::BenchVariant;

    const ADVISORY: BenchVariant = BenchVariant {
        name: "advisory",
        query: "locking=advisory",
        matrix_column: false,
    };

    #[test]
    fn a_variant_is_the_urls_that_carry_its_options() {
        assert!(ADVISORY.configured_by("postgres://h/db?locking=advisory"));
        assert!(ADVISORY.configured_by("postgres://h/db?pool_size=2&locking=advisory#x"));
        assert!(!ADVISORY.configured_by("postgres://h/db"));
        assert!(!ADVISORY.configured_by("postgres://h/db?locking=row"));
        assert!(!ADVISORY.configured_by("postgres://h/db?locking=advisoryX"));
        assert!(!ADVISORY.configured_by("postgres://h/db#locking=advisory"));
    }

    #[test]
    fn a_variants_url_adds_its_options() {
        assert_eq!(
            ADVISORY.url("postgres://h/db"),
            "postgres://h/db?locking=advisory"
        );
        assert_eq!(
            ADVISORY.url("postgres://h/db?pool_size=2"),
            "postgres://h/db?pool_size=2&locking=advisory"
        );
        assert!(ADVISORY.configured_by(&ADVISORY.url("postgres://h/db")));
    }
}
