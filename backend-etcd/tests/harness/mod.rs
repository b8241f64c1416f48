//! The shared suite's harness on the testbed's live 3-member etcd cluster (the servers the
//! matrix and the fault suite run on): what the suite's groups on plain servers share.

use std::error::Error;

use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::UrlHarness;
use tenure_etcd::EtcdLock;

/// A fresh cluster and a harness on it, with `options` (e.g. `lease=per-lock`) on every
/// client.
pub(crate) async fn start(
    options: &'static str,
) -> Result<UrlHarness, Box<dyn Error + Send + Sync>> {
    let cut_query = match options {
        "" => "request_timeout_ms=500".to_owned(),
        _ => format!("{options}&request_timeout_ms=500"),
    };
    let lab = tenure_etcd::TESTBED
        .start(TestbedOptions::default())
        .await?;
    let harness = lab.harness.query(options).cut_query(&cut_query);
    // The FIFO scenario counts a key's queue through a client of its own, configured as
    // the suite's.
    let observer = EtcdLock::connect(&harness.url()).await?;
    Ok(harness.with_queue_admin(observer))
}
