//! Runs the suite as a `cargo test` target (`harness = false`) with `libtest-mimic`: one
//! named test per scenario, so the output reads as the backend's row of the matrix.

use std::error::Error;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Conclusion, Failed, Trial};
use tenure_api::Capabilities;

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
    let started = runtime.block_on(async {
        let harness = start().await?;
        let caps = harness.client().await?.capabilities();
        Ok::<_, Box<dyn Error + Send + Sync>>((Arc::new(harness), caps))
    });
    let conclusion = match started {
        Ok((harness, caps)) => {
            let trials = scenarios()
                .into_iter()
                .map(|scenario| {
                    let unmet = scenario.unmet(&caps, harness.as_ref());
                    let (harness, handle) = (harness.clone(), runtime.handle().clone());
                    Trial::test(scenario.name, move || {
                        match handle.block_on(run_scenario(&scenario, harness.as_ref(), &caps)) {
                            ScenarioResult::Failed(reason) => Err(Failed::from(reason)),
                            _ => Ok(()),
                        }
                    })
                    .with_kind(caps.backend)
                    .with_ignored_flag(unmet.is_some())
                })
                .collect();
            let conclusion = libtest_mimic::run(&args, trials);
            drop(harness);
            conclusion
        }
        Err(error) => {
            let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            eprintln!("the backend's servers could not be started: {error}");
            let message = error.to_string();
            let trials = scenarios()
                .into_iter()
                .map(|scenario| {
                    let message = message.clone();
                    Trial::test(scenario.name, move || {
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
