//! The Redlock backend's shared suite and fault suite on live Redis nodes the harness
//! starts (`harness = false`; see `tenure_conformance::runner::Suites`): one group of
//! named tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `fenced::`: The shared suite against Redlock on five live redis-servers.
//! - `unfenced::`: The shared suite against Redlock with `fencing=false` (no fence counter,
//!   one round trip per acquire) on five live redis-servers.
//! - `secured::`: The shared suite against Redlock on three redis-servers that each require
//!   TLS with client certificates and a password, as an ACL user limited to
//!   [`tenure_redis::ACL_COMMANDS`] on its own prefix: Redlock's nodes read the same
//!   `ca_file`, `cert_file` and `key_file` as single Redis.
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against five
//!   live masters under the clock shim: every fault, checked against the table's row for
//!   Redlock (with its quorum fence, the default).

use tenure_conformance::faults::expect;
use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::{runner, UrlHarness};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redlock::Redlock;

/// The fault suite's servers: those of the matrix (`tenure matrix` starts the same
/// testbed), under the clock shim where the backend's servers can run under it.
const FAULTS: TestbedOptions = TestbedOptions {
    clock_shim: true,
    secured: false,
};

fn main() {
    runner::Suites::new()
        .suite("fenced", || async {
            let cluster = RedisCluster::start(RedisOptions::default().nodes(5)).await?;
            let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
            Ok(
                UrlHarness::new("redlock", "redlock://{hosts}", targets, |url| async move {
                    Redlock::connect(&url).await
                })
                .owning(cluster),
            )
        })
        .suite("unfenced", || async {
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
        .suite("secured", || async {
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
        .faults("faults", || async {
            let lab = tenure_redlock::TESTBED.start(FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
