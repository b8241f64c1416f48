//! The shared suite against a redis-server that requires TLS with client certificates and
//! a password, as an ACL user that may run only [`tenure_redis::ACL_COMMANDS`] on its own
//! prefix: the least privilege the README documents, tested with every scenario.

use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::RedisLock;

fn main() {
    runner::run_suite(|| async {
        let cluster =
            RedisCluster::start(RedisOptions::default().secured(tenure_redis::ACL_COMMANDS))
                .await?;
        let secrets = cluster.secrets().expect("a secured cluster").clone();
        let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
        let template = secrets.url("rediss", "{hosts}");
        Ok(
            UrlHarness::new("redis", &template, targets, |url| async move {
                RedisLock::connect(&url).await
            })
            .cut_query("request_timeout_ms=300")
            .owning(cluster),
        )
    })
    .exit();
}
