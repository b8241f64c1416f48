//! A Redis Cluster ([`RedisShardedCluster`]): three primaries sharing the 16384 hash
//! slots, each with one replica, on loopback ports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::servers::{
    find_binary, free_port, kill_now, poll_until, retry_on_port_clash, Result, ServerError,
};

use super::{info_field, Persistence, RedisNode, Resp, POLL};

/// How long [`RedisShardedCluster::start`] waits for the cluster to form, and
/// [`RedisShardedCluster::wait_failover`] for a replica to take over.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL_CLI: &str = "apt-get install -y redis-tools";

/// A Redis Cluster of six nodes — three primaries, each with a replica — formed with
/// `redis-cli --cluster create`. Dropping it kills every node and deletes the data.
///
/// A primary that stops answering for `node_timeout` is failed over by the cluster
/// itself: its replica is promoted. Replication is asynchronous, as in any Redis.
/// (Not to be confused with [`RedisCluster`](super::RedisCluster): independent nodes.)
#[derive(Debug)]
pub struct RedisShardedCluster {
    nodes: Vec<Arc<RedisNode>>,
    dir: tempfile::TempDir,
}

impl RedisShardedCluster {
    /// Starts six nodes in cluster mode, forms the cluster and waits until every node
    /// reports it healthy with all slots served.
    ///
    /// # Cancel safety
    /// Cancel safe: nodes started so far are killed when the future is dropped.
    pub async fn start(node_timeout: Duration) -> Result<RedisShardedCluster> {
        retry_on_port_clash(|| Self::try_start(node_timeout)).await
    }

    async fn try_start(node_timeout: Duration) -> Result<RedisShardedCluster> {
        let dir = tempfile::Builder::new()
            .prefix("tenure-redis-cluster-")
            .tempdir()?;
        let mut cluster = RedisShardedCluster {
            nodes: Vec::with_capacity(6),
            dir,
        };
        let root = cluster.dir.path().to_owned();
        for i in 0..6 {
            let node = RedisNode::create(
                &root,
                &format!("node{i}"),
                Persistence::None,
                None,
                None,
                None,
            )
            .await?;
            // The cluster bus gets a free port of its own (Redis ≥ 7: `cluster-port`): by
            // default it is the client port + 10000, which lands in the ephemeral range,
            // where the tests' own outgoing connections take ports at random.
            let bus = free_port()?.to_string();
            let conf = node.dir.join("nodes.conf");
            let millis = node_timeout.as_millis().max(1).to_string();
            node.core.process.update_spec(|spec| {
                spec.args.extend(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf.display().to_string(),
                        "--cluster-node-timeout",
                        &millis,
                        "--cluster-port",
                        &bus,
                    ]
                    .map(Into::into),
                );
            });
            node.core.process.spawn()?;
            cluster.nodes.push(Arc::new(node));
        }
        futures::future::try_join_all(cluster.nodes.iter().map(|n| n.core.process.wait_ready()))
            .await?;
        cluster.form().await?;
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create … --cluster-replicas 1`: the first three nodes become
    /// primaries, the last three their replicas.
    async fn form(&self) -> Result<()> {
        let cli = find_binary("redis-cli", &[], INSTALL_CLI)?;
        let mut command = tokio::process::Command::new(cli);
        command.args(["--cluster", "create"]);
        command.args(self.nodes.iter().map(|n| n.addr().to_string()));
        command.args(["--cluster-replicas", "1", "--cluster-yes"]);
        command.kill_on_drop(true);
        let output = tokio::time::timeout(FORM_TIMEOUT, command.output())
            .await
            .map_err(|_| ServerError::Timeout {
                what: "redis-cli --cluster create".into(),
            })??;
        if !output.status.success() {
            return Err(ServerError::Start {
                what: "redis-cli --cluster create".into(),
                detail: format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        Ok(())
    }

    /// Waits until every running node says `cluster_state:ok`, knows all six nodes and
    /// sees all 16384 slots served.
    async fn wait_healthy(&self) -> Result<()> {
        let healthy = || async {
            let seen = self.health().await;
            let served = seen.iter().all(|(state, slots, known)| {
                state.as_deref() == Some("ok")
                    && slots.as_deref() == Some("16384")
                    && known.as_deref() == Some("6")
            });
            if served {
                Ok(())
            } else {
                Err(seen)
            }
        };
        poll_until(FORM_TIMEOUT, POLL * 5, healthy, |seen| {
            format!("the cluster to serve every slot (state, slots ok, known nodes: {seen:?})")
        })
        .await
    }

    /// Each running node's `cluster_state`, `cluster_slots_ok` and
    /// `cluster_known_nodes` (all `None` for a node that did not answer).
    async fn health(&self) -> Vec<(Option<String>, Option<String>, Option<String>)> {
        let mut seen = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let text = match node.command(&["CLUSTER", "INFO"]).await {
                Ok(info) => info.as_text().unwrap_or_default(),
                Err(_) => String::new(),
            };
            let field = |name| info_field(&text, name).map(str::to_owned);
            seen.push((
                field("cluster_state"),
                field("cluster_slots_ok"),
                field("cluster_known_nodes"),
            ));
        }
        seen
    }

    /// The nodes, in start order (the first three started as primaries).
    pub fn nodes(&self) -> &[Arc<RedisNode>] {
        &self.nodes
    }

    /// `redis+cluster://h1,…,h6`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The node serving `key` as a primary now (`CLUSTER KEYSLOT`, then `CLUSTER SHARDS`
    /// as one running node sees it).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn primary_of(&self, key: &str) -> Result<Arc<RedisNode>> {
        let node =
            self.nodes
                .iter()
                .find(|n| n.is_running())
                .ok_or_else(|| ServerError::Timeout {
                    what: "a running node".into(),
                })?;
        let slot = node
            .command(&["CLUSTER", "KEYSLOT", key])
            .await?
            .as_int()
            .ok_or_else(|| protocol("CLUSTER KEYSLOT"))?;
        let slots = node.command(&["CLUSTER", "SLOTS"]).await?;
        let Resp::Array(Some(ranges)) = slots else {
            return Err(protocol("CLUSTER SLOTS"));
        };
        for range in ranges {
            let Resp::Array(Some(parts)) = range else {
                continue;
            };
            let (Some(low), Some(high)) = (
                parts.first().and_then(Resp::as_int),
                parts.get(1).and_then(Resp::as_int),
            ) else {
                continue;
            };
            if !(low..=high).contains(&slot) {
                continue;
            }
            let Some(Resp::Array(Some(primary))) = parts.get(2) else {
                return Err(protocol("CLUSTER SLOTS"));
            };
            let port = primary.get(1).and_then(Resp::as_int).unwrap_or_default();
            return self
                .nodes
                .iter()
                .find(|n| i64::from(n.addr().port()) == port)
                .cloned()
                .ok_or_else(|| protocol("CLUSTER SLOTS names an unknown node"));
        }
        Err(protocol("CLUSTER SLOTS leaves the key's slot unserved"))
    }

    /// The running nodes that replicate `primary` (as their `ROLE` says).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn replicas_of(&self, primary: &RedisNode) -> Result<Vec<Arc<RedisNode>>> {
        let port = i64::from(primary.addr().port());
        let mut replicas = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let Resp::Array(Some(role)) = node.command(&["ROLE"]).await? else {
                return Err(protocol("ROLE"));
            };
            let of_primary = role.first().and_then(Resp::as_text).as_deref() == Some("slave")
                && role.get(2).and_then(Resp::as_int) == Some(port);
            if of_primary {
                replicas.push(node.clone());
            }
        }
        Ok(replicas)
    }

    /// Waits (up to 60 s) until another node than `old` serves `key` as a primary and the
    /// cluster is healthy again: the failover happened. Returns the new primary.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_failover(&self, key: &str, old: SocketAddr) -> Result<Arc<RedisNode>> {
        let taken_over = || async {
            match self.primary_of(key).await {
                Ok(node) if node.addr() != old && self.wait_healthy_once().await => Ok(node),
                now => Err(now),
            }
        };
        poll_until(FORM_TIMEOUT, POLL * 5, taken_over, |now| {
            format!("a replica to take over from {old} (last {now:?})")
        })
        .await
    }

    async fn wait_healthy_once(&self) -> bool {
        self.health()
            .await
            .iter()
            .all(|(state, _, _)| state.as_deref() == Some("ok"))
    }
}

fn protocol(detail: &str) -> ServerError {
    ServerError::Protocol {
        what: "redis cluster".into(),
        detail: detail.into(),
    }
}

impl Drop for RedisShardedCluster {
    fn drop(&mut self) {
        kill_now(self.nodes.iter().map(|n| &n.core));
    }
}
