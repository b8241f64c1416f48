//! The fault suite (`tenure_conformance::faults`, the matrix's) against five live masters
//! under the clock shim: every fault, checked against the table's row for Redlock (with
//! its quorum fence, the default).

use std::time::Duration;

use tenure_conformance::faults::expect::{self, Config};
use tenure_conformance::faults::FaultTarget;
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redlock::Redlock;

fn main() {
    runner::run_fault_suite(|| async {
        let options = RedisOptions::default().nodes(5).clock_shim(true);
        let cluster = RedisCluster::start(options).await?;
        let nodes = dyn_nodes(cluster.nodes());
        let targets = nodes.iter().map(|n| n.addr()).collect();
        let harness = UrlHarness::new("redlock", "redlock://{hosts}", targets, |url| async move {
            Redlock::connect(&url).await
        })
        .follow_nodes(&nodes)
        .owning(cluster);
        let url = harness.url();
        let target = FaultTarget::new("redlock", harness, Duration::from_millis(500))
            .await?
            .with_nodes(nodes)
            .with_clock_shim()
            .with_patient_query("node_timeout_ms=5000&request_timeout_ms=5000");
        let config = Config::of("redlock", &url, 5)?;
        Ok((target, move |fault| expect::expect(&config, fault)))
    })
    .exit();
}
