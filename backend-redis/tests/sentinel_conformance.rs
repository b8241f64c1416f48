//! The shared suite through Redis Sentinel: a primary with two replicas and three
//! sentinels started by the harness, reached as `redis+sentinel://s1,s2,s3/tenure`.

use std::time::Duration;

use tenure_conformance::servers::redis::sentinel::{RedisSentinels, MASTER_NAME};
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::RedisLock;

fn main() {
    runner::run_suite(|| async {
        // Slow to declare the primary down: no failover here unless a test causes one.
        let group = RedisSentinels::start(Duration::from_secs(15)).await?;
        let sentinels = group.sentinel_addrs();
        let template = format!("redis+sentinel://{{hosts}}/{MASTER_NAME}");
        Ok(
            UrlHarness::new("redis-sentinel", &template, sentinels, |url| async move {
                RedisLock::connect(&url).await
            })
            .without_link_cuts()
            .owning(group),
        )
    })
    .exit();
}
