//! Runs the suite and the fault suite as `cargo test` targets (`harness = false`) with
//! `libtest-mimic`: one named test per scenario or fault, so the output reads as the
//! backend's row of the matrix.

use std::error::Error;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Conclusion, Failed, Trial};
use tenure_api::Capabilities;

use crate::faults::expect::Expect;
use crate::faults::{self, Cell, Fault, FaultTarget};
use crate::suite::{scenarios, Ctx, Scenario};
use crate::Harness;

/// How long one scenario may run before it counts as failed.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

/// What happened when one scenario ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScenarioResult {
    /// It passed.
    Passed,
    /// It failed, with the reason.
    Failed(String),
    /// The backend does not meet a requirement; the scenario did not run.
    Unsupported(String),
}

/// Runs one scenario against `harness` with keys under a fresh prefix.
///
/// # Cancel safety
/// Dropping the future abandons the scenario; locks it held expire by TTL.
pub async fn run_scenario(
    scenario: &Scenario,
    harness: &dyn Harness,
    caps: &Capabilities,
) -> ScenarioResult {
    if let Some(req) = scenario.unmet(caps, harness) {
        return ScenarioResult::Unsupported(format!("needs {req:?}"));
    }
    let prefix = format!(
        "tenure-suite/{}/{:08x}",
        scenario.name,
        rand::random::<u32>()
    );
    let ctx = Ctx::new(harness, prefix);
    match tokio::time::timeout(SCENARIO_TIMEOUT, (scenario.run)(&ctx)).await {
        Ok(Ok(())) => ScenarioResult::Passed,
        Ok(Err(failure)) => ScenarioResult::Failed(failure.0),
        Err(_) => ScenarioResult::Failed(format!("timed out after {SCENARIO_TIMEOUT:?}")),
    }
}

/// The body of a `harness = false` test that runs the suite on one setup (a [`Suites`]
/// of one group): starts the harness with `start` (servers and all), runs every scenario
/// as a named test, stops the harness, and returns the conclusion — call `.exit()` on it
/// *after* this returns, so servers are stopped before the process exits.
///
/// A harness that cannot start makes every scenario fail when `CI=true`, and ignored
/// (with the reason printed) otherwise.
///
/// ```no_run
/// use tenure_conformance::{runner, MemoryHarness};
/// fn main() {
///     runner::run_suite(|| async { Ok(MemoryHarness::new()) }).exit();
/// }
/// ```
pub fn run_suite<H, F, Fut>(start: F) -> Conclusion
where
    H: Harness + 'static,
    F: FnOnce() -> Fut + 'static,
    Fut: Future<Output = Result<H, Box<dyn Error + Send + Sync>>>,
{
    Suites::new().suite("", start).run()
}

/// Trials of each fault in a backend's fault-suite test (one injection).
pub const FAULT_TRIALS: usize = 3;

/// How long one fault's trials may run (a Redis Cluster failover alone may take a minute).
pub const FAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs [`FAULT_TRIALS`] trials of `fault` on `target`, on servers first brought back
/// to health, and checks the cell against `expected` (a backend's cell
/// of the table, [`expect`](crate::faults::expect::expect), from the row its testbed
/// names; for a backend without one, [`never_unsafe`](crate::faults::expect::never_unsafe)): a verdict the protocol does
/// not allow (an UNSAFE where fencing should contain it; a SAFE where the table says the
/// violation must be observed) is the failure, with the cell's notes, and so are lost
/// updates its verdicts do not explain ([`Cell::check_updates`]). An injection that
/// left no evidence in any trial (a server that took too long to stop) is made once
/// more, on keys of its own, its trials added to the cell; a fault that fired in no trial
/// then fails too.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, a fault may be left injected (the next run repairs
/// it).
pub async fn run_fault(
    fault: Fault,
    target: &FaultTarget,
    expected: &Expect,
) -> Result<(), String> {
    let mut cell = None;
    for injection in 0..2 {
        // The second injection's trials take keys of their own: nothing the first left
        // held (a lease of a trial that failed midway) meets them.
        let target = match injection {
            0 => target.clone(),
            _ => target.clone().with_run_id(rand::random()),
        };
        let target = &target;
        if let Err(why) = faults::ensure(target).await {
            return Err(format!(
                "the servers are not healthy before the fault: {why}"
            ));
        }
        let run = faults::run(fault, target, FAULT_TRIALS, 1).await;
        let merged = match cell.take() {
            Some(earlier) => Cell::merge(earlier, run),
            None => run,
        };
        let done = merged.judged();
        cell = Some(merged);
        if done {
            break;
        }
    }
    let cell = cell.expect("at least one run");
    let notes = match &cell {
        Cell::Ran { notes, .. } if !cell.judged() => {
            let summary = cell.summary();
            return Err(format!("the fault fired in no trial: {summary}: {notes:?}"));
        }
        Cell::Ran { notes, .. } => notes,
        other => {
            let why = other.reason().unwrap_or_default();
            return Err(format!("{}: {why}", other.summary()));
        }
    };
    if !expected.allows(&cell.verdicts()) {
        return Err(format!(
            "{}, where the protocol allows only {:?} ({}): {notes:?}",
            cell.summary(),
            expected.verdicts,
            expected.reason
        ));
    }
    cell.check_updates(fault)
}

/// The body of a `harness = false` test that runs only the fault suite (a [`Suites`] of
/// one group, see [`Suites::faults`]): starts the backend's servers and the [`FaultTarget`] over them with `start`, with the verdicts
/// each fault may show (a backend's row of the table:
/// `|fault| expect::expect(&config, fault)`; for a backend without one,
/// [`never_unsafe`](crate::faults::expect::never_unsafe)),
/// and runs every fault of [`Fault::ALL`] as a named test ([`run_fault`]), one at a time
/// (they share the servers). A fault the target cannot inject, or that does not apply
/// (no verdict expected), is *ignored*. Call `.exit()` on the conclusion after this
/// returns.
///
/// ```no_run
/// # async fn servers() -> Result<tenure_conformance::faults::FaultTarget, Box<dyn std::error::Error + Send + Sync>> { unimplemented!() }
/// use tenure_conformance::faults::expect;
/// use tenure_conformance::runner;
/// fn main() {
///     runner::run_fault_suite(|| async { Ok((servers().await?, expect::never_unsafe)) }).exit();
/// }
/// ```
pub fn run_fault_suite<F, Fut, E>(start: F) -> Conclusion
where
    F: FnOnce() -> Fut + 'static,
    Fut: Future<Output = Result<(FaultTarget, E), Box<dyn Error + Send + Sync>>>,
    E: Fn(Fault) -> Expect,
{
    Suites::new().faults("", start).run()
}

/// Started servers, made into named tests (on the runtime they run on).
type Start =
    Box<dyn FnOnce(&tokio::runtime::Runtime) -> Result<Vec<Trial>, Box<dyn Error + Send + Sync>>>;

/// One group of a [`Suites`]: its tests' names, and how to start what they run on.
struct Group {
    names: Vec<String>,
    start: Start,
}

/// The `harness = false` test binary of a backend crate: groups of named tests — the
/// shared suite on each setup (plain, a variant, secured), and the fault suite — each on
/// servers of its own. A group's servers start only if one of its tests is selected
/// (`--list`, or a filter that selects none of it, starts nothing), one group at a time,
/// each group's stopped before the next one's start. A test is named `group::name`
/// (just `name` in a group named `""`). Call `.exit()` on [`run`](Self::run)'s
/// conclusion.
///
/// A group whose servers cannot start makes each of its tests fail when `CI=true`, and
/// ignored (the reason printed) otherwise.
///
/// ```no_run
/// use tenure_conformance::{runner::Suites, MemoryHarness};
/// fn main() {
///     Suites::new()
///         .suite("memory", || async { Ok(MemoryHarness::new()) })
///         .run()
///         .exit();
/// }
/// ```
#[derive(Default)]
pub struct Suites {
    groups: Vec<Group>,
}

impl std::fmt::Debug for Suites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tests: usize = self.groups.iter().map(|g| g.names.len()).sum();
        f.debug_struct("Suites")
            .field("groups", &self.groups.len())
            .field("tests", &tests)
            .finish_non_exhaustive()
    }
}

impl Suites {
    /// No groups yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared suite on the harness `start` starts: one test per scenario (ignored
    /// where the backend does not meet a scenario's requirements).
    pub fn suite<H, F, Fut>(mut self, group: &str, start: F) -> Self
    where
        H: Harness + 'static,
        F: FnOnce() -> Fut + 'static,
        Fut: Future<Output = Result<H, Box<dyn Error + Send + Sync>>>,
    {
        let prefix = prefix(group);
        let names = scenarios()
            .iter()
            .map(|s| format!("{prefix}{}", s.name))
            .collect();
        let start: Start = Box::new(move |runtime| {
            let (harness, caps) = runtime.block_on(async {
                let harness = start().await?;
                let caps = harness.client().await?.capabilities();
                Ok::<_, Box<dyn Error + Send + Sync>>((Arc::new(harness), caps))
            })?;
            let handle = runtime.handle();
            Ok(scenarios()
                .into_iter()
                .map(|scenario| {
                    let unmet = scenario.unmet(&caps, harness.as_ref());
                    let (harness, handle) = (harness.clone(), handle.clone());
                    let name = format!("{prefix}{}", scenario.name);
                    Trial::test(name, move || {
                        let run = run_scenario(&scenario, harness.as_ref(), &caps);
                        match handle.block_on(run) {
                            ScenarioResult::Failed(reason) => Err(Failed::from(reason)),
                            _ => Ok(()),
                        }
                    })
                    .with_ignored_flag(unmet.is_some())
                })
                .collect())
        });
        self.groups.push(Group { names, start });
        self
    }

    /// The fault suite on the target `start` starts, with the verdicts each fault may
    /// show (a backend's row of the table: `|fault|
    /// expect::expect(&config, fault)`; for a backend without one,
    /// [`never_unsafe`](crate::faults::expect::never_unsafe)): one test per fault of
    /// [`Fault::ALL`] ([`run_fault`]), one at a time (they share the servers). A fault
    /// the target cannot inject, or that does not apply (no verdict expected), is
    /// *ignored*.
    pub fn faults<F, Fut, E>(mut self, group: &str, start: F) -> Self
    where
        F: FnOnce() -> Fut + 'static,
        Fut: Future<Output = Result<(FaultTarget, E), Box<dyn Error + Send + Sync>>>,
        E: Fn(Fault) -> Expect,
    {
        let prefix = prefix(group);
        let names = Fault::ALL
            .iter()
            .map(|f| format!("{prefix}{}", f.name()))
            .collect();
        let start: Start = Box::new(move |runtime| {
            let (target, expected) = runtime.block_on(start())?;
            let (target, turn) = (Arc::new(target), Arc::new(tokio::sync::Mutex::new(())));
            let handle = runtime.handle();
            Ok(Fault::ALL
                .into_iter()
                .map(|fault| {
                    let expected = expected(fault);
                    let skip = faults::applicability(fault, &target).is_some()
                        || expected.verdicts.is_empty();
                    let (target, turn, handle) = (target.clone(), turn.clone(), handle.clone());
                    Trial::test(format!("{prefix}{}", fault.name()), move || {
                        if skip {
                            return Ok(()); // run with --include-ignored: nothing to run
                        }
                        handle.block_on(async {
                            let _turn = turn.lock().await;
                            let run = run_fault(fault, &target, &expected);
                            match tokio::time::timeout(FAULT_TIMEOUT, run).await {
                                Ok(result) => result.map_err(Failed::from),
                                Err(_) => Err(format!("timed out after {FAULT_TIMEOUT:?}").into()),
                            }
                        })
                    })
                    .with_ignored_flag(skip)
                })
                .collect())
        });
        self.groups.push(Group { names, start });
        self
    }

    /// Runs the selected tests, group by group, on a two-worker runtime, and stops it
    /// (so every server is stopped before the caller exits the process).
    pub fn run(self) -> Conclusion {
        let args = Arguments::from_args();
        // Selected before anything starts: the filter and `--skip` read names only. Which
        // tests are ignored is known only once the servers run, so with `--ignored` each
        // name counts as possibly ignored.
        let placeholder =
            |name: &String| Trial::test(name.clone(), || Ok(())).with_ignored_flag(args.ignored);
        let selected = |group: &Group| {
            group
                .names
                .iter()
                .any(|name| !args.is_filtered_out(&placeholder(name)))
        };
        if args.list {
            let names = self.groups.iter().flat_map(|g| g.names.iter());
            return libtest_mimic::run(&args, names.map(placeholder).collect());
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("cannot build a tokio runtime: {e}");
                return libtest_mimic::run(&args, Vec::new());
            }
        };
        let mut total: Option<Conclusion> = None;
        for group in self.groups {
            let conclusion = if selected(&group) {
                // A start that panics fails its own group, not the ones after it.
                let start = std::panic::AssertUnwindSafe(|| (group.start)(&runtime));
                let started = std::panic::catch_unwind(start).unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    Err(format!("the start panicked: {why}").into())
                });
                match started {
                    // The trials, and the servers they hold, are dropped once they ran.
                    Ok(trials) => libtest_mimic::run(&args, trials),
                    Err(error) => libtest_mimic::run(&args, not_started(group.names, &*error)),
                }
            } else {
                filtered_out(group.names.len() as u64)
            };
            total = Some(match total {
                None => conclusion,
                Some(sum) => add(sum, conclusion),
            });
        }
        // Stop every server before the caller exits the process.
        runtime.shutdown_timeout(Duration::from_secs(5));
        total.unwrap_or_else(|| filtered_out(0))
    }
}

/// The name prefix of a group's tests.
fn prefix(group: &str) -> String {
    match group {
        "" => String::new(),
        group => format!("{group}::"),
    }
}

/// The tests of a group whose servers did not start: each fails with the reason when
/// `CI=true`, and is ignored otherwise.
fn not_started(names: Vec<String>, error: &(dyn Error + Send + Sync)) -> Vec<Trial> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    eprintln!("the backend's servers could not be started: {error}");
    let message = error.to_string();
    names
        .into_iter()
        .map(|name| {
            let message = message.clone();
            Trial::test(name, move || {
                Err(Failed::from(format!("harness did not start: {message}")))
            })
            .with_ignored_flag(!in_ci)
        })
        .collect()
}

/// The conclusion of `n` tests filtered out.
fn filtered_out(n: u64) -> Conclusion {
    Conclusion {
        num_filtered_out: n,
        num_passed: 0,
        num_failed: 0,
        num_ignored: 0,
        num_measured: 0,
    }
}

/// Two groups' conclusions as one.
fn add(a: Conclusion, b: Conclusion) -> Conclusion {
    Conclusion {
        num_filtered_out: a.num_filtered_out + b.num_filtered_out,
        num_passed: a.num_passed + b.num_passed,
        num_failed: a.num_failed + b.num_failed,
        num_ignored: a.num_ignored + b.num_ignored,
        num_measured: a.num_measured + b.num_measured,
    }
}
