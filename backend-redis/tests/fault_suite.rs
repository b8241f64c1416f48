//! The fault suite (`tenure_conformance::faults`, the matrix's) against a live
//! redis-server under the clock shim, and Redis deployments the suite starts (an
//! asynchronous replica, Sentinel, Cluster): every fault, checked against the table's row
//! for Redis (`?fence=clock`, the default).

use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::faults::expect::{self, Config};
use tenure_conformance::faults::FaultTarget;
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::{RedisConfig, RedisLock};

fn main() {
    runner::run_fault_suite(|| async {
        let cluster = RedisCluster::start(RedisOptions::default().clock_shim(true)).await?;
        let nodes = dyn_nodes(cluster.nodes());
        let targets = nodes.iter().map(|n| n.addr()).collect();
        let harness = UrlHarness::new("redis", "redis://{hosts}", targets, |url| async move {
            RedisLock::connect(&url).await
        })
        .cut_query("request_timeout_ms=300")
        .follow_nodes(&nodes)
        .owning(cluster);
        let url = harness.url();
        let redis = RedisConfig::from_url(&url)?;
        let target = FaultTarget::new("redis", harness, Duration::from_millis(500))
            .await?
            .with_nodes(nodes)
            .with_clock_shim()
            .with_patient_query("request_timeout_ms=5000")
            .with_redis_deployments(Arc::new(move |key| redis.lock_key(key)));
        let config = Config::of("redis", &url, 1)?;
        Ok((target, move |fault| expect::expect(&config, fault)))
    })
    .exit();
}
