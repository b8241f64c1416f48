//! The shared suite against a live redis-server started by the harness.

use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::RedisLock;

fn main() {
    runner::run_suite(|| async {
        let cluster = RedisCluster::start(RedisOptions::default()).await?;
        let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
        Ok(
            UrlHarness::new("redis", "redis://{hosts}", targets, |url| async move {
                RedisLock::connect(&url).await
            })
            .cut_query("command_timeout_ms=300")
            .owning(cluster),
        )
    })
    .exit();
}
