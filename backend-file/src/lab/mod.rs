//! How the lab runs the file backend (feature `testbed`): a fresh lock directory, no
//! server. The fault suite's client faults need a network and its server faults a server
//! (not applicable: see `verdicts`); the paused and suspended holders run.

use std::sync::Arc;

use tenure_conformance::faults::expect::{
    fixed, NOT_A_REDIS_DEPLOYMENT, NO_MINORITY, NO_OTHER_RECIPE,
};
use tenure_conformance::faults::{Fault, WhyNot};
use tenure_conformance::testbed::{BoxError, BoxFuture, Lab, Testbed, TestbedOptions};
use tenure_conformance::UrlHarness;

use crate::verdicts::{
    FileProtocol, NO_MINORITY_SIDE, NO_NETWORK, NO_REPLICA, NO_SERVER, NO_SERVER_CLOCK,
    NO_WAITER_RECORD,
};
use crate::{FileConfig, FileLock};

/// The file backend's testbed: a fresh directory, removed when the lab is dropped.
pub const TESTBED: Testbed = Testbed {
    name: "file",
    servers: start_boxed,
    patient_query: "",
    waiter_records: None,
    server_bounds: None,
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    bench_variants: &[],
    why_not: WHY_NOT,
    protocol: fixed::<FileProtocol>,
    broken: &[],
    foreign: None,
};

/// What does not apply to a file lock, for every setup (its row says the same).
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotApplicable(
        &[
            Fault::DelayedReply,
            Fault::Blackhole,
            Fault::ConnectionCut,
            Fault::LostReply,
            Fault::StaleAcquire,
            Fault::StaleExtend,
            Fault::StaleRelease,
        ],
        NO_NETWORK.reason,
    ),
    WhyNot::NotApplicable(&[Fault::ClockJump], NO_SERVER_CLOCK.reason),
    WhyNot::NotApplicable(&[Fault::Restart, Fault::ServerPause], NO_SERVER.reason),
    WhyNot::NotApplicable(&[Fault::MinorityLoss], NO_MINORITY.reason),
    WhyNot::NotApplicable(&[Fault::MinorityPartition], NO_MINORITY_SIDE.reason),
    WhyNot::NotApplicable(&[Fault::ReplicaFailover], NO_REPLICA.reason),
    WhyNot::NotApplicable(
        &[
            Fault::SentinelFailover,
            Fault::SentinelFailoverConfirmed,
            Fault::SentinelConfirmingReplicaLost,
            Fault::ClusterFailover,
            Fault::ClusterFailoverConfirmed,
        ],
        NOT_A_REDIS_DEPLOYMENT.reason,
    ),
    WhyNot::NotApplicable(&[Fault::VanishedQueueRecord], NO_WAITER_RECORD.reason),
    WhyNot::NotApplicable(&[Fault::MixedFleet], NO_OTHER_RECIPE.reason),
];

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start(options))
}

/// A fresh lock directory and a harness on it (TLS and the clock shim do not apply:
/// there is no server).
async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let dir = tempfile::Builder::new().prefix("tenure-file-").tempdir()?;
    let url = FileConfig::in_dir(dir.path())?.url();
    let harness = UrlHarness::new("file", &url, Vec::new(), |url| async move {
        FileLock::connect(&url).await
    })
    .without_link_cuts()
    .owning(Arc::new(dir));
    // TLS and passwords do not apply: nothing is sent over a network.
    let _ = options;
    Ok(Lab::new(TESTBED, harness, Vec::new()))
}
