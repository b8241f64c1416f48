//! The Redis backend's shared suite (single node, Sentinel, Cluster, secured) and fault
//! suite on live servers the harness starts (`harness = false`; see
//! `tenure_conformance::runner::Suites`): one group of named tests per setup, each group's
//! servers started only if one of its tests is selected.
//!
//! - `single::`: The shared suite against a live redis-server started by the harness.
//! - `unfenced::`: The shared suite against a live redis-server with `fence=none` (no fence
//!   counter: `SET NX PX`; tokens are not fences, and the capabilities say so).
//! - `secured::`: The shared suite against a redis-server that requires TLS with client
//!   certificates and a password, as an ACL user that may run only
//!   [`tenure_redis::ACL_COMMANDS`] on its own prefix: the least privilege the README
//!   documents, tested with every scenario.
//! - `sentinel::`: The shared suite through Redis Sentinel: a primary with two replicas and
//!   three sentinels started by the harness, reached as `redis+sentinel://s1,s2,s3/tenure`.
//! - `cluster::`: The shared suite on a Redis Cluster (three primaries, each with a
//!   replica) started by the harness, reached as `redis+cluster://h1,…,h6`.
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against a
//!   live redis-server under the clock shim, and Redis deployments the suite starts (an
//!   asynchronous replica, Sentinel, Cluster): every fault, checked against the table's row
//!   for Redis (`?fence=clock`, the default).
//! - `faults_unfenced::`: The same fault suite with `fence=none`, checked against Redis's
//!   row for it: the faults a fence contains are violations nothing is sure to contain.

use std::time::Duration;
use tenure_conformance::faults::expect;
use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::lab::sentinel::{RedisSentinels, MASTER_NAME};
use tenure_redis::lab::sharded::RedisShardedCluster;
use tenure_redis::RedisLock;

fn main() {
    runner::Suites::new()
        .suite("single", || async {
            Ok(tenure_redis::TESTBED
                .start(TestbedOptions::PLAIN)
                .await?
                .harness)
        })
        .suite("unfenced", || async {
            let lab = tenure_redis::TESTBED.start(TestbedOptions::PLAIN).await?;
            Ok(lab.harness.query("fence=none"))
        })
        .suite("secured", || async {
            Ok(tenure_redis::TESTBED
                .start(TestbedOptions::SECURED)
                .await?
                .harness)
        })
        .suite("sentinel", || async {
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
        .suite("cluster", || async {
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
        .faults("faults", || async {
            let lab = tenure_redis::TESTBED.start(TestbedOptions::FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .faults("faults_unfenced", || async {
            let mut lab = tenure_redis::TESTBED.start(TestbedOptions::FAULTS).await?;
            lab.harness = lab.harness.query("fence=none");
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
