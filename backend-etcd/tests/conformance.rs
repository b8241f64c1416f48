//! The shared suite against a live 3-member etcd cluster started by the harness.

use std::time::Duration;

use tenure_conformance::servers::etcd::EtcdCluster;
use tenure_conformance::{runner, UrlHarness};
use tenure_etcd::EtcdLock;

fn main() {
    runner::run_suite(|| async {
        let cluster = EtcdCluster::start(3).await?;
        let targets = cluster.members().iter().map(|m| m.addr()).collect();
        let template = "etcd://{hosts}/tenure-conformance";
        Ok(
            UrlHarness::new("etcd", template, targets, |url| async move {
                EtcdLock::connect(&url).await
            })
            .cut_query("request_timeout_ms=500")
            // etcd leases count whole seconds, with a minimum of about 1.5 election
            // timeouts.
            .with_short_ttl(Duration::from_secs(2))
            .owning(cluster),
        )
    })
    .exit();
}
