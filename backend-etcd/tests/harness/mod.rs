//! The shared suite against a live 3-member etcd cluster started by the harness: what
//! `tests/conformance*.rs` share.

use std::time::Duration;

use etcd_client::GetOptions;
use tenure_api::{LockError, LockKey};
use tenure_conformance::servers::etcd::EtcdCluster;
use tenure_conformance::{runner, UrlHarness};
use tenure_etcd::EtcdLock;

/// Runs the suite with `options` (e.g. `lease=per-lock`) on every client.
pub(crate) fn run_suite(options: &'static str) {
    let cut_query = match options {
        "" => "request_timeout_ms=500".to_owned(),
        _ => format!("{options}&request_timeout_ms=500"),
    };
    runner::run_suite(move || {
        let cut_query = cut_query.clone();
        async move {
            let cluster = EtcdCluster::start(3).await?;
            let targets: Vec<_> = cluster.members().iter().map(|m| m.addr()).collect();
            let endpoints: Vec<String> = targets.iter().map(|a| format!("http://{a}")).collect();
            let template = "etcd://{hosts}/tenure-conformance";
            let harness = UrlHarness::new("etcd", template, targets, |url| async move {
                EtcdLock::connect(&url).await
            })
            .query(options)
            .cut_query(&cut_query)
            // etcd leases count whole seconds, with a minimum of about 1.5 election
            // timeouts.
            .with_short_ttl(Duration::from_secs(2));
            // A key's queue is the keys under its prefix, holder and waiters alike.
            let names = EtcdLock::connect(&harness.url()).await?;
            let raw = etcd_client::Client::connect(endpoints, None).await?;
            let count = move |key: LockKey| {
                let (prefix, mut raw) = (names.queue_prefix(&key), raw.clone());
                async move {
                    let only_count = GetOptions::new().with_prefix().with_count_only();
                    let reply = raw.get(prefix, Some(only_count)).await;
                    let reply = reply.map_err(|e| LockError::backend(e.to_string()))?;
                    Ok(reply.count() as usize)
                }
            };
            Ok(harness.with_queue_probe(count).owning(cluster))
        }
    })
    .exit();
}
