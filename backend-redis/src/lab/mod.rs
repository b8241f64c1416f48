//! How the lab starts Redis (feature `testbed`): independent servers on loopback (one for
//! this backend, five for Redlock's), under the clock shim if asked, plain or requiring
//! TLS with client certificates and an ACL user allowed [`ACL_COMMANDS`] on its prefix.

use std::future::Future;

use tenure_api::{DistributedLock, LockAdmin, LockError};
use tenure_conformance::faults::{Fault, WhyNot};
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::testbed::{
    harness_on, BenchVariant, BoxError, BoxFuture, Lab, Testbed, TestbedOptions,
};

use crate::{RedisLock, ACL_COMMANDS};

mod broken;
mod foreign;
pub use broken::warm_up;
pub use foreign::redis_py;
mod deployments;
mod servers;
pub use servers::{
    command, info_field, ping, sentinel, sharded, Persistence, RedisCluster, RedisNode,
    RedisOptions, RedisReplicaPair, RedisSecrets, Resp, RespConnection,
};

/// Redis's testbed: one server.
pub const TESTBED: Testbed = Testbed {
    name: "redis",
    servers: start_boxed,
    patient_query: "request_timeout_ms=5000",
    waiter_records: None,
    server_bounds: None,
    deployments: Some(deployments::deployments),
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    // No fence counter, against the same floors: like with like beside unfenced peers.
    bench_variants: &[BenchVariant {
        name: "fence=none",
        query: "fence=none",
        matrix_column: false,
    }],
    why_not: WHY_NOT,
    protocol: crate::verdicts::protocol,
    broken: broken::BROKEN,
    foreign: Some(foreign::recipe),
};

/// What does not apply to Redis, or cannot be injected without its deployments.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotApplicable(
        &[Fault::VanishedQueueRecord],
        crate::verdicts::NO_WAITER_RECORDS.reason,
    ),
    WhyNot::NotInjectable(
        &[
            Fault::ReplicaFailover,
            Fault::SentinelFailover,
            Fault::SentinelFailoverConfirmed,
            Fault::SentinelConfirmingReplicaLost,
            Fault::ClusterFailover,
            Fault::ClusterFailoverConfirmed,
        ],
        "the harness declares no Redis deployments of this backend",
    ),
];

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start_servers(
        TESTBED,
        1,
        Some("request_timeout_ms=300"),
        options,
        |url| async move { RedisLock::connect(&url).await },
    ))
}

/// Starts `count` independent Redis servers and a lab of `testbed` on them: its URLs
/// `NAME://` (`NAMEs://` when secured, NAME being the testbed's name), its clients made
/// by `connect`, with `cut_query` on the clients whose links a fault cuts.
///
/// # Cancel safety
/// Cancel-safe: the servers started so far are stopped when dropped.
pub async fn start_servers<F, Fut, L>(
    testbed: Testbed,
    count: usize,
    cut_query: Option<&str>,
    options: TestbedOptions,
    connect: F,
) -> Result<Lab, BoxError>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<L, LockError>> + Send + 'static,
    L: DistributedLock + LockAdmin + 'static,
{
    let servers = RedisOptions::default()
        .nodes(count)
        .clock_shim(options.clock_shim);
    let servers = match options.secured {
        true => servers.secured(ACL_COMMANDS),
        false => servers,
    };
    let name = testbed.name;
    let cluster = RedisCluster::start(servers).await?;
    let nodes = dyn_nodes(cluster.nodes());
    let template = match cluster.secrets() {
        Some(secrets) => secrets.url(&format!("{name}s"), "{hosts}"),
        None => format!("{name}://{{hosts}}"),
    };
    let mut harness = harness_on(name, &template, &nodes, connect.clone());
    if let Some(query) = cut_query {
        harness = harness.cut_query(query);
    }
    // The FIFO scenario asks a client of its own about a key's queue.
    let observer = connect(harness.url()).await?;
    let harness = harness.with_queue_admin(observer);
    Ok(Lab::new(testbed, harness.owning(cluster), nodes)
        .clock_shim(options.clock_shim)
        .secured(options.secured))
}
