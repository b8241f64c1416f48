//! `tenure matrix`: the decision matrix, measured. For every backend: the shared
//! scenario suite, the fault scenarios of [`faults`] (each over many trials, with
//! verdicts SAFE / F-SAFE / UNSAFE / UNAVAIL), a short performance run, and a check of
//! the backend's declared [`Capabilities`] against what was observed.

pub mod faults;
mod health;
pub mod report;

use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tenure_api::{
    Capabilities, DistributedLock, Fairness, FencingKind, LockError, LockKey, Replication,
};
use tenure_conformance::runner::{run_scenario, ScenarioResult};
use tenure_conformance::servers::Node;
use tenure_conformance::{scenarios, UrlHarness};

use crate::bench::{self, BenchLine, BenchOptions, Mode};
use crate::local::{self, LeaderFn, LocalOptions, PeerLinks};
pub use faults::{Cell, Fault, Verdict};

/// How much to run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MatrixOptions {
    /// Trials per fault and backend.
    pub trials: usize,
    /// Separate injections of each server fault (its trials are split among them).
    pub rounds: usize,
    /// Seconds per performance mode.
    pub perf_secs: f64,
    /// Backends to run (default: every backend of this build).
    pub backends: Vec<String>,
}

impl Default for MatrixOptions {
    fn default() -> Self {
        Self {
            trials: 20,
            rounds: 4,
            perf_secs: 2.0,
            backends: local::backends().into_iter().map(String::from).collect(),
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

/// A backend under test: a harness, and for local servers the processes behind it.
#[derive(Clone)]
pub struct Target {
    name: String,
    harness: UrlHarness,
    nodes: Vec<Arc<dyn Node>>,
    leader: Option<LeaderFn>,
    peer_links: Option<Arc<dyn PeerLinks>>,
    clock_shim: bool,
    caps: Capabilities,
    ttl: Duration,
    patient_query: String,
    run_id: u32,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("harness", &self.harness)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Target {
    fn key(&self, fault: Fault, round: usize, index: usize) -> LockKey {
        let name = format!(
            "tenure-matrix/{:08x}/{fault:?}/{round}/{index}",
            self.run_id
        );
        LockKey::new(name).expect("ascii key well under the length limit")
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        use tenure_conformance::Harness;
        self.harness.client().await
    }
}

/// Options for clients that must wait out a delayed reply instead of timing out first.
fn patient_query(backend: &str) -> &'static str {
    match backend {
        "redis" | "postgres" => "command_timeout_ms=5000",
        "redlock" => "node_timeout_ms=5000",
        "etcd" => "request_timeout_ms=10000",
        "zk" => "session_timeout_ms=4000&op_timeout_ms=5000",
        _ => "",
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

/// One fault's cell with what the declared capabilities predict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultOutcome {
    /// The fault.
    pub fault: Fault,
    /// Its title.
    pub title: &'static str,
    /// What happened.
    pub cell: Cell,
    /// Verdicts the backend's declared capabilities allow.
    pub expected: Vec<Verdict>,
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
    /// Declared capabilities.
    pub capabilities: Option<CapabilitiesReport>,
    /// The shared suite.
    pub suite: Vec<ScenarioOutcome>,
    /// The fault scenarios.
    pub faults: Vec<FaultOutcome>,
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
                crate::redact_url(e.message())
            ))
        })
    }
}

/// Where a backend's servers come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Start local servers with the conformance launcher.
    Local,
    /// Use the user's servers at this URL.
    External(String),
}

/// Splits `scheme://[user@]h1:p1,h2:p2/rest` into a `{hosts}` template and the addresses.
async fn external_harness(name: &str, url: &str) -> Result<UrlHarness, LockError> {
    let bad = || {
        LockError::Config(format!(
            "cannot find the hosts in {}",
            crate::redact_url(url)
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
            crate::redact_url(url)
        )));
    }
    let template = format!("{scheme}://{userinfo}{{hosts}}{tail}");
    Ok(UrlHarness::new(
        name,
        &template,
        targets,
        |url| async move { crate::connect(&url).await },
    ))
}

async fn target(name: &str, source: &Source, run_id: u32) -> Result<Target, String> {
    let (harness, nodes, leader, peer_links, clock_shim) = match source {
        Source::Local => {
            let local = local::start(name, LocalOptions { clock_shim: true })
                .await
                .map_err(|e| format!("starting local {name} servers: {e}"))?;
            let links = local.peer_links;
            (
                local.harness,
                local.nodes,
                local.leader,
                links,
                local.clock_shim,
            )
        }
        Source::External(url) => {
            let harness = external_harness(name, url)
                .await
                .map_err(|e| e.to_string())?;
            (harness, Vec::new(), None, None, false)
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
    let ttl = {
        use tenure_conformance::Harness;
        harness.short_ttl()
    };
    Ok(Target {
        name: name.to_owned(),
        patient_query: patient_query(name).to_owned(),
        harness,
        nodes,
        leader,
        peer_links,
        clock_shim,
        caps,
        ttl,
        run_id,
    })
}

/// The verdicts `caps` predict for `fault` on `nodes` servers.
pub fn expected(caps: &Capabilities, fault: Fault, nodes: usize) -> Vec<Verdict> {
    use Verdict::*;
    let fenced = caps.fencing != FencingKind::None;
    let violation = if fenced { FencedSafe } else { Unsafe };
    match fault {
        Fault::PausedHolder => vec![violation],
        Fault::DelayedReply | Fault::Blackhole | Fault::LostReply => vec![Safe],
        // A reset connection ends a Postgres holder's transaction at once; the loss is
        // pushed to its guard before a contender can be granted. Elsewhere the grant
        // outlives the connection and the holder's renewals fail before it expires.
        Fault::ConnectionCut => vec![Safe],
        Fault::ClockJump if caps.clock_dependent => vec![violation],
        Fault::ClockJump => vec![Safe],
        Fault::Restart => match caps.fencing {
            // A memory-only server forgets the grant and resets its counter…
            FencingKind::SingleNodeCounter => vec![Unsafe],
            // …unless the counter restarts from the server's clock (SAFE where the holder
            // learned of its loss before the second grant).
            FencingKind::ClockFlooredCounter => vec![Safe, FencedSafe],
            // One node of the holder's quorum forgets: a second grant follows, and whether
            // its token exceeds the first depends on how many failed attempts raised the
            // counters of the other nodes meanwhile — containment is luck.
            FencingKind::QuorumRegister => vec![Safe, FencedSafe, Unsafe],
            // Consensus: the grant survives. Postgres: a restart ends the holder's
            // transaction, and the closed connection is pushed to its guard before the
            // restarted server can grant again.
            _ => vec![Safe, Unavail],
        },
        Fault::MinorityLoss if caps.failures_tolerated >= (nodes.max(1) - 1) / 2 => vec![Safe],
        Fault::MinorityLoss => vec![Safe, Unavail],
        Fault::ServerPause => match caps.replication {
            _ if caps.failures_tolerated == 0 => vec![Unavail],
            Replication::IndependentQuorum { .. } => vec![Safe],
            // A frozen leader costs an election: some trials may see no leader.
            _ => vec![Safe, Unavail],
        },
        Fault::ReplicaFailover if caps.fencing == FencingKind::ClockFlooredCounter => {
            vec![Safe, FencedSafe]
        }
        Fault::ReplicaFailover => vec![Unsafe],
        // Grants and renewals are proven through the leader.
        Fault::FollowerPartition => vec![Safe],
    }
}

fn has_violation(cell: &Cell) -> Option<bool> {
    match cell {
        Cell::Ran { .. } => Some(
            cell.verdicts()
                .iter()
                .any(|v| matches!(v, Verdict::Unsafe | Verdict::FencedSafe)),
        ),
        _ => None,
    }
}

/// Declared capabilities against observations.
fn checks(caps: &Capabilities, suite: &[ScenarioOutcome], faults: &[FaultOutcome]) -> Vec<Check> {
    let cell = |f: Fault| faults.iter().find(|o| o.fault == f).map(|o| &o.cell);
    let mut checks = Vec::new();
    let fifo = suite.iter().find(|s| s.name == "waiters_are_served_fifo");
    checks.push(Check {
        claim: format!("fairness {:?}", caps.fairness),
        observed: fifo.map_or("not run".into(), |s| format!("FIFO scenario {}", s.result)),
        consistent: match (caps.fairness, fifo.map(|s| s.result)) {
            (Fairness::Fifo, Some("passed")) => Some(true),
            (Fairness::Fifo, _) => Some(false),
            _ => None,
        },
    });
    let jump = cell(Fault::ClockJump);
    checks.push(Check {
        claim: format!(
            "{}clock-dependent",
            if caps.clock_dependent { "" } else { "not " }
        ),
        observed: match jump {
            Some(c @ Cell::Ran { .. }) => format!("server clock jump: {}", c.summary()),
            Some(c) => format!("server clock jump {}", c.summary()),
            None => "not run".into(),
        },
        consistent: jump
            .and_then(has_violation)
            .map(|v| v == caps.clock_dependent),
    });
    let minority = cell(Fault::MinorityLoss);
    let pause = cell(Fault::ServerPause);
    let survived = |c: Option<&Cell>| {
        c.filter(|c| matches!(c, Cell::Ran { .. }))
            .map(|c| !c.verdicts().contains(&Verdict::Unavail))
    };
    checks.push(Check {
        claim: format!("tolerates {} failure(s)", caps.failures_tolerated),
        observed: format!(
            "minority loss: {}; server SIGSTOP: {}",
            minority.map_or("not run".into(), Cell::summary),
            pause.map_or("not run".into(), Cell::summary)
        ),
        consistent: match caps.failures_tolerated {
            0 => survived(pause).map(|up| !up),
            _ => survived(minority),
        },
    });
    let restart = cell(Fault::Restart);
    let regressed = |c: &Cell| match c {
        Cell::Ran { notes, counts, .. } => {
            counts.contains_key(&Verdict::Unsafe)
                || notes.iter().any(|n| n.starts_with("fence regressed"))
        }
        _ => false,
    };
    checks.push(Check {
        claim: format!("fencing {:?}", caps.fencing),
        observed: restart.map_or("not run".into(), |c| format!("restart: {}", c.summary())),
        consistent: restart
            .filter(|c| matches!(c, Cell::Ran { .. }))
            .map(|c| match caps.fencing {
                FencingKind::SingleNodeCounter | FencingKind::None => regressed(c),
                FencingKind::QuorumRegister => true,
                _ => !regressed(c),
            }),
    });
    checks
}

/// The shared suite against one backend.
async fn suite(target: &Target, progress: &Progress) -> Vec<ScenarioOutcome> {
    use tenure_conformance::Harness;
    let harness: &dyn Harness = &target.harness;
    let mut outcomes = Vec::new();
    for scenario in scenarios() {
        let (result, detail) = match run_scenario(&scenario, harness, &target.caps).await {
            ScenarioResult::Passed => ("passed", None),
            ScenarioResult::Failed(why) => ("failed", Some(why)),
            ScenarioResult::Unsupported(why) => ("ignored", Some(why)),
        };
        outcomes.push(ScenarioOutcome {
            name: scenario.name,
            result,
            detail,
        });
        progress.step(&format!("{}: {}", target.name, scenario.name));
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
    let repairs = match health::ensure(target).await {
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

/// Every fault against one backend.
async fn faults(
    target: &Target,
    options: &MatrixOptions,
    progress: &Progress,
) -> Vec<FaultOutcome> {
    let mut outcomes = Vec::new();
    for fault in Fault::ALL {
        let cell = cell(fault, target, options).await;
        let expected = expected(&target.caps, fault, target.nodes.len());
        let mismatch = cell.verdicts().iter().any(|v| !expected.contains(v));
        outcomes.push(FaultOutcome {
            fault,
            title: fault.title(),
            cell,
            expected,
            mismatch,
        });
        progress.step(&format!("{}: {}", target.name, fault.title()));
    }
    outcomes
}

fn servers_text(target: &Target) -> String {
    match target.nodes.len() {
        0 => format!(
            "{} host(s) of the user's cluster",
            target.harness.targets().len()
        ),
        1 => "1 local server".into(),
        n => format!("{n} local servers"),
    }
}

fn failed_report(name: &str, error: String) -> BackendReport {
    BackendReport {
        backend: name.to_owned(),
        servers: String::new(),
        capabilities: None,
        suite: Vec::new(),
        faults: Vec::new(),
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
    let per_backend = scenarios().len() + Fault::ALL.len() + Mode::ALL.len() + 1;
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
            Ok(target) => suite(target, progress).await,
            Err(_) => Vec::new(),
        });
    }
    let fault_outcomes = futures::future::join_all(targets.iter().map(|target| async move {
        match target {
            Ok(target) => faults(target, options, progress).await,
            Err(_) => Vec::new(),
        }
    }))
    .await;
    let mut reports: Vec<BackendReport> = sources
        .iter()
        .zip(&targets)
        .zip(suites.into_iter().zip(fault_outcomes))
        .map(|(((name, _), target), (suite, faults))| match target {
            Ok(target) => BackendReport {
                backend: name.clone(),
                servers: servers_text(target),
                capabilities: Some(CapabilitiesReport::from(&target.caps)),
                checks: checks(&target.caps, &suite, &faults),
                suite,
                faults,
                perf: Vec::new(),
                error: None,
            },
            Err(error) => {
                progress.skip(per_backend - 1);
                failed_report(name, error.clone())
            }
        })
        .collect();
    for (report, target) in reports.iter_mut().zip(&targets) {
        let Ok(target) = target else { continue };
        if let Err(why) = health::ensure(target).await {
            report.error = Some(format!("perf not run, backend unhealthy: {why}"));
            progress.skip(Mode::ALL.len());
            continue;
        }
        let perf_options = BenchOptions {
            secs: options.perf_secs,
            ttl: Duration::from_secs(10),
            floor: false,
        };
        for mode in Mode::ALL {
            match bench::run(&target.harness.url(), mode, perf_options).await {
                Ok(lines) => report.perf.extend(lines),
                Err(e) => report.error = Some(format!("perf {mode}: {e}")),
            }
            progress.step(&format!("{}: perf {mode}", target.name));
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
