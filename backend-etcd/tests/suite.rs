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
mod secured;

use std::time::Duration;
use tenure_conformance::faults::expect;
use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::{runner, UrlHarness};
use tenure_etcd::EtcdLock;

/// The fault suite's servers: those of the matrix (`tenure matrix` starts the same
/// testbed), under the clock shim where the backend's servers can run under it.
const FAULTS: TestbedOptions = TestbedOptions {
    clock_shim: true,
    secured: false,
};

fn main() {
    runner::Suites::new()
        .suite("session", || harness::start(""))
        .suite("per-lock", || harness::start("lease=per-lock"))
        .suite("secured", || async {
            let (cluster, secrets) = secured::start(3).await?;
            let targets = cluster.members().iter().map(|m| m.addr()).collect();
            let harness =
                UrlHarness::new("etcd", &secrets.url("{hosts}"), targets, |url| async move {
                    EtcdLock::connect(&url).await
                })
                .cut_query("request_timeout_ms=500")
                // etcd leases count whole seconds, with a minimum of about 1.5 election
                // timeouts.
                .with_short_ttl(Duration::from_secs(2));
            // Counted, so the FIFO scenario starts each waiter once the one before is queued.
            let observer = EtcdLock::connect(&harness.url()).await?;
            Ok(harness.with_queue_admin(observer).owning(cluster))
        })
        .faults("faults", || async {
            let lab = tenure_etcd::TESTBED.start(FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
