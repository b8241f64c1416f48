//! The shared suite against a 3-member etcd cluster that serves clients over TLS only,
//! requires client certificates and has authentication on, as a user whose role grants
//! `readwrite` on the lock prefix and nothing else.

mod secured;

use std::time::Duration;

use tenure_conformance::{runner, UrlHarness};
use tenure_etcd::EtcdLock;

fn main() {
    runner::run_suite(|| async {
        let (cluster, secrets) = secured::start(3).await?;
        let targets = cluster.members().iter().map(|m| m.addr()).collect();
        let harness = UrlHarness::new("etcd", &secrets.url("{hosts}"), targets, |url| async move {
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
    .exit();
}
