//! The shared suite on a Redis Cluster (three primaries, each with a replica) started by
//! the harness, reached as `redis+cluster://h1,…,h6`.

use std::time::Duration;

use tenure_conformance::servers::redis::sharded::RedisShardedCluster;
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::RedisLock;

fn main() {
    runner::run_suite(|| async {
        // Slow to fail a primary over: no failover here unless a test causes one.
        let cluster = RedisShardedCluster::start(Duration::from_secs(15)).await?;
        let seeds = cluster.nodes().iter().map(|n| n.addr()).collect();
        Ok(UrlHarness::new(
            "redis-cluster",
            "redis+cluster://{hosts}",
            seeds,
            |url| async move { RedisLock::connect(&url).await },
        )
        // The client learns every node's address from the cluster itself, around
        // any proxy in the URL.
        .without_link_cuts()
        .owning(cluster))
    })
    .exit();
}
