//! The Redis deployments the fault suite fails over ([`ReplicatedServers`]): a primary
//! with one replica an operator promotes, a Sentinel group (a primary, two replicas,
//! three sentinels) and a Redis Cluster (three primaries with a replica each), each
//! started afresh for a round, without TLS or ACL users.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError};
use tenure_conformance::faults::{Deployments, Fault, ReplicatedServers};
use tenure_conformance::servers::{dyn_nodes, poll_until, Node, ServerError};
use tenure_conformance::testbed::BoxFuture;

use super::sentinel::RedisSentinels;
use super::sharded::RedisShardedCluster;
use super::{RedisNode, RedisReplicaPair};
use crate::RedisConfig;

/// How long the sentinels, or the cluster's nodes, wait before they call a silent primary
/// down: long enough that a loaded machine does not fail one over on its own.
const DOWN_AFTER: Duration = Duration::from_secs(3);
/// How long a replica may take to come (back) in sync with its primary.
const SYNC: Duration = Duration::from_secs(30);

/// Redis's deployments, for clients configured as `url`.
pub(super) fn deployments(url: &str) -> Result<Deployments, LockError> {
    let config = RedisConfig::from_url(url)?;
    Ok(Deployments {
        start,
        server_key: Arc::new(move |key| config.lock_key(key)),
        confirmed_query: "wait_replicas=1&wait_timeout_ms=2000&request_timeout_ms=5000",
        hasty_confirmed_query: "wait_replicas=1&wait_timeout_ms=100",
        unconfirmed: crate::UNCONFIRMED,
    })
}

fn start(fault: Fault) -> BoxFuture<'static, Result<Box<dyn ReplicatedServers>, String>> {
    Box::pin(async move {
        let started: Result<Box<dyn ReplicatedServers>, ServerError> = match fault {
            Fault::ReplicaFailover => RedisReplicaPair::start().await.map(|pair| {
                Box::new(Pair {
                    pair,
                    promoted: AtomicBool::new(false),
                }) as _
            }),
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost => RedisSentinels::start(DOWN_AFTER)
                .await
                .map(|group| Box::new(group) as _),
            _ => RedisShardedCluster::start(DOWN_AFTER)
                .await
                .map(|cluster| Box::new(cluster) as _),
        };
        started.map_err(|e| e.to_string())
    })
}

/// The index of the node at `addr` among `nodes`.
fn index_of(nodes: &[Arc<RedisNode>], addr: SocketAddr) -> Result<usize, String> {
    nodes
        .iter()
        .position(|n| n.addr() == addr)
        .ok_or_else(|| format!("no node of the deployment listens on {addr}"))
}

/// Waits (up to [`SYNC`]) until `primary` reports `replica` connected and in sync.
async fn in_sync(primary: &RedisNode, replica: &RedisNode) -> Result<(), String> {
    let online = || async {
        match primary.replica_online(replica).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(None),
            Err(e) => Err(Some(e.to_string())),
        }
    };
    poll_until(SYNC, Duration::from_millis(50), online, |last| {
        format!(
            "{} in sync with {}{}",
            replica.addr(),
            primary.addr(),
            last.map(|e| format!(" (last: {e})")).unwrap_or_default()
        )
    })
    .await
    .map_err(|e| e.to_string())
}

/// Restarts `replica` empty (no persistence) and points it at `promoted`, as the sentinels
/// would once their failover timeout passed; waits until it is in sync.
async fn rejoin(replica: &RedisNode, promoted: &RedisNode) -> Result<(), String> {
    replica.restart().await.map_err(|e| e.to_string())?;
    let (ip, port) = (promoted.addr().ip().to_string(), promoted.addr().port());
    let reply = replica
        .command(&["REPLICAOF", &ip, &port.to_string()])
        .await
        .map_err(|e| e.to_string())?;
    if !reply.is_ok() {
        return Err(format!("REPLICAOF answered {reply:?}"));
    }
    in_sync(promoted, replica).await
}

async fn connected_replicas(primary: &RedisNode) -> Result<usize, String> {
    let count = primary
        .info_field("replication", "connected_slaves")
        .await
        .map_err(|e| e.to_string())?;
    count
        .as_deref()
        .unwrap_or("0")
        .parse()
        .map_err(|e| format!("connected_slaves {count:?}: {e}"))
}

/// Strands `replicas` of `primary`: frozen, their links closed by the primary.
async fn strand(primary: &RedisNode, replicas: Vec<Arc<RedisNode>>) -> Result<(), String> {
    primary
        .strand_replicas(&replicas)
        .await
        .map_err(|e| e.to_string())
}

#[async_trait]
impl ReplicatedServers for RedisSentinels {
    fn url(&self) -> String {
        RedisSentinels::url(self)
    }

    fn nodes(&self) -> Vec<Arc<dyn Node>> {
        dyn_nodes(self.data_nodes())
    }

    async fn primary_of(&self, _server_key: &str) -> Result<usize, String> {
        let primary = self.primary().await.map_err(|e| e.to_string())?;
        index_of(self.data_nodes(), primary.addr())
    }

    async fn replicas_of(&self, primary: usize) -> Result<Vec<usize>, String> {
        Ok((0..self.data_nodes().len())
            .filter(|&i| i != primary)
            .collect())
    }

    async fn in_sync(&self, primary: usize, replica: usize) -> Result<(), String> {
        let nodes = self.data_nodes();
        in_sync(&nodes[primary], &nodes[replica]).await
    }

    async fn strand(&self, primary: usize, replicas: &[usize]) -> Result<(), String> {
        let nodes = self.data_nodes();
        strand(
            &nodes[primary],
            replicas.iter().map(|&i| nodes[i].clone()).collect(),
        )
        .await
    }

    async fn wait_failover(&self, _server_key: &str, old: usize) -> Result<usize, String> {
        let nodes = self.data_nodes();
        let promoted = RedisSentinels::wait_failover(self, nodes[old].addr())
            .await
            .map_err(|e| e.to_string())?;
        // The sentinels point the other running replicas at the promoted one.
        let others = nodes
            .iter()
            .filter(|n| n.addr() != promoted.addr() && n.is_running());
        for replica in others {
            in_sync(&promoted, replica).await?;
        }
        index_of(nodes, promoted.addr())
    }

    async fn rejoin(&self, replica: usize, promoted: usize) -> Result<(), String> {
        let nodes = self.data_nodes();
        rejoin(&nodes[replica], &nodes[promoted]).await
    }

    async fn connected_replicas(&self, primary: usize) -> Result<usize, String> {
        connected_replicas(&self.data_nodes()[primary]).await
    }
}

#[async_trait]
impl ReplicatedServers for RedisShardedCluster {
    fn url(&self) -> String {
        RedisShardedCluster::url(self)
    }

    fn nodes(&self) -> Vec<Arc<dyn Node>> {
        dyn_nodes(RedisShardedCluster::nodes(self))
    }

    async fn primary_of(&self, server_key: &str) -> Result<usize, String> {
        let primary = RedisShardedCluster::primary_of(self, server_key)
            .await
            .map_err(|e| e.to_string())?;
        index_of(RedisShardedCluster::nodes(self), primary.addr())
    }

    async fn replicas_of(&self, primary: usize) -> Result<Vec<usize>, String> {
        let nodes = RedisShardedCluster::nodes(self);
        let replicas = RedisShardedCluster::replicas_of(self, &nodes[primary])
            .await
            .map_err(|e| e.to_string())?;
        replicas.iter().map(|r| index_of(nodes, r.addr())).collect()
    }

    async fn in_sync(&self, primary: usize, replica: usize) -> Result<(), String> {
        let nodes = RedisShardedCluster::nodes(self);
        in_sync(&nodes[primary], &nodes[replica]).await
    }

    async fn strand(&self, primary: usize, replicas: &[usize]) -> Result<(), String> {
        let nodes = RedisShardedCluster::nodes(self);
        strand(
            &nodes[primary],
            replicas.iter().map(|&i| nodes[i].clone()).collect(),
        )
        .await
    }

    async fn wait_failover(&self, server_key: &str, old: usize) -> Result<usize, String> {
        let nodes = RedisShardedCluster::nodes(self);
        let promoted = RedisShardedCluster::wait_failover(self, server_key, nodes[old].addr())
            .await
            .map_err(|e| e.to_string())?;
        index_of(nodes, promoted.addr())
    }

    async fn rejoin(&self, replica: usize, promoted: usize) -> Result<(), String> {
        let nodes = RedisShardedCluster::nodes(self);
        rejoin(&nodes[replica], &nodes[promoted]).await
    }

    async fn connected_replicas(&self, primary: usize) -> Result<usize, String> {
        connected_replicas(&RedisShardedCluster::nodes(self)[primary]).await
    }
}

/// A primary (node 0) with one asynchronous replica (node 1) that nothing promotes but
/// [`wait_failover`](ReplicatedServers::wait_failover), as an operator would; its
/// replication link passes through a proxy.
struct Pair {
    pair: RedisReplicaPair,
    /// Set once a failover is asked for: clients are then sent to the replica.
    promoted: AtomicBool,
}

impl Pair {
    fn node(&self, index: usize) -> &Arc<RedisNode> {
        match index {
            0 => self.pair.primary(),
            _ => self.pair.replica(),
        }
    }
}

#[async_trait]
impl ReplicatedServers for Pair {
    /// The primary's URL, the replica's once its promotion is asked for.
    fn url(&self) -> String {
        self.node(usize::from(self.promoted.load(Ordering::SeqCst)))
            .url()
    }

    fn nodes(&self) -> Vec<Arc<dyn Node>> {
        dyn_nodes(&[self.pair.primary().clone(), self.pair.replica().clone()])
    }

    async fn primary_of(&self, _server_key: &str) -> Result<usize, String> {
        Ok(usize::from(self.promoted.load(Ordering::SeqCst)))
    }

    async fn replicas_of(&self, primary: usize) -> Result<Vec<usize>, String> {
        Ok(match primary {
            0 if !self.promoted.load(Ordering::SeqCst) => vec![1],
            _ => Vec::new(),
        })
    }

    async fn in_sync(&self, _primary: usize, _replica: usize) -> Result<(), String> {
        self.pair.wait_synced().await.map_err(|e| e.to_string())
    }

    /// Black-holes the replication link (the replica keeps running, and gets nothing).
    async fn strand(&self, _primary: usize, _replicas: &[usize]) -> Result<(), String> {
        self.pair
            .replication_link()
            .set_mode(tenure_conformance::proxy::ProxyMode::Blackhole);
        Ok(())
    }

    async fn wait_failover(&self, _server_key: &str, _old: usize) -> Result<usize, String> {
        self.promoted.store(true, Ordering::SeqCst);
        self.pair
            .replica()
            .promote()
            .await
            .map_err(|e| e.to_string())?;
        Ok(1)
    }

    async fn rejoin(&self, _replica: usize, _promoted: usize) -> Result<(), String> {
        Err("the pair's primary does not rejoin".into())
    }

    async fn connected_replicas(&self, primary: usize) -> Result<usize, String> {
        connected_replicas(self.node(primary)).await
    }
}
