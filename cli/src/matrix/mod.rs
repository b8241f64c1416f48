//! `tenure matrix`: the decision matrix, measured. For every backend: the shared
//! scenario suite, the fault scenarios of [`faults`] (each over many trials, with
//! verdicts SAFE / F-SAFE / UNSAFE / UNAVAIL) judged against the reviewed table of
//! [`expect`], a short performance run, and a check of the backend's declared
//! [`Capabilities`] against the table's premises and what was observed.

#[doc(hidden)]
pub mod report;

use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use tenure_api::{Capabilities, DistributedLock, Fairness, LockError};
use tenure_conformance::faults::{self, FaultTarget};
use tenure_conformance::runner::{run_scenario, ScenarioResult};
use tenure_conformance::{scenarios, UrlHarness};

use crate::bench::{self, BenchLine, BenchOptions, Mode};
use crate::local::{self, TestbedOptions};
pub use tenure_conformance::faults::{expect, Cell, Fault, Verdict};

/// How much to run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MatrixOptions {
    /// Trials per fault and backend.
    pub trials: usize,
    /// Separate injections of each server fault (its trials are split among them).
    pub rounds: usize,
    /// Seconds per performance mode.
    pub perf_secs: f64,
    /// Columns to run: backends, and configurations measured as columns of their own
    /// (`postgres lease`; default: every column of this build, see
    /// [`local::columns`]).
    pub backends: Vec<String>,
    /// The fault cells to run (default: all), in matrix order.
    pub faults: Vec<Fault>,
    /// Whether to run the shared suite and the performance runs (not in a run trimmed to
    /// some fault cells).
    pub suite_and_perf: bool,
    /// Local servers require TLS, client certificates and a password, and clients have
    /// only the privileges docs/security.md lists (`--tls`).
    pub tls: bool,
    /// A chaos run instead of one cell per fault (`--soak`).
    pub soak: Option<Soak>,
}

/// A chaos run (`tenure matrix --soak`): for a given time per backend, faults drawn at
/// random from those its servers allow, each draw a cell of [`MatrixOptions::trials`]
/// trials in one round; the draws of a fault add up to its cell.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Soak {
    /// Seconds each backend draws faults for (a draw under way at the end finishes).
    pub secs: f64,
    /// Seeds the draws: a run with the same seed draws the same sequence of faults.
    pub seed: u64,
}

impl Soak {
    /// The random draws for `backend`, from this soak's seed.
    fn draws(&self, backend: &str) -> StdRng {
        let salt = backend
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        StdRng::seed_from_u64(self.seed ^ salt)
    }
}

impl Default for MatrixOptions {
    fn default() -> Self {
        Self {
            trials: 20,
            rounds: 4,
            perf_secs: 2.0,
            backends: local::columns(),
            faults: Fault::ALL.to_vec(),
            suite_and_perf: true,
            tls: false,
            soak: None,
        }
    }
}

impl MatrixOptions {
    /// The `--quick` version used in CI: 3 trials in one injection, short perf runs.
    pub fn quick() -> Self {
        Self {
            trials: 3,
            rounds: 1,
            perf_secs: 0.3,
            ..Self::default()
        }
    }
}

/// A backend under test: the fault suite's target (a harness, and for local servers the
/// processes behind it), with its row of the table of [`expect`].
#[derive(Clone, Debug)]
pub struct Target {
    faults: FaultTarget,
    config: expect::Config,
    /// Why the trials' TTL is longer than the harness's short TTL (empty if it is not).
    ttl_why: String,
}

impl std::ops::Deref for Target {
    type Target = FaultTarget;

    fn deref(&self) -> &FaultTarget {
        &self.faults
    }
}

/// One suite scenario's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioOutcome {
    /// Scenario name.
    pub name: &'static str,
    /// `passed`, `failed` or `ignored`.
    pub result: &'static str,
    /// Why it failed or was ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One fault's cell with what the table of [`expect`] allows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultOutcome {
    /// The fault.
    pub fault: Fault,
    /// Its title.
    pub title: &'static str,
    /// What happened.
    pub cell: Cell,
    /// Verdicts the protocol allows ([`expect::expect`]; empty: the fault does not apply).
    pub expected: Vec<Verdict>,
    /// Why, from the protocol.
    pub reason: &'static str,
    /// True when an observed verdict is outside `expected`.
    pub mismatch: bool,
}

/// A declared capability against the observation that tests it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// The declared fact.
    pub claim: String,
    /// What was observed.
    pub observed: String,
    /// `Some(true)`: consistent; `Some(false)`: mismatch; `None`: not observable here.
    pub consistent: Option<bool>,
}

impl Check {
    /// `✓`, `⚠ mismatch` or `not observable`.
    pub fn mark(&self) -> &'static str {
        match self.consistent {
            Some(true) => "✓",
            Some(false) => "⚠ mismatch",
            None => "not observable",
        }
    }
}

/// Declared capabilities, as text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CapabilitiesReport {
    /// Where tokens come from.
    pub fencing: String,
    /// What frees a silent holder's lock.
    pub expiry: String,
    /// Replication.
    pub replication: String,
    /// Push or poll.
    pub wait: String,
    /// FIFO or not.
    pub fairness: String,
    /// Failures tolerated.
    pub failures_tolerated: usize,
    /// Clock dependence.
    pub clock_dependent: bool,
}

impl From<&Capabilities> for CapabilitiesReport {
    fn from(c: &Capabilities) -> Self {
        Self {
            fencing: format!("{:?}", c.fencing),
            expiry: format!("{:?}", c.expiry),
            replication: format!("{:?}", c.replication),
            wait: format!("{:?}", c.wait),
            fairness: format!("{:?}", c.fairness),
            failures_tolerated: c.failures_tolerated,
            clock_dependent: c.clock_dependent,
        }
    }
}

/// Everything measured for one backend.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendReport {
    /// Backend name.
    pub backend: String,
    /// The servers it ran on.
    pub servers: String,
    /// The TTL of the fault trials' leases, in milliseconds (0: not measured).
    pub ttl_ms: u64,
    /// Why that TTL.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ttl_why: String,
    /// Declared capabilities.
    pub capabilities: Option<CapabilitiesReport>,
    /// The shared suite.
    pub suite: Vec<ScenarioOutcome>,
    /// The fault scenarios.
    pub faults: Vec<FaultOutcome>,
    /// A soak's draws, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<Fault>,
    /// Performance (no floor: see `tenure bench --floor`).
    pub perf: Vec<BenchLine>,
    /// Declared vs observed.
    pub checks: Vec<Check>,
    /// Why the backend could not be measured, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole matrix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Matrix {
    /// When it was measured (UTC, RFC 3339).
    pub measured_at: String,
    /// The machine it ran on.
    pub machine: String,
    /// How much was run.
    pub options: MatrixOptions,
    /// Wall-clock seconds.
    pub elapsed_secs: f64,
    /// One report per backend.
    pub backends: Vec<BackendReport>,
}

impl Matrix {
    /// Every ⚠: a cell whose observed verdicts lie outside the table of [`expect`] (an
    /// unexpected UNSAFE among them), or a declared capability that contradicts the table
    /// or the cells that test it — each as `backend / what: observed (expected …)`.
    pub fn mismatches(&self) -> Vec<String> {
        let mut out = Vec::new();
        for b in &self.backends {
            for f in b.faults.iter().filter(|f| f.mismatch) {
                let expected: Vec<&str> = f.expected.iter().map(|v| v.label()).collect();
                out.push(format!(
                    "{} / {}: {} (expected {})",
                    b.backend,
                    f.title,
                    f.cell.summary(),
                    if expected.is_empty() {
                        "not to run".to_string()
                    } else {
                        expected.join(" or ")
                    }
                ));
            }
            for c in b.checks.iter().filter(|c| c.consistent == Some(false)) {
                out.push(format!(
                    "{} / declared {}: {}",
                    b.backend, c.claim, c.observed
                ));
            }
        }
        out
    }
}

/// Prints progress on stderr: a bar on a terminal, a line per step otherwise.
#[derive(Debug)]
pub struct Progress {
    total: AtomicUsize,
    done: AtomicUsize,
    tty: bool,
    started: Instant,
    last: Mutex<String>,
}

impl Progress {
    /// A progress display with no steps yet.
    pub fn new() -> Self {
        Self {
            total: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: Mutex::new(String::new()),
        }
    }

    fn add(&self, steps: usize) {
        self.total.fetch_add(steps, Ordering::Relaxed);
    }

    fn skip(&self, steps: usize) {
        self.total.fetch_sub(steps, Ordering::Relaxed);
    }

    fn step(&self, what: &str) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.total.load(Ordering::Relaxed).max(done);
        let mut stderr = std::io::stderr().lock();
        if self.tty {
            let width = 30;
            let filled = done * width / total;
            let _ = write!(
                stderr,
                "\r\x1b[2K[{}{}] {done}/{total} {:>4}s {what}",
                "#".repeat(filled),
                ".".repeat(width - filled),
                self.started.elapsed().as_secs()
            );
            if done == total {
                let _ = writeln!(stderr);
            }
        } else {
            let backend = what.split(':').next().unwrap_or(what).to_owned();
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if *last != backend || done == total {
                let _ = writeln!(
                    stderr,
                    "tenure matrix: [{done}/{total}, {}s] {what}",
                    self.started.elapsed().as_secs()
                );
                *last = backend;
            }
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// Backends to measure on clusters the user runs, from a TOML file:
///
/// ```toml
/// [backends]
/// redis = "redis://10.0.0.5:6379"
/// etcd = "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/tenure"
/// ```
///
/// Faults that need process control are reported not injectable; faults on a client's
/// links still run, through proxies in front of every host.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClustersConfig {
    /// Backend name → URL.
    pub backends: std::collections::BTreeMap<String, String>,
}

impl ClustersConfig {
    /// Reads the file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, LockError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LockError::Config(format!("cannot read {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            LockError::Config(format!(
                "bad clusters file {}: {}",
                path.display(),
                tenure::redact_url(e.message())
            ))
        })
    }
}

/// Where a backend's servers come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Start local servers with the backend's testbed; `secured`: servers that
    /// require TLS and a password, used with least privilege (see
    /// [`TestbedOptions::secured`]).
    Local {
        /// Whether the servers require TLS and a password.
        secured: bool,
    },
    /// Use the user's servers at this URL.
    External(String),
}

/// Splits `scheme://[user@]h1:p1,h2:p2/rest` into a `{hosts}` template and the addresses,
/// and counts queues through an admin client of `url`.
async fn external_harness(name: &str, url: &str) -> Result<UrlHarness, LockError> {
    let bad = || {
        LockError::Config(format!(
            "cannot find the hosts in {}",
            tenure::redact_url(url)
        ))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let mut targets: Vec<SocketAddr> = Vec::new();
    for host in tenure_api::urls::parse_host_list(hosts, 0)? {
        let found = tokio::net::lookup_host((host.host.as_str(), host.port))
            .await
            .map_err(|e| LockError::unavailable(format!("resolving {host}"), e))?
            .next()
            .ok_or_else(bad)?;
        targets.push(found);
    }
    if targets.iter().any(|t| t.port() == 0) {
        return Err(LockError::Config(format!(
            "give every host of {} a port",
            tenure::redact_url(url)
        )));
    }
    let template = format!("{scheme}://{userinfo}{{hosts}}{tail}");
    // Where the backend keeps a queue, the FIFO scenario counts it, as on local servers.
    let admin = tenure::admin::connect_admin(url).await?;
    Ok(UrlHarness::new(name, &template, targets, |url| async move {
        tenure::connect(&url).await
    })
    .with_queue_admin(admin))
}

async fn target(name: &str, source: &Source, run_id: u32) -> Result<Target, String> {
    let (harness, nodes, leader, peer_links, clock_shim, secured) = match source {
        &Source::Local { secured } => {
            let (backend, wrap) = broken_backend(name)?;
            let options = TestbedOptions {
                secured,
                ..TestbedOptions::FAULTS
            };
            let local = local::start(backend, options)
                .await
                .map_err(|e| format!("starting local {backend} servers: {e}"))?;
            let links = local.peer_links;
            (
                wrap(local.harness),
                local.nodes,
                local.leader,
                links,
                local.clock_shim,
                local.secured,
            )
        }
        Source::External(url) => {
            let harness = external_harness(name, url)
                .await
                .map_err(|e| format!("{name}: {e}"))?;
            (harness, Vec::new(), None, None, false, false)
        }
    };
    let caps = {
        use tenure_conformance::Harness;
        harness
            .client()
            .await
            .map_err(|e| format!("connecting to {name}: {e}"))?
            .capabilities()
    };
    let driver = tenure::driver_for(&harness.url()).map_err(|e| format!("{name}: {e}"))?;
    if driver.name != caps.backend {
        return Err(format!(
            "{name}: the `{}` driver connected a client that says it is `{}`",
            driver.name, caps.backend
        ));
    }
    let short = {
        use tenure_conformance::Harness;
        harness.short_ttl()
    };
    // What the servers are (not what the clusters file files them under) says how to
    // probe them, which controls they offer and why a fault cannot run on them.
    let testbed = local::testbed(caps.backend).ok_or_else(|| {
        format!(
            "{name}: no testbed for backend {:?} in this build",
            caps.backend
        )
    })?;
    let probe = testbed
        .probe(&harness, short)
        .await
        .map_err(|e| format!("{name}: asking the servers: {e}"))?;
    let nodes_in_use = probe.members.unwrap_or(harness.targets().len());
    // The row of the backend the name says (what a clusters file files the servers
    // under, so that servers filed under the wrong name are a ⚠); a deliberately broken
    // wrapper (`broken:NAME`) is judged by its real backend's row.
    let backend = name.strip_prefix("broken:").map_or(name, |_| caps.backend);
    let row = local::testbed(backend)
        .ok_or_else(|| format!("{name}: no expected verdicts for backend {backend:?}"))?;
    // A column of a configuration (`postgres lease`) is judged by its URL's row: a URL
    // filed under it that does not configure it would be judged as another.
    if let Some(variant) = local::variant(name) {
        if !variant.configured_by(&harness.url()) {
            return Err(format!(
                "{name}: its URL does not set {} (the configuration the name names)",
                variant.query
            ));
        }
    }
    let config = expect::Config::of(row, &harness.url(), nodes_in_use)
        .map_err(|e| format!("{name}: {e}"))?;
    let harness_url = harness.url();
    let mut faults = FaultTarget::with_capabilities(name, harness, caps, probe.ttl)
        .with_nodes(nodes)
        .with_patient_query(testbed.patient_query)
        .with_why_not(testbed.why_not)
        .with_run_id(run_id)
        .secured(secured);
    if let Some(leader) = leader {
        faults = faults.with_leader(leader);
    }
    if let Some(links) = peer_links {
        faults = faults.with_peer_links(links);
    }
    if clock_shim {
        faults = faults.with_clock_shim();
    }
    // A way to remove its waiters' records, where the backend keeps them (not through a
    // broken variant's wrapper).
    if let Some(connect) = testbed.waiter_records {
        if !name.starts_with("broken:") {
            let records = connect(harness_url)
                .await
                .map_err(|e| format!("{name}: {e}"))?;
            faults = faults.with_waiter_records(records);
        }
    }
    if let Ok(Some((_, variant))) = local::broken(name) {
        if variant.stops_the_clock {
            faults = faults.with_stopping_clock();
        }
    }
    // A broken variant's flaw needs one server's connection: on the testbed's replicated
    // deployments it could not be wrapped, so they are not declared for it.
    if let Some(deployments) = testbed.deployments {
        if !name.starts_with("broken:") {
            let deployments =
                deployments(&faults.harness().url()).map_err(|e| format!("{name}: {e}"))?;
            faults = faults.with_deployments(deployments);
        }
    }
    // Another recipe's real client, on local plain servers (the harness starts none with
    // TLS; a user's clusters may have none installed next to them).
    if let Some(foreign) = testbed.foreign {
        if !faults.nodes().is_empty() && !secured {
            let (recipe, start) = foreign(faults.harness().url())
                .await
                .map_err(|e| format!("{name}: {e}"))?;
            faults = faults.with_foreign(recipe, start);
        }
    }
    Ok(Target {
        faults,
        config,
        ttl_why: probe.ttl_why,
    })
}

/// Wraps a harness's clients.
type Wrap = Box<dyn FnOnce(UrlHarness) -> UrlHarness + Send>;

/// The real backend behind `name`, and how to wrap its clients: `broken:NAME` is a
/// deliberately broken variant (a testbed's [`BrokenVariant`](tenure_conformance::broken::BrokenVariant)),
/// judged by its backend's expectations.
fn broken_backend(name: &str) -> Result<(&str, Wrap), String> {
    if let Some((testbed, variant)) = local::broken(name).map_err(|e| e.to_string())? {
        let wrap = move |harness: UrlHarness| harness.wrapping(variant.wrap);
        return Ok((testbed.name, Box::new(wrap)));
    }
    Ok((name, Box::new(|harness| harness)))
}

/// The cell, if it ran trials (a soak's fault never drawn did not).
fn ran(cell: Option<&Cell>) -> Option<&Cell> {
    cell.filter(|c| matches!(c, Cell::Ran { trials, .. } if *trials > 0))
}

/// Declared capabilities against the table's premises and the cells that test them.
fn checks(
    caps: &Capabilities,
    config: &expect::Config,
    suite: &[ScenarioOutcome],
    faults: &[FaultOutcome],
) -> Vec<Check> {
    let outcome = |f: Fault| faults.iter().find(|o| o.fault == f);
    let mut checks = Vec::new();
    let fifo = suite.iter().find(|s| s.name == "waiters_are_served_fifo");
    checks.push(Check {
        claim: format!("fairness {:?}", caps.fairness),
        observed: fifo.map_or("not run".into(), |s| format!("FIFO scenario {}", s.result)),
        consistent: match (caps.fairness, fifo.map(|s| s.result)) {
            (Fairness::Fifo, Some("passed")) => Some(true),
            (Fairness::Fifo, None) => None,
            (Fairness::Fifo, _) => Some(false),
            _ => None,
        },
    });
    let premise = config.premise();
    let contradictions = premise.contradictions(caps);
    // One check per declared guarantee: it must be the table's premise, and the cells
    // that exercise it must lie within the table.
    let mut check = |claim: String, fields: &[&str], premise: String, cells: &[Fault]| {
        let contradicted: Vec<&String> = contradictions
            .iter()
            .filter(|c| fields.iter().any(|f| c.starts_with(f)))
            .collect();
        let mut observed: Vec<String> = cells
            .iter()
            .filter_map(|&f| outcome(f))
            .map(|o| format!("{}: {}", o.title, o.cell.summary()))
            .collect();
        observed.extend(contradicted.iter().map(|c| format!("⚠ {c}")));
        let judged: Vec<&FaultOutcome> = cells
            .iter()
            .filter_map(|&f| outcome(f))
            .filter(|o| ran(Some(&o.cell)).is_some())
            .collect();
        checks.push(Check {
            claim,
            observed: format!("protocol: {premise}; {}", observed.join("; ")),
            consistent: if !contradicted.is_empty() {
                Some(false)
            } else if judged.is_empty() {
                None
            } else {
                Some(judged.iter().all(|o| !o.mismatch))
            },
        });
    };
    check(
        format!("fencing {:?}", caps.fencing),
        &["fencing"],
        format!("{:?}", premise.fencing),
        &[
            Fault::Restart,
            Fault::ReplicaFailover,
            Fault::SentinelFailover,
            Fault::SentinelConfirmingReplicaLost,
            Fault::ClusterFailover,
            Fault::PausedHolder,
        ],
    );
    check(
        format!("expiry {:?}", caps.expiry),
        &["expiry"],
        format!("{:?}", premise.expiry),
        &[Fault::Blackhole, Fault::ConnectionCut],
    );
    check(
        format!(
            "{}clock-dependent",
            if caps.clock_dependent { "" } else { "not " }
        ),
        &["clock-dependent"],
        if premise.clock_dependent {
            "clock-dependent"
        } else {
            "not clock-dependent"
        }
        .into(),
        &[Fault::ClockJump],
    );
    check(
        format!(
            "{:?}, tolerates {} failure(s)",
            caps.replication, caps.failures_tolerated
        ),
        &["replication", "failures"],
        format!(
            "{:?}, tolerates {}",
            premise.replication, premise.failures_tolerated
        ),
        &[Fault::MinorityLoss, Fault::ServerPause],
    );
    checks
}

/// The shared suite against one backend.
async fn suite(target: &Target, progress: &Progress) -> Vec<ScenarioOutcome> {
    use tenure_conformance::Harness;
    let harness: &dyn Harness = target.harness();
    let mut outcomes = Vec::new();
    for scenario in scenarios() {
        let (result, detail) = match run_scenario(&scenario, harness, target.capabilities()).await {
            ScenarioResult::Passed => ("passed", None),
            ScenarioResult::Failed(why) => ("failed", Some(why)),
            ScenarioResult::Unsupported(why) => ("ignored", Some(why)),
        };
        outcomes.push(ScenarioOutcome {
            name: scenario.name,
            result,
            detail,
        });
        progress.step(&format!("{}: {}", target.name(), scenario.name));
    }
    outcomes
}

/// One fault's cell, run on a backend first brought back to health (see [`health`]):
/// what had to be repaired goes into the cell's notes; a backend that cannot be repaired
/// gives [`Cell::Unhealthy`] saying what is wrong.
async fn cell(fault: Fault, target: &Target, options: &MatrixOptions) -> Cell {
    if let Some(cell) = faults::applicability(fault, target) {
        return cell;
    }
    let repairs = match faults::ensure(target).await {
        Ok(repairs) => repairs,
        Err(reason) => return Cell::Unhealthy { reason },
    };
    let mut cell = faults::run(fault, target, options.trials, options.rounds).await;
    if let Cell::Ran { notes, .. } = &mut cell {
        for (i, repair) in repairs.into_iter().enumerate() {
            notes.insert(i, format!("before this cell, {repair}"));
        }
    }
    cell
}

/// `cell` judged against what the table of [`expect`] allows on `target`.
fn outcome(fault: Fault, target: &Target, cell: Cell) -> FaultOutcome {
    let expected = expect::expect(&target.config, fault);
    FaultOutcome {
        fault,
        title: fault.title(),
        mismatch: !expected.allows(&cell.verdicts()),
        cell,
        expected: expected.verdicts.to_vec(),
        reason: expected.reason,
    }
}

/// Every fault against one backend.
async fn faults(
    target: &Target,
    options: &MatrixOptions,
    progress: &Progress,
) -> Vec<FaultOutcome> {
    let mut outcomes = Vec::new();
    for &fault in &options.faults {
        let cell = cell(fault, target, options).await;
        outcomes.push(outcome(fault, target, cell));
        progress.step(&format!("{}: {}", target.name(), fault.title()));
    }
    outcomes
}

/// A soak of one backend: until its time is up, a fault drawn at random from those that
/// can run on its servers, run as a cell of one round (on a backend brought back to
/// health first, as every cell). Returns each fault's draws as one cell, and the faults
/// in the order drawn.
async fn soak(
    target: &Target,
    options: &MatrixOptions,
    soak: &Soak,
    progress: &Progress,
) -> (Vec<FaultOutcome>, Vec<Fault>) {
    let runnable: Vec<Fault> = (options.faults.iter().copied())
        .filter(|&fault| faults::applicability(fault, target).is_none())
        .collect();
    let mut draws = soak.draws(target.name());
    let mut cells: std::collections::BTreeMap<Fault, Cell> = Default::default();
    let mut schedule = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(soak.secs);
    while !runnable.is_empty() && Instant::now() < until {
        let fault = runnable[draws.random_range(0..runnable.len())];
        progress.add(1);
        schedule.push(fault);
        let this_draw = Target {
            faults: target.for_draw(schedule.len()),
            ..target.clone()
        };
        let drawn = cell(fault, &this_draw, options).await;
        let merged = match cells.remove(&fault) {
            Some(earlier) => earlier.merge(drawn),
            None => drawn,
        };
        cells.insert(fault, merged);
        progress.step(&format!(
            "{}: draw {}, {}",
            target.name(),
            schedule.len(),
            fault.title()
        ));
    }
    let outcomes = (options.faults.iter())
        .map(|&fault| {
            let cell = (cells.remove(&fault))
                .or_else(|| faults::applicability(fault, target))
                .unwrap_or_else(|| Cell::from_trials(Vec::new(), 0));
            outcome(fault, target, cell)
        })
        .collect();
    (outcomes, schedule)
}

fn servers_text(target: &Target) -> String {
    let servers: String = match target.nodes().len() {
        0 if target.harness().targets().is_empty() => "no server: files on this host".into(),
        0 => format!(
            "{} host(s) of the user's cluster",
            target.harness().targets().len()
        ),
        1 => "1 local server".into(),
        n => format!("{n} local servers"),
    };
    match target.is_secured() {
        true => servers + " requiring TLS, a client certificate and a password",
        false => servers,
    }
}

fn failed_report(name: &str, error: String) -> BackendReport {
    BackendReport {
        backend: name.to_owned(),
        servers: String::new(),
        ttl_ms: 0,
        ttl_why: String::new(),
        capabilities: None,
        suite: Vec::new(),
        faults: Vec::new(),
        schedule: Vec::new(),
        perf: Vec::new(),
        checks: Vec::new(),
        error: Some(error),
    }
}

/// Measures every backend in `sources`: servers start together; the suite runs one
/// backend at a time, the fault trials on all backends at once (they mostly wait on TTLs
/// and injected faults), the performance runs one backend at a time again.
///
/// # Cancel safety
/// Dropping it stops the servers it started; locks on external clusters expire by TTL.
pub async fn run(
    sources: Vec<(String, Source)>,
    options: &MatrixOptions,
    progress: &Progress,
) -> Matrix {
    let started = Instant::now();
    let run_id = rand::random::<u32>();
    let suite_and_perf = match options.suite_and_perf {
        true => scenarios().len() + Mode::ALL.len(),
        false => 0,
    };
    // A soak counts its draws as they come.
    let cells = match options.soak {
        Some(_) => 0,
        None => options.faults.len(),
    };
    let per_backend = suite_and_perf + cells + 1;
    progress.add(per_backend * sources.len());
    let targets = futures::future::join_all(sources.iter().map(|(name, source)| async move {
        let t = target(name, source, run_id).await;
        progress.step(&format!("{name}: servers up"));
        t
    }))
    .await;
    // The suite checks timing-sensitive behaviour (waits, expiry, renewal): one backend
    // at a time, so the others' trials do not eat its CPU.
    let mut suites = Vec::with_capacity(targets.len());
    for target in &targets {
        suites.push(match target {
            Ok(target) if options.suite_and_perf => suite(target, progress).await,
            _ => Vec::new(),
        });
    }
    let fault_outcomes = futures::future::join_all(targets.iter().map(|target| async move {
        match (target, &options.soak) {
            (Ok(target), Some(chaos)) => soak(target, options, chaos, progress).await,
            (Ok(target), None) => (faults(target, options, progress).await, Vec::new()),
            (Err(_), _) => (Vec::new(), Vec::new()),
        }
    }))
    .await;
    let mut reports: Vec<BackendReport> = sources
        .iter()
        .zip(&targets)
        .zip(suites.into_iter().zip(fault_outcomes))
        .map(
            |(((name, _), target), (suite, (faults, schedule)))| match target {
                Ok(target) => BackendReport {
                    backend: name.clone(),
                    servers: servers_text(target),
                    capabilities: Some(CapabilitiesReport::from(target.capabilities())),
                    ttl_ms: u64::try_from(target.ttl().as_millis()).unwrap_or(u64::MAX),
                    ttl_why: target.ttl_why.clone(),
                    checks: checks(target.capabilities(), &target.config, &suite, &faults),
                    suite,
                    faults,
                    schedule,
                    perf: Vec::new(),
                    error: None,
                },
                Err(error) => {
                    progress.skip(per_backend - 1);
                    failed_report(name, error.clone())
                }
            },
        )
        .collect();
    for (report, target) in reports.iter_mut().zip(&targets) {
        let (Ok(target), true) = (target, options.suite_and_perf) else {
            continue;
        };
        if let Err(why) = faults::ensure(target).await {
            report.error = Some(format!("perf not run, backend unhealthy: {why}"));
            progress.skip(Mode::ALL.len());
            continue;
        }
        let perf_options = BenchOptions {
            secs: options.perf_secs,
            ttl: Duration::from_secs(10),
            ..BenchOptions::default()
        };
        for mode in Mode::ALL {
            match bench::run(&target.harness().url(), mode, perf_options).await {
                Ok(lines) => report.perf.extend(lines),
                Err(e) => report.error = Some(format!("perf {mode}: {e}")),
            }
            progress.step(&format!("{}: perf {mode}", target.name()));
        }
    }
    drop(targets);
    Matrix {
        measured_at: report::utc_now(),
        machine: report::machine(),
        options: options.clone(),
        elapsed_secs: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        backends: reports,
    }
}

#[cfg(test)]
mod evidence_tests;
#[cfg(test)]
mod external_tests;
#[cfg(test)]
mod health_tests;
#[cfg(test)]
mod run_fault_tests;
