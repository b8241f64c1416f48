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

use std::sync::Arc;
use std::time::Duration;
use tenure_conformance::faults::expect::{self, Config};
use tenure_conformance::faults::{leader_of, FaultTarget, PeerLinks};
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::servers::zk::{ZkEnsemble, ZkOptions};
use tenure_conformance::{runner, UrlHarness};
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
            let options = ZkOptions::default()
                .nodes(3)
                .tick_time_ms(200)
                .peer_proxies(true);
            let ensemble = Arc::new(ZkEnsemble::start(options).await?);
            let leader = leader_of(&ensemble, |e| {
                Box::pin(async { e.leader_index().await.ok() })
            });
            let links: Arc<dyn PeerLinks> = ensemble.clone();
            let nodes = dyn_nodes(ensemble.nodes());
            let targets = nodes.iter().map(|n| n.addr()).collect();
            let harness = UrlHarness::new(
                "zk",
                "zk://{hosts}?tick_ms=200",
                targets,
                |url| async move { ZkLock::connect(&url).await },
            )
            .query("session_timeout_ms=4000")
            .cut_query("session_timeout_ms=1000&request_timeout_ms=300")
            .follow_nodes(&nodes)
            .owning(ensemble);
            let url = harness.url();
            // A lock outlives its silent holder by the session timeout the server negotiates,
            // for the direct and the cuttable clients alike: the longer is the trials' TTL.
            let mut ttl = Duration::ZERO;
            for url in [url.clone(), harness.url_with(harness.cut_options())] {
                let session = ZkLock::connect(&url).await?.session_timeout();
                ttl = ttl.max(session.ok_or("the ZooKeeper session closed at once")?);
            }
            let target = FaultTarget::new("zk", harness, ttl)
                .await?
                .with_nodes(nodes)
                .with_leader(leader)
                .with_peer_links(links)
                .with_patient_query("session_timeout_ms=4000&request_timeout_ms=5000")
                .with_waiter_records(Arc::new(ZkLock::connect(&url).await?));
            let config = Config::of("zk", &url, 3)?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
