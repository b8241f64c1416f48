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

/// The body of a backend's `tests/conformance.rs`: starts the harness with `start`
/// (servers and all), runs every scenario as a named test, stops the harness, and
/// returns the conclusion — call `.exit()` on it *after* this returns, so servers are
/// stopped before the process exits.
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
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<H, Box<dyn Error + Send + Sync>>>,
{
    let names = scenarios().iter().map(|s| s.name.to_owned()).collect();
    let start = || async {
        let harness = start().await?;
        let caps = harness.client().await?.capabilities();
        Ok((Arc::new(harness), caps))
    };
    run_started(start, names, |(harness, caps), handle| {
        scenarios()
            .into_iter()
            .map(|scenario| {
                let unmet = scenario.unmet(&caps, harness.as_ref());
                let (harness, handle) = (harness.clone(), handle.clone());
                Trial::test(scenario.name, move || {
                    match handle.block_on(run_scenario(&scenario, harness.as_ref(), &caps)) {
                        ScenarioResult::Failed(reason) => Err(Failed::from(reason)),
                        _ => Ok(()),
                    }
                })
                .with_kind(caps.backend)
                .with_ignored_flag(unmet.is_some())
            })
            .collect()
    })
}

/// Trials of each fault in a backend's fault-suite test (one injection).
pub const FAULT_TRIALS: usize = 3;

/// How long one fault's trials may run (a Redis Cluster failover alone may take a minute).
pub const FAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs [`FAULT_TRIALS`] trials of `fault` on `target`, on servers first brought back
/// to health, and checks the cell against `expected` (for the five backends, their cell
/// of the table, [`expect`](crate::faults::expect::expect); for another,
/// [`never_unsafe`](crate::faults::expect::never_unsafe)): a verdict the protocol does
/// not allow (an UNSAFE where fencing should contain it; a SAFE where the table says the
/// violation must be observed) is the failure, with the cell's notes. An injection that
/// left no evidence in any trial (a server that took too long to stop) is made once
/// more, its trials added to the cell; a fault that fired in no trial then fails too.
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
    for _ in 0..2 {
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
    match expected.allows(&cell.verdicts()) {
        true => Ok(()),
        false => Err(format!(
            "{}, where the protocol allows only {:?} ({}): {notes:?}",
            cell.summary(),
            expected.verdicts,
            expected.reason
        )),
    }
}

/// The body of a backend's `tests/fault_suite.rs` (`harness = false`): starts the
/// backend's servers and the [`FaultTarget`] over them with `start`, with the verdicts
/// each fault may show (for the five backends, their row of the table:
/// `|fault| expect::expect(&config, fault)`; for any other,
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
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<(FaultTarget, E), Box<dyn Error + Send + Sync>>>,
    E: Fn(Fault) -> Expect,
{
    let names = Fault::ALL.iter().map(|f| f.name().to_owned()).collect();
    run_started(start, names, |(target, expected), handle| {
        let (target, turn) = (Arc::new(target), Arc::new(tokio::sync::Mutex::new(())));
        Fault::ALL
            .into_iter()
            .map(|fault| {
                let expected = expected(fault);
                let skip =
                    faults::applicability(fault, &target).is_some() || expected.verdicts.is_empty();
                let (target, turn, handle) = (target.clone(), turn.clone(), handle.clone());
                let backend = target.capabilities().backend;
                Trial::test(fault.name(), move || {
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
                .with_kind(backend)
                .with_ignored_flag(skip)
            })
            .collect()
    })
}

/// Starts what the tests need with `start` on a two-worker runtime, runs the tests
/// `trials` makes of it, drops it, and stops the runtime (so servers are stopped before
/// the caller exits the process). When `start` fails, each of `names` is a test that
/// fails with the reason when `CI=true`, and is ignored (the reason printed) otherwise.
fn run_started<S, F, Fut>(
    start: F,
    names: Vec<String>,
    trials: impl FnOnce(S, &tokio::runtime::Handle) -> Vec<Trial>,
) -> Conclusion
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<S, Box<dyn Error + Send + Sync>>>,
{
    let args = Arguments::from_args();
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
    let conclusion = match runtime.block_on(start()) {
        Ok(started) => libtest_mimic::run(&args, trials(started, runtime.handle())),
        Err(error) => {
            let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            eprintln!("the backend's servers could not be started: {error}");
            let message = error.to_string();
            let trials = names
                .into_iter()
                .map(|name| {
                    let message = message.clone();
                    Trial::test(name, move || {
                        Err(Failed::from(format!("harness did not start: {message}")))
                    })
                    .with_ignored_flag(!in_ci)
                })
                .collect();
            libtest_mimic::run(&args, trials)
        }
    };
    // Stop every server before the caller exits the process.
    runtime.shutdown_timeout(Duration::from_secs(5));
    conclusion
}
