//! The shared suite against Redlock with `fencing=false` (no fence counter, one round
//! trip per acquire) on five live redis-servers.

use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redlock::Redlock;

fn main() {
    runner::run_suite(|| async {
        let cluster = RedisCluster::start(RedisOptions::default().nodes(5)).await?;
        let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
        let template = "redlock://{hosts}?fencing=false";
        Ok(
            UrlHarness::new("redlock", template, targets, |url| async move {
                Redlock::connect(&url).await
            })
            .owning(cluster),
        )
    })
    .exit();
}
