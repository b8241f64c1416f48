//! The shared suite's harness on a live 3-member etcd cluster started by the harness:
//! what the suite's groups on plain servers share.

use std::error::Error;
use std::time::Duration;

use tenure_conformance::{Harness, UrlHarness};
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::EtcdLock;

/// A fresh cluster and a harness on it, with `options` (e.g. `lease=per-lock`) on every
/// client.
pub(crate) async fn start(
    options: &'static str,
) -> Result<impl Harness, Box<dyn Error + Send + Sync>> {
    let cut_query = match options {
        "" => "request_timeout_ms=500".to_owned(),
        _ => format!("{options}&request_timeout_ms=500"),
    };
    let cluster = EtcdCluster::start(3).await?;
    let targets = cluster.members().iter().map(|m| m.addr()).collect();
    let template = "etcd://{hosts}/tenure-conformance";
    let harness = UrlHarness::new("etcd", template, targets, |url| async move {
        EtcdLock::connect(&url).await
    })
    .query(options)
    .cut_query(&cut_query)
    // etcd leases count whole seconds, with a minimum of about 1.5 election timeouts.
    .with_short_ttl(Duration::from_secs(2));
    let observer = EtcdLock::connect(&harness.url()).await?;
    Ok(harness.with_queue_admin(observer).owning(cluster))
}
