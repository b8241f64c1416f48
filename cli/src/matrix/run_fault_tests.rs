//! A backend's fault-suite test ([`runner::run_fault`]) fails where the matrix shows ⚠.

use tenure_conformance::faults::expect::expect;
use tenure_conformance::faults::Fault;
use tenure_conformance::runner;

use super::{target, Source};

/// A token from a counter local to each client breaks the order fencing needs: the
/// blackhole's cell falls outside Redis's row, and the test says so; the real backend
/// passes the same test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_on_a_verdict_outside_the_table_and_passes_the_real_backend() {
    let local = Source::Local { secured: false };
    let broken = target("broken:local-counter-token", &local, 21)
        .await
        .unwrap();
    let error = runner::run_fault(
        Fault::Blackhole,
        &broken,
        &expect(&broken.config, Fault::Blackhole),
    )
    .await
    .expect_err("a local token counter is not fenced");
    assert!(error.contains("where the protocol allows only"), "{error}");
    drop(broken);
    let real = target("redis", &local, 22).await.unwrap();
    runner::run_fault(
        Fault::Blackhole,
        &real,
        &expect(&real.config, Fault::Blackhole),
    )
    .await
    .unwrap();
}
