//! How the lab starts Redlock (feature `testbed`): five independent Redis masters on
//! loopback (see `tenure_redis::lab`), under the clock shim if asked, plain or secured.

use tenure_conformance::faults::expect::NO_OTHER_RECIPE;
use tenure_conformance::faults::{Fault, WhyNot};
use tenure_conformance::testbed::{
    BenchVariant, BoxError, BoxFuture, Lab, Testbed, TestbedOptions,
};

use crate::Redlock;

mod broken;

/// Redlock's testbed: five masters.
pub const TESTBED: Testbed = Testbed {
    name: "redlock",
    servers: start_boxed,
    // Both bounds: each node's request timeout, and the round's per-node bound.
    patient_query: "node_timeout_ms=5000&request_timeout_ms=5000",
    waiter_records: None,
    server_bounds: None,
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    // No fence round, against the same floors: like with like beside unfenced peers.
    bench_variants: &[BenchVariant {
        name: "fencing=false",
        query: "fencing=false",
        matrix_column: false,
    }],
    why_not: WHY_NOT,
    protocol: crate::verdicts::protocol,
    broken: broken::BROKEN,
    foreign: None,
};

/// What does not apply to Redlock.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotApplicable(
        &[Fault::VanishedQueueRecord],
        tenure_redis::verdicts::NO_WAITER_RECORDS.reason,
    ),
    WhyNot::NotApplicable(&[Fault::MixedFleet], NO_OTHER_RECIPE.reason),
];

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(tenure_redis::lab::start_servers(
        TESTBED,
        5,
        None,
        options,
        |url| async move { Redlock::connect(&url).await },
    ))
}
