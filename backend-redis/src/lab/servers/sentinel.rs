//! A Sentinel-managed Redis: one primary, two asynchronous replicas and three sentinels
//! ([`RedisSentinels`]), all on loopback ports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::{
    find_binary, free_port, kill_now, loopback, node_control_methods, poll_until,
    retry_on_port_clash, NodeCore, Result, ServerError,
};

use super::{command, ping, Persistence, RedisNode, Resp, INSTALL, POLL, READY_TIMEOUT};

/// The name the sentinels monitor the primary under (the path of a `redis+sentinel://`
/// URL).
pub const MASTER_NAME: &str = "tenure";

/// How long [`RedisSentinels::start`] waits for the sentinels to see the replicas and
/// each other, and [`RedisSentinels::wait_failover`] for a promotion.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);

/// One `redis-server --sentinel` process.
#[derive(Debug)]
pub struct SentinelNode {
    core: NodeCore,
}

impl SentinelNode {
    node_control_methods!();

    /// Runs one command on a fresh connection to this sentinel, bounded by 5 s.
    ///
    /// # Cancel safety
    /// Cancel safe in that nothing is left behind.
    pub async fn command<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<Resp> {
        let addr = self.addr();
        tokio::time::timeout(super::COMMAND_TIMEOUT, command(addr, args))
            .await
            .map_err(|_| ServerError::Timeout {
                what: format!("a reply from sentinel {addr}"),
            })?
    }

    /// The primary this sentinel names for [`MASTER_NAME`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn primary(&self) -> Result<SocketAddr> {
        let reply = self
            .command(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME])
            .await?;
        let addr = match &reply {
            Resp::Array(Some(parts)) if parts.len() == 2 => {
                let text: Vec<String> = parts.iter().filter_map(Resp::as_text).collect();
                text.join(":").parse().ok()
            }
            _ => None,
        };
        addr.ok_or_else(|| ServerError::Protocol {
            what: self.core.process.what().to_owned(),
            detail: format!("get-master-addr-by-name answered {reply:?}"),
        })
    }

    /// An integer field of `SENTINEL master` (e.g. `num-slaves`, `num-other-sentinels`).
    async fn master_field(&self, field: &str) -> Result<Option<i64>> {
        let reply = self.command(&["SENTINEL", "master", MASTER_NAME]).await?;
        let Resp::Array(Some(items)) = reply else {
            return Ok(None);
        };
        let texts: Vec<Option<String>> = items.iter().map(Resp::as_text).collect();
        Ok(texts
            .chunks(2)
            .find(|pair| pair[0].as_deref() == Some(field))
            .and_then(|pair| pair.get(1)?.as_deref()?.parse().ok()))
    }
}

/// A Sentinel-managed primary with two replicas and three sentinels (quorum 2). Dropping
/// it kills every process and deletes the data.
///
/// The sentinels consider the primary down after `down_after` without an answer, then
/// agree on a replica to promote: a real failover, as a managed Redis runs it. Replication
/// is asynchronous, so a write the primary acknowledged can be missing on the promoted
/// replica.
#[derive(Debug)]
pub struct RedisSentinels {
    data: Vec<Arc<RedisNode>>,
    sentinels: Vec<SentinelNode>,
    dir: tempfile::TempDir,
}

impl RedisSentinels {
    /// Starts the primary, its replicas and the sentinels, and waits until every sentinel
    /// knows both replicas and the two other sentinels (so a failover can be agreed on).
    ///
    /// # Cancel safety
    /// Cancel safe: processes started so far are killed when the future is dropped.
    pub async fn start(down_after: Duration) -> Result<RedisSentinels> {
        retry_on_port_clash(|| Self::try_start(down_after)).await
    }

    async fn try_start(down_after: Duration) -> Result<RedisSentinels> {
        let dir = tempfile::Builder::new()
            .prefix("tenure-redis-sentinel-")
            .tempdir()?;
        let mut group = RedisSentinels {
            data: Vec::with_capacity(3),
            sentinels: Vec::with_capacity(3),
            dir,
        };
        let root = group.dir.path().to_owned();
        let primary =
            RedisNode::create(&root, "data0", Persistence::None, None, None, None).await?;
        primary.core.process.spawn()?;
        let primary = Arc::new(primary);
        group.data.push(primary.clone());
        for i in 1..3 {
            let replica = RedisNode::create(
                &root,
                &format!("data{i}"),
                Persistence::None,
                None,
                Some(primary.addr()),
                None,
            )
            .await?;
            replica.core.process.spawn()?;
            group.data.push(Arc::new(replica));
        }
        futures::future::try_join_all(group.data.iter().map(|n| n.core.process.wait_ready()))
            .await?;
        for i in 0..3 {
            let sentinel = SentinelNode::create(&root, i, primary.addr(), down_after).await?;
            sentinel.core.process.spawn()?;
            group.sentinels.push(sentinel);
        }
        futures::future::try_join_all(group.sentinels.iter().map(|s| s.core.process.wait_ready()))
            .await?;
        group.wait_topology().await?;
        Ok(group)
    }

    /// Waits until every sentinel sees two replicas and two other sentinels.
    async fn wait_topology(&self) -> Result<()> {
        let formed = || async {
            let mut seen = Vec::new();
            for s in &self.sentinels {
                let replicas = s.master_field("num-slaves").await;
                let others = s.master_field("num-other-sentinels").await;
                seen.push((replicas, others));
            }
            let ready = |(replicas, others): &(Result<_>, Result<_>)| {
                matches!((replicas, others), (Ok(Some(2)), Ok(Some(2))))
            };
            if seen.iter().all(ready) {
                Ok(())
            } else {
                Err(seen)
            }
        };
        poll_until(TOPOLOGY_TIMEOUT, POLL * 5, formed, |seen| {
            format!("the sentinels to see 2 replicas and 2 other sentinels (saw {seen:?})")
        })
        .await
    }

    /// The data nodes: the first started as the primary, the others as its replicas.
    pub fn data_nodes(&self) -> &[Arc<RedisNode>] {
        &self.data
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[SentinelNode] {
        &self.sentinels
    }

    /// The sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(SentinelNode::addr).collect()
    }

    /// `redis+sentinel://s1,s2,s3/tenure`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The data node the first answering sentinel names as the primary.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn primary(&self) -> Result<Arc<RedisNode>> {
        let mut last = None;
        for s in &self.sentinels {
            match s.primary().await {
                Ok(addr) => return self.node_at(addr),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(ServerError::Timeout {
            what: "a sentinel".into(),
        }))
    }

    fn node_at(&self, addr: SocketAddr) -> Result<Arc<RedisNode>> {
        self.data
            .iter()
            .find(|n| n.addr() == addr)
            .cloned()
            .ok_or_else(|| ServerError::Protocol {
                what: "the sentinels".into(),
                detail: format!("they name {addr}, which is none of the data nodes"),
            })
    }

    /// Waits (up to 60 s) until every running sentinel names a primary other than `old`
    /// and that node answers `ROLE` as a master: the failover happened. Returns the new
    /// primary.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_failover(&self, old: SocketAddr) -> Result<Arc<RedisNode>> {
        let promoted = || async {
            let mut named = Vec::new();
            for s in self.sentinels.iter().filter(|s| s.is_running()) {
                named.push(s.primary().await.ok());
            }
            if let Some(Some(addr)) = named.first() {
                let agreed = named.iter().all(|n| n.as_ref() == Some(addr));
                if let Some(node) = self.node_at(*addr).ok().filter(|_| agreed && *addr != old) {
                    let role = node.command(&["ROLE"]).await;
                    if let Ok(Resp::Array(Some(parts))) = &role {
                        if parts.first().and_then(Resp::as_text).as_deref() == Some("master") {
                            return Ok(node);
                        }
                    }
                }
            }
            Err(named)
        };
        poll_until(TOPOLOGY_TIMEOUT, POLL * 5, promoted, |named| {
            format!(
                "the sentinels to promote a replica in place of {old} (they name {named:?}); \
                 sentinel log:\n{}",
                self.sentinels[0].log_tail(2000)
            )
        })
        .await
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        kill_now(
            self.data
                .iter()
                .map(|n| &n.core)
                .chain(self.sentinels.iter().map(|s| &s.core)),
        );
    }
}

impl SentinelNode {
    /// Creates (does not start) sentinel `i` monitoring `primary`, with its own
    /// configuration file (a sentinel rewrites it as it learns the topology).
    async fn create(
        root: &std::path::Path,
        i: usize,
        primary: SocketAddr,
        down_after: Duration,
    ) -> Result<SentinelNode> {
        let bin = find_binary("redis-server", &[], INSTALL)?;
        let port = free_port()?;
        let addr = loopback(port);
        let dir = root.join(format!("sentinel{i}"));
        std::fs::create_dir_all(&dir)?;
        let conf = dir.join("sentinel.conf");
        let millis = down_after.as_millis().max(1);
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
                 logfile \"\"\n\
                 sentinel monitor {MASTER_NAME} {ip} {pport} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {millis}\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 2\n",
                dir = dir.display(),
                ip = primary.ip(),
                pport = primary.port(),
            ),
        )?;
        let spec = CommandSpec::new(bin).cwd(&dir).arg(&conf).arg("--sentinel");
        let probe: Probe = Arc::new(|addr| Box::pin(async move { Ok(ping(addr).await.is_ok()) }));
        let process = ServerProcess::new(
            format!("redis sentinel{i} on {addr}"),
            spec,
            root.join(format!("sentinel{i}.log")),
            READY_TIMEOUT,
            addr,
            probe,
        );
        Ok(SentinelNode {
            core: NodeCore::new(process).await?,
        })
    }
}
