//! How the lab starts etcd (feature `testbed`): three members on loopback, plain or
//! serving clients over TLS only with client certificates and authentication on, as user
//! `tenure` whose role grants `readwrite` on its key prefix and nothing else.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;
use tenure_conformance::faults::{leader_of, Fault, WaiterRecords, WhyNot};
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::testbed::{
    harness_on, BoxError, BoxFuture, Lab, ServerBounds, Testbed, TestbedOptions,
};

use tenure_conformance::UrlHarness;

use crate::{EtcdConfig, EtcdLock};

mod broken;
mod foreign;
mod servers;
pub use foreign::etcdctl_lock;
pub use servers::{EtcdCluster, EtcdMember, EtcdSecrets, EtcdUser};

/// etcd's testbed: a 3-member cluster, its server faults aimed at the leader.
pub const TESTBED: Testbed = Testbed {
    name: "etcd",
    servers: start_boxed,
    patient_query: "request_timeout_ms=10000",
    waiter_records: Some(waiter_records),
    server_bounds: Some(server_bounds),
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    bench_variants: &[],
    why_not: WHY_NOT,
    protocol: tenure_conformance::faults::expect::fixed::<crate::verdicts::EtcdProtocol>,
    broken: broken::BROKEN,
    foreign: Some(foreign::recipe),
};

/// What the fault suite cannot do to etcd here.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotInjectable(
        &[Fault::ClockJump],
        "the clock shim cannot shift Go or JVM clocks",
    ),
    WhyNot::NotInjectable(
        &[Fault::StaleAcquire, Fault::StaleExtend, Fault::StaleRelease],
        "the etcd client sends every request over one HTTP/2 connection per endpoint and \
         keeps it: a stalled connection holds up its later requests (the lease's \
         keep-alive too), so it never moves on before the stalled ones land",
    ),
    WhyNot::NotInjectable(
        &[Fault::MinorityPartition],
        "the harness has no control over the links between etcd members (its members \
         reach each other directly)",
    ),
];

fn waiter_records(url: String) -> BoxFuture<'static, Result<Arc<dyn WaiterRecords>, LockError>> {
    Box::pin(async move {
        let records: Arc<dyn WaiterRecords> = Arc::new(EtcdLock::connect(&url).await?);
        Ok(records)
    })
}

/// The lease etcd grants for a short request (whole seconds, at least about 1.5 election
/// timeouts), and the cluster's voting members.
fn server_bounds(
    harness: &UrlHarness,
    short: Duration,
) -> BoxFuture<'_, Result<ServerBounds, LockError>> {
    Box::pin(async move {
        let lock = EtcdLock::connect(&harness.url()).await?;
        Ok(ServerBounds {
            ttl: lock.granted_ttl(short).await?,
            why: "the lease TTL etcd grants for a short request",
            members: Some(lock.members()),
        })
    })
}

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start(options))
}

/// Starts `members` members that serve clients over TLS only and require client
/// certificates, then creates user `tenure`, whose role grants `readwrite` on
/// [`EtcdConfig::key_prefix`] and nothing else (the least privilege the README documents),
/// and the users `others` makes of the cluster's secrets, and enables authentication.
///
/// # Cancel safety
/// Cancel-safe: the members started so far are stopped when dropped.
pub async fn start_secured(
    members: usize,
    others: for<'a> fn(&'a EtcdSecrets) -> Vec<EtcdUser<'a>>,
) -> Result<(EtcdCluster, EtcdSecrets), BoxError> {
    let cluster = EtcdCluster::start_secured(members).await?;
    let secrets = cluster.secrets().ok_or("a secured cluster")?.clone();
    let hosts: Vec<String> = cluster
        .members()
        .iter()
        .map(|m| m.addr().to_string())
        .collect();
    let prefix = EtcdConfig::from_url(&secrets.url(&hosts.join(",")))?.key_prefix();
    let tenure = EtcdUser {
        name: "tenure",
        password: &secrets.password,
        prefix: &prefix,
    };
    let users: Vec<EtcdUser<'_>> = std::iter::once(tenure).chain(others(&secrets)).collect();
    cluster.enable_auth(&users).await?;
    Ok((cluster, secrets))
}

async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let (cluster, template) = if options.secured {
        let (cluster, secrets) = start_secured(3, |_| Vec::new()).await?;
        (cluster, secrets.url("{hosts}"))
    } else {
        let template = "etcd://{hosts}/tenure".to_owned();
        (EtcdCluster::start(3).await?, template)
    };
    let cluster = Arc::new(cluster);
    let leader = leader_of(&cluster, |c| {
        Box::pin(async move { c.leader_index().await.ok() })
    });
    let nodes = dyn_nodes(cluster.members());
    let harness = harness_on("etcd", &template, &nodes, |url| async move {
        EtcdLock::connect(&url).await
    })
    .cut_query("request_timeout_ms=500")
    // Leases count whole seconds, at least about 1.5 election timeouts.
    .with_short_ttl(Duration::from_secs(2));
    // The FIFO scenario counts a key's queue through a client of its own.
    let observer = EtcdLock::connect(&harness.url()).await?;
    let harness = harness.with_queue_admin(observer).owning(cluster);
    Ok(Lab::new(TESTBED, harness, nodes)
        .secured(options.secured)
        .with_leader(leader))
}
