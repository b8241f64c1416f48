//! How the lab starts ZooKeeper (feature `testbed`): a 3-server ensemble on loopback
//! whose member links pass through proxies the faults can cut, plain or requiring TLS
//! with client certificates and a digest ACL on its chroot.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;
use tenure_conformance::faults::{leader_of, Fault, PeerLinks, WaiterRecords, WhyNot};
use tenure_conformance::servers::dyn_nodes;
use tenure_conformance::testbed::{
    harness_on, BoxError, BoxFuture, Lab, ServerBounds, Testbed, TestbedOptions,
};

use tenure_conformance::UrlHarness;

use crate::ZkLock;

mod broken;
mod foreign;
mod peer;
mod servers;
pub use foreign::curator;
pub use servers::{ZkEnsemble, ZkNode, ZkOptions, ZkSecrets, CLASSPATH_ENV};

/// ZooKeeper's quorum and election links, through the ensemble's peer proxies.
impl PeerLinks for ZkEnsemble {
    fn isolate(&self, index: usize) -> Result<(), String> {
        ZkEnsemble::isolate(self, index).map_err(|e| e.to_string())
    }

    fn heal(&self) {
        ZkEnsemble::heal(self);
    }

    fn dropped(&self, index: usize) -> u64 {
        self.peer_link_stats(index)
            .map_or(0, |s| s.bytes_blackholed)
    }
}

/// The ensemble's tick: sessions may then be 0.4–4 s, so expiry scenarios run in seconds.
const TICK_MS: u32 = 200;

/// ZooKeeper's testbed: a 3-server ensemble, its server faults aimed at the leader.
pub const TESTBED: Testbed = Testbed {
    name: "zk",
    servers: start_boxed,
    patient_query: "session_timeout_ms=4000&request_timeout_ms=5000",
    waiter_records: Some(waiter_records),
    server_bounds: Some(server_bounds),
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: Some(("recipe", peer::connect)),
    bench_variants: &[],
    why_not: WHY_NOT,
    protocol: tenure_conformance::faults::expect::fixed::<crate::verdicts::ZkProtocol>,
    broken: broken::BROKEN,
    foreign: Some(foreign::recipe),
};

/// What the fault suite cannot do to ZooKeeper here.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotInjectable(
        &[Fault::ClockJump],
        "the clock shim cannot shift Go or JVM clocks",
    ),
    WhyNot::NotInjectable(
        &[Fault::StaleAcquire, Fault::StaleExtend, Fault::StaleRelease],
        "a ZooKeeper session has one connection: the client moves on only by \
         reconnecting the session, and the server closes the stalled connection with it",
    ),
];

fn waiter_records(url: String) -> BoxFuture<'static, Result<Arc<dyn WaiterRecords>, LockError>> {
    Box::pin(async move {
        let records: Arc<dyn WaiterRecords> = Arc::new(ZkLock::connect(&url).await?);
        Ok(records)
    })
}

/// A lock outlives its silent holder by the holder's session timeout, which the server
/// negotiates (2–20 × its tickTime): the direct and the cuttable clients' sessions both
/// hold locks in the trials, so the longer of the two.
fn server_bounds(
    harness: &UrlHarness,
    _short: Duration,
) -> BoxFuture<'_, Result<ServerBounds, LockError>> {
    Box::pin(async move {
        let mut longest = Duration::ZERO;
        for url in [harness.url(), harness.url_with(harness.cut_options())] {
            let timeout = ZkLock::connect(&url).await?.session_timeout();
            let timeout = timeout.ok_or_else(|| LockError::Unavailable {
                message: "the ZooKeeper session closed at once".into(),
                source: None,
            })?;
            longest = longest.max(timeout);
        }
        Ok(ServerBounds {
            ttl: longest,
            why: "the negotiated ZooKeeper session timeout",
            members: None,
        })
    })
}

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start(options))
}

/// How long a fresh server may take to give its first session.
const FIRST_SESSION: Duration = Duration::from_secs(60);

/// Waits (up to [`FIRST_SESSION`]) until a client of `template` (`{hosts}`: one server's
/// address) gets a session from each server: a freshly started JVM's first TLS
/// handshakes can outlast a client's connect timeout on a busy machine (seen: the
/// matrix's TLS run beside three other test executables, "connect … timeout"), and the
/// servers answer their plain readiness probe before that.
async fn sessions_on_each(ensemble: &ZkEnsemble, template: &str) -> Result<(), BoxError> {
    let by = std::time::Instant::now() + FIRST_SESSION;
    for node in ensemble.nodes() {
        let url = template.replace("{hosts}", &node.addr().to_string());
        loop {
            match ZkLock::connect(&url).await {
                Ok(_) => break,
                Err(LockError::Unavailable { .. }) if std::time::Instant::now() < by => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => return Err(format!("no session from {}: {e}", node.addr()).into()),
            }
        }
    }
    Ok(())
}

async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let zk_options = ZkOptions::default()
        .nodes(3)
        .tick_time_ms(TICK_MS)
        .peer_proxies(options.cuttable_links);
    let zk_options = match options.secured {
        true => zk_options.secured(),
        false => zk_options,
    };
    let ensemble = Arc::new(ZkEnsemble::start(zk_options).await?);
    let leader = leader_of(&ensemble, |e| {
        Box::pin(async move { e.leader_index().await.ok() })
    });
    let links: Arc<dyn PeerLinks> = ensemble.clone();
    let nodes = dyn_nodes(ensemble.nodes());
    let template = match ensemble.secrets() {
        Some(secrets) => format!("{}&tick_ms={TICK_MS}", secrets.url("{hosts}")),
        None => format!("zk://{{hosts}}?tick_ms={TICK_MS}"),
    };
    let harness = harness_on("zk", &template, &nodes, |url| async move {
        ZkLock::connect(&url).await
    })
    .query("session_timeout_ms=4000")
    .cut_query("session_timeout_ms=1000&request_timeout_ms=300");
    sessions_on_each(&ensemble, &template).await?;
    // A key's queue is its lock directory's children, holder and waiters alike.
    let observer = ZkLock::connect(&harness.url()).await?;
    let harness = harness.with_queue_admin(observer).owning(ensemble);
    let lab = Lab::new(TESTBED, harness, nodes)
        .secured(options.secured)
        .with_leader(leader);
    Ok(match options.cuttable_links {
        true => lab.with_peer_links(links),
        false => lab,
    })
}
