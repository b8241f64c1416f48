//! Backends on local servers started by the conformance launcher, for `tenure bench
//! --all-local` and `tenure matrix`: Redis ×1, Redlock ×5, etcd ×3, ZooKeeper ×3, Postgres.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::faults::leader_of;
pub use tenure_conformance::faults::{LeaderFn, PeerLinks};
use tenure_conformance::servers::etcd::{EtcdCluster, EtcdUser};
use tenure_conformance::servers::postgres::Postgres;
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::servers::zk::{ZkEnsemble, ZkOptions};
use tenure_conformance::servers::{dyn_nodes, Node};
use tenure_conformance::UrlHarness;

/// ZooKeeper's tick on local ensembles: sessions may then be 0.4–4 s, so expiry scenarios
/// run in seconds.
const ZK_TICK_MS: u32 = 200;

/// A backend on servers this process started. Dropping it stops them.
#[derive(Clone)]
pub struct LocalBackend {
    /// The backend's name (`redis`, `redlock`, `etcd`, `zk`, `postgres`).
    pub name: &'static str,
    /// A harness whose clients are `tenure::connect(url)`; it owns the servers.
    pub harness: UrlHarness,
    /// The servers, for process faults.
    pub nodes: Vec<Arc<dyn Node>>,
    /// Whether the nodes run under the clock shim (Redis only).
    pub clock_shim: bool,
    /// Whether the servers require TLS and a password ([`LocalOptions::secured`]).
    pub secured: bool,
    /// The consensus leader (etcd, ZooKeeper).
    pub leader: Option<LeaderFn>,
    /// The links between members, where they can be cut (ZooKeeper).
    pub peer_links: Option<Arc<dyn PeerLinks>>,
}

impl fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBackend")
            .field("name", &self.name)
            .field("harness", &self.harness)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// What to start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalOptions {
    /// Run redis-server under the clock shim, so fault scenarios can jump its clock (it
    /// turns `clock_gettime` into a syscall: leave it off for benchmarks).
    pub clock_shim: bool,
    /// Servers that require TLS with client certificates from a throwaway CA and a
    /// password, and clients as a user with only the privileges docs/security.md
    /// lists: Redis ACL user on its prefix, etcd role on its prefix, ZooKeeper
    /// digest ACL on its chroot, Postgres role granted [`PgConfig::grant_sql`].
    ///
    /// [`PgConfig::grant_sql`]: tenure_postgres::PgConfig::grant_sql
    pub secured: bool,
}

/// The backends `start` knows, in matrix order.
pub fn backends() -> Vec<&'static str> {
    vec!["redis", "redlock", "etcd", "zk", "postgres"]
}

/// A harness on `nodes` that follows them when a restart moves one to another port.
fn harness(name: &str, template: &str, nodes: &[Arc<dyn Node>]) -> UrlHarness {
    let targets = nodes.iter().map(|n| n.addr()).collect();
    UrlHarness::new(name, template, targets, |url| async move {
        tenure::connect(&url).await
    })
    .follow_nodes(nodes)
}

/// Starts the servers of `backend` on free loopback ports.
///
/// # Cancel safety
/// Cancel-safe: servers started so far are stopped when dropped.
pub async fn start(
    backend: &str,
    options: LocalOptions,
) -> Result<LocalBackend, Box<dyn Error + Send + Sync>> {
    let secured = options.secured;
    let redis = |n| {
        let options = RedisOptions::default()
            .nodes(n)
            .clock_shim(options.clock_shim);
        match secured {
            true => options.secured(tenure_redis::ACL_COMMANDS),
            false => options,
        }
    };
    let mut leader = None;
    let mut peer_links: Option<Arc<dyn PeerLinks>> = None;
    let (name, harness, nodes, clock_shim) = match backend {
        "redis" | "redlock" => {
            let cluster =
                RedisCluster::start(redis(if backend == "redis" { 1 } else { 5 })).await?;
            let nodes = dyn_nodes(cluster.nodes());
            let template = match cluster.secrets() {
                Some(secrets) => secrets.url(&format!("{backend}s"), "{hosts}"),
                None => format!("{backend}://{{hosts}}"),
            };
            let harness = harness(backend, &template, &nodes);
            let harness = match backend {
                "redis" => harness.cut_query("request_timeout_ms=300"),
                _ => harness,
            };
            let name = if backend == "redis" {
                "redis"
            } else {
                "redlock"
            };
            (name, harness.owning(cluster), nodes, options.clock_shim)
        }
        "etcd" => {
            let (cluster, template) = if secured {
                let cluster = EtcdCluster::start_secured(3).await?;
                let secrets = cluster.secrets().ok_or("a secured cluster")?.clone();
                let template = secrets.url("{hosts}");
                let hosts: Vec<String> = cluster
                    .members()
                    .iter()
                    .map(|m| m.addr().to_string())
                    .collect();
                let prefix =
                    tenure_etcd::EtcdConfig::from_url(&secrets.url(&hosts.join(",")))?.key_prefix();
                cluster
                    .enable_auth(&[EtcdUser {
                        name: "tenure",
                        password: &secrets.password,
                        prefix: &prefix,
                    }])
                    .await?;
                (cluster, template)
            } else {
                (
                    EtcdCluster::start(3).await?,
                    "etcd://{hosts}/tenure".to_owned(),
                )
            };
            let cluster = Arc::new(cluster);
            leader = Some(leader_of(&cluster, |c| {
                Box::pin(async move { c.leader_index().await.ok() })
            }));
            let nodes = dyn_nodes(cluster.members());
            let harness = harness("etcd", &template, &nodes)
                .cut_query("request_timeout_ms=500")
                // Leases count whole seconds, at least ~1.5 election timeouts.
                .with_short_ttl(Duration::from_secs(2));
            ("etcd", harness.owning(cluster), nodes, false)
        }
        "zk" => {
            let zk_options = ZkOptions::default()
                .nodes(3)
                .tick_time_ms(ZK_TICK_MS)
                .peer_proxies(true);
            let zk_options = match secured {
                true => zk_options.secured(),
                false => zk_options,
            };
            let ensemble = Arc::new(ZkEnsemble::start(zk_options).await?);
            leader = Some(leader_of(&ensemble, |e| {
                Box::pin(async move { e.leader_index().await.ok() })
            }));
            peer_links = Some(ensemble.clone());
            let nodes = dyn_nodes(ensemble.nodes());
            let template = match ensemble.secrets() {
                Some(secrets) => format!("{}&tick_ms={ZK_TICK_MS}", secrets.url("{hosts}")),
                None => format!("zk://{{hosts}}?tick_ms={ZK_TICK_MS}"),
            };
            let harness = harness("zk", &template, &nodes)
                .query("session_timeout_ms=4000")
                .cut_query("session_timeout_ms=1000&request_timeout_ms=300");
            ("zk", harness.owning(ensemble), nodes, false)
        }
        "postgres" => {
            let (server, template) = if secured {
                let server = Postgres::start_secured().await?;
                let secrets = server.secrets().ok_or("a secured server")?.clone();
                let config =
                    tenure_postgres::PgConfig::from_url(&secrets.url(&server.addr().to_string()))?;
                server.psql(&config.schema_sql()).await?;
                server.psql(&config.grant_sql("tenure")?).await?;
                (server, secrets.url("{hosts}"))
            } else {
                let template = "postgres://postgres@{hosts}/postgres".to_owned();
                (Postgres::start().await?, template)
            };
            let server = Arc::new(server);
            let nodes: Vec<Arc<dyn Node>> = vec![server.clone()];
            let harness = harness("postgres", &template, &nodes)
                // The schema exists once the queue's client below has connected; a short
                // command timeout would cut a migration queued behind concurrent ones.
                .cut_query("request_timeout_ms=300&migrate=false");
            ("postgres", harness.owning(server), nodes, false)
        }
        other => {
            return Err(format!(
                "no local servers for backend {other:?} in this build (known: {})",
                backends().join(", ")
            )
            .into())
        }
    };
    // Where the backend keeps a queue, the FIFO scenario counts it, through a client of
    // its own, instead of trusting pauses between its waiters.
    let admin = tenure::admin::connect_admin(&harness.url()).await?;
    let harness = harness.with_queue_admin(admin);
    Ok(LocalBackend {
        name,
        harness,
        nodes,
        clock_shim,
        secured,
        leader,
        peer_links,
    })
}
