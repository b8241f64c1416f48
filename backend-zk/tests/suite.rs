//! The ZooKeeper backend's shared suite and fault suite on live ensembles the harness starts
//! (`harness = false`; see `tenure_conformance::runner::Suites`): one group of named
//! tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `standalone::`: The shared suite against a live standalone ZooKeeper started by the
//!   harness.
//! - `secured::`: The shared suite against a standalone ZooKeeper whose client port
//!   requires TLS with client certificates, as `digest` user `tenure`: every node tenure
//!   creates carries the `auth` ACL (that identity only).
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against a
//!   live 3-node ensemble (`tickTime` 200 ms) whose member links pass through proxies the
//!   suite can cut: every fault, checked against the table's row for ZooKeeper.

use tenure_conformance::faults::expect;
use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::{runner, UrlHarness};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};
use tenure_zk::ZkLock;

fn main() {
    runner::Suites::new()
        .suite("standalone", || async {
            let ensemble = ZkEnsemble::start(ZkOptions::default()).await?;
            let targets = ensemble.nodes().iter().map(|n| n.addr()).collect();
            let harness = UrlHarness::new("zk", "zk://{hosts}", targets, |url| async move {
                ZkLock::connect(&url).await
            })
            .query("session_timeout_ms=10000")
            // The shortest session the server allows (2 × tickTime): a cut is noticed fast.
            .cut_query("session_timeout_ms=4000&op_timeout_ms=500");
            // A key's queue is its lock directory's children, holder and waiters alike.
            let observer = ZkLock::connect(&harness.url()).await?;
            Ok(harness.with_queue_admin(observer).owning(ensemble))
        })
        .suite("secured", || async {
            let ensemble = ZkEnsemble::start(ZkOptions::default().secured()).await?;
            let secrets = ensemble.secrets().ok_or("a secured ensemble")?.clone();
            let targets = ensemble.nodes().iter().map(|n| n.addr()).collect();
            let harness =
                UrlHarness::new("zk", &secrets.url("{hosts}"), targets, |url| async move {
                    ZkLock::connect(&url).await
                })
                .query("session_timeout_ms=10000")
                // The shortest session the server allows (2 × tickTime): a cut is noticed fast.
                .cut_query("session_timeout_ms=4000&request_timeout_ms=500");
            // Counted, so the FIFO scenario starts each waiter once the one before is queued.
            let observer = ZkLock::connect(&harness.url()).await?;
            Ok(harness.with_queue_admin(observer).owning(ensemble))
        })
        .faults("faults", || async {
            let lab = tenure_zk::TESTBED.start(TestbedOptions::FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
