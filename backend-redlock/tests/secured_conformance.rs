//! The shared suite against Redlock on three redis-servers that each require TLS with
//! client certificates and a password, as an ACL user limited to
//! [`tenure_redis::ACL_COMMANDS`] on its own prefix: Redlock's nodes read the same
//! `ca_file`, `cert_file` and `key_file` as single Redis.

use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::{runner, UrlHarness};
use tenure_redlock::Redlock;

fn main() {
    runner::run_suite(|| async {
        let options = RedisOptions::default()
            .nodes(3)
            .secured(tenure_redis::ACL_COMMANDS);
        let cluster = RedisCluster::start(options).await?;
        let secrets = cluster.secrets().expect("a secured cluster").clone();
        let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
        let template = secrets.url("redlocks", "{hosts}");
        Ok(
            UrlHarness::new("redlock", &template, targets, |url| async move {
                Redlock::connect(&url).await
            })
            .owning(cluster),
        )
    })
    .exit();
}
