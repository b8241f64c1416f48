//! The shared suite against a standalone ZooKeeper whose client port requires TLS with
//! client certificates, as `digest` user `tenure`: every node tenure creates carries the
//! `auth` ACL (that identity only).

use tenure_conformance::servers::zk::{ZkEnsemble, ZkOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_zk::ZkLock;

fn main() {
    runner::run_suite(|| async {
        let ensemble = ZkEnsemble::start(ZkOptions::default().secured()).await?;
        let secrets = ensemble.secrets().ok_or("a secured ensemble")?.clone();
        let targets = ensemble.nodes().iter().map(|n| n.addr()).collect();
        let harness = UrlHarness::new("zk", &secrets.url("{hosts}"), targets, |url| async move {
            ZkLock::connect(&url).await
        })
        .query("session_timeout_ms=10000")
        // The shortest session the server allows (2 × tickTime): a cut is noticed fast.
        .cut_query("session_timeout_ms=4000&request_timeout_ms=500");
        // Counted, so the FIFO scenario starts each waiter once the one before is queued.
        let observer = ZkLock::connect(&harness.url()).await?;
        Ok(harness.with_queue_admin(observer).owning(ensemble))
    })
    .exit();
}
