//! The etcd backend's shared suite and fault suite on live members the harness starts
//! (`harness = false`; see `tenure_conformance::runner::Suites`): one group of named
//! tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `session::`: The shared suite against a live 3-member etcd cluster, with session
//!   leases (the default).
//! - `per-lock::`: The shared suite against a live 3-member etcd cluster, with `lease=per-
//!   lock`.
//! - `secured::`: The shared suite against a 3-member etcd cluster that serves clients over
//!   TLS only, requires client certificates and has authentication on, as a user whose role
//!   grants `readwrite` on the lock prefix and nothing else.
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against a
//!   live 3-member etcd cluster, its server faults aimed at the leader: every fault,
//!   checked against the table's row for etcd.

mod harness;

use tenure_conformance::faults::expect;
use tenure_conformance::runner;
use tenure_conformance::testbed::TestbedOptions;

fn main() {
    runner::Suites::new()
        .suite("session", || harness::start(""))
        .suite("per-lock", || harness::start("lease=per-lock"))
        // The matrix's secured servers (`tenure matrix --tls` starts the same testbed).
        .suite("secured", || async {
            Ok(tenure_etcd::TESTBED
                .start(TestbedOptions::SECURED)
                .await?
                .harness)
        })
        .faults("faults", || async {
            let lab = tenure_etcd::TESTBED.start(TestbedOptions::FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
