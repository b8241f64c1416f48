//! The shared suite against a live standalone ZooKeeper started by the harness.
//!
//! The TTL-expiry scenarios require `Requirement::TtlExpiry`, which a session-heartbeat
//! backend does not meet: a ZooKeeper lock lasts as long as its holder's session, so they
//! are reported ignored. Session expiry is exercised in `tests/faults.rs` instead.

use tenure_conformance::servers::zk::{ZkEnsemble, ZkOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_zk::ZkLock;

fn main() {
    runner::run_suite(|| async {
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
    .exit();
}
