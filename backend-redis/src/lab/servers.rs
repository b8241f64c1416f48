//! Redis: N independent nodes ([`RedisCluster`]) or a primary with an asynchronous replica
//! ([`RedisReplicaPair`]), plus a minimal RESP client ([`command`], [`RespConnection`]) so
//! this crate needs no Redis client library.
//!
//! Nodes run `redis-server` with `--bind 127.0.0.1`, no protected mode, and by default no
//! persistence at all (no RDB snapshots, no AOF): a restarted node comes back empty. With
//! [`Persistence::AofAlways`] every write is fsynced to the AOF before it is acknowledged,
//! so it survives a `SIGKILL`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tenure_conformance::clock_shim::{self, ClockShim, OffsetFile};
use tenure_conformance::proxy::FaultProxy;
use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::tls::{write_private, TestSecrets};
use tenure_conformance::servers::{
    find_binary, free_port, impl_node, kill_now, loopback, node_control_methods, poll_until,
    retry_on_port_clash, NodeCore, Result, ServerError,
};

pub mod sentinel;
pub mod sharded;

const INSTALL: &str = "apt-get install -y redis-server";
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on [`RedisNode::command`].
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on waiting for replication (link up, offsets).
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);

/// How a node persists data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Persistence {
    /// No RDB snapshots and no AOF: a restart loses everything.
    #[default]
    None,
    /// `appendonly yes`, `appendfsync always`: acknowledged writes survive a crash.
    AofAlways,
}

/// Options for [`RedisCluster::start`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Number of independent nodes (default 1).
    pub nodes: usize,
    /// Persistence of every node (default none).
    pub persistence: Persistence,
    /// Run every node under the [clock shim](tenure_conformance::clock_shim), enabling
    /// [`RedisNode::set_clock_offset`] (default off).
    pub clock_shim: bool,
    /// Secure every node (default off): see [`RedisOptions::secured`].
    pub secured: Option<String>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            nodes: 1,
            persistence: Persistence::None,
            clock_shim: false,
            secured: None,
        }
    }
}

impl RedisOptions {
    /// Set the number of nodes.
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    /// Set the persistence mode.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Enable or disable the clock shim.
    pub fn clock_shim(mut self, on: bool) -> Self {
        self.clock_shim = on;
        self
    }

    /// Nodes that require TLS and a password: a TLS port only (`--port 0`), certificates
    /// from a [`TestPki`](tenure_conformance::servers::tls::TestPki) made for the cluster, client certificates required
    /// (`tls-auth-clients yes`), the `default` user off, and two ACL users allowed
    /// `commands` (e.g. `-@all +get …`): `tenure` on keys and channels `{tenure/*`, and
    /// `stranger` on `{stranger/*` only. Their random passwords and the certificates are
    /// in [`RedisCluster::secrets`]. Nodes are then reachable with `rediss://` only, not by
    /// [`RedisNode::command`].
    pub fn secured(mut self, commands: &str) -> Self {
        self.secured = Some(commands.to_owned());
        self
    }
}

/// What clients of a [secured](RedisOptions::secured) cluster need: its CA and passwords
/// (through `Deref`), and the URLs that use them.
#[derive(Clone, Debug)]
pub struct RedisSecrets {
    users: TestSecrets,
    commands: String,
}

impl std::ops::Deref for RedisSecrets {
    type Target = TestSecrets;

    fn deref(&self) -> &TestSecrets {
        &self.users
    }
}

impl RedisSecrets {
    fn generate(dir: &Path, commands: &str) -> Result<RedisSecrets> {
        Ok(RedisSecrets {
            users: TestSecrets::generate(&dir.join("pki"))?,
            commands: commands.to_owned(),
        })
    }

    /// The ACL file: `default` off, `tenure` and `stranger` each on their own prefix.
    fn acl_file(&self) -> String {
        let user = |name: &str, password: &str| {
            format!(
                "user {name} on >{password} resetkeys ~{{{name}/* resetchannels &{{{name}/* {}\n",
                self.commands
            )
        };
        format!(
            "user default off\n{}{}",
            user("tenure", &self.password),
            user("stranger", &self.stranger_password)
        )
    }

    /// A URL of ACL user `tenure` on prefix `tenure/` with the TLS options: `scheme`
    /// (`rediss`, `redlocks`) and `hosts` (`h:p,…`, or a harness template's `{hosts}`).
    pub fn url(&self, scheme: &str, hosts: &str) -> String {
        format!(
            "{scheme}://tenure:{}@{hosts}?prefix=tenure/&{}",
            self.password,
            self.tls_options()
        )
    }
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisNode {
    core: NodeCore,
    dir: PathBuf,
    offset_file: Option<OffsetFile>,
}

impl_node!(
    RedisNode,
    RedisNode::set_clock_offset,
    RedisNode::clock_applied
);

impl RedisNode {
    node_control_methods!();

    /// `redis://127.0.0.1:<port>`, direct.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `redis://127.0.0.1:<port>` of the fault proxy in front of this node.
    pub fn proxied_url(&self) -> String {
        format!("redis://{}", self.proxied_addr())
    }

    /// The node's working directory (AOF, RDB, clock offset file).
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// Shift this node's wall clock by `offset_ms` milliseconds from real time (not
    /// cumulative; 0 undoes it). Visible to the server within about 10 ms. Key expiry
    /// (`PX`/`EX` deadlines) follows the shifted clock. Fails with
    /// [`ServerError::Unsupported`] unless the cluster was started with
    /// [`RedisOptions::clock_shim`].
    pub fn set_clock_offset(&self, offset_ms: i64) -> Result<()> {
        let what = self.core.process.what();
        let needs = "RedisOptions::clock_shim(true)";
        clock_shim::shift(self.offset_file.as_ref(), what, needs, offset_ms)
    }

    /// Evidence from the clock shim: the offset the server process last read and applies,
    /// with that process's pid (see [`clock_shim::read_applied`]). `None` without
    /// the shim or before the server first read its clock.
    pub fn clock_applied(&self) -> Option<(i64, u32)> {
        self.offset_file.as_ref()?.applied()
    }

    /// Run one command on a fresh direct connection, bounded by 5 s.
    ///
    /// # Cancel safety
    /// Cancel safe in that nothing is left behind, but the command may or may not have
    /// run.
    pub async fn command<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<Resp> {
        let addr = self.addr();
        tokio::time::timeout(COMMAND_TIMEOUT, command(addr, args))
            .await
            .map_err(|_| ServerError::Timeout {
                what: format!("a reply from redis {addr}"),
            })?
    }

    /// One field of `INFO <section>` (e.g. `("replication", "master_link_status")`).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn info_field(&self, section: &str, field: &str) -> Result<Option<String>> {
        let info = self.command(&["INFO", section]).await?;
        let text = info.as_text().ok_or_else(|| self.protocol(&info))?;
        Ok(info_field(&text, field).map(str::to_owned))
    }

    /// How many times the node ran `command` (lower case, e.g. `"evalsha"`) since it
    /// started or its statistics were last reset (`CONFIG RESETSTAT`), from `INFO
    /// commandstats`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn command_calls(&self, command: &str) -> Result<u64> {
        let field = format!("cmdstat_{command}");
        let Some(stats) = self.info_field("commandstats", &field).await? else {
            return Ok(0);
        };
        stats
            .split(',')
            .find_map(|part| part.strip_prefix("calls="))
            .and_then(|calls| calls.parse().ok())
            .ok_or_else(|| ServerError::Protocol {
                what: self.core.process.what().to_owned(),
                detail: format!("{field}:{stats}"),
            })
    }

    /// Make this node a primary: `REPLICAOF NO ONE`. Later restarts also start it as a
    /// primary.
    ///
    /// # Cancel safety
    /// Not cancel safe: the node may be promoted while its restart configuration still
    /// names the old primary.
    pub async fn promote(&self) -> Result<()> {
        let r = self.command(&["REPLICAOF", "NO", "ONE"]).await?;
        if !r.is_ok() {
            return Err(self.protocol(&r));
        }
        self.core
            .process
            .update_spec(|s| s.remove_option("--replicaof", 2));
        Ok(())
    }

    /// The node's replication offset: `master_repl_offset` on a primary, `slave_repl_offset`
    /// (what it has processed) on a replica.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn replication_offset(&self) -> Result<i64> {
        let info = self.command(&["INFO", "replication"]).await?;
        let text = info.as_text().ok_or_else(|| self.protocol(&info))?;
        let field = if info_field(&text, "role") == Some("slave") {
            "slave_repl_offset"
        } else {
            "master_repl_offset"
        };
        info_field(&text, field)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ServerError::Protocol {
                what: self.core.process.what().to_owned(),
                detail: format!("INFO replication has no {field}"),
            })
    }

    /// On a primary: the offset its first replica has acknowledged (`offset=` of `slave0`
    /// in `INFO replication`), `None` without a replica.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn acknowledged_offset(&self) -> Result<Option<i64>> {
        let info = self.command(&["INFO", "replication"]).await?;
        let text = info.as_text().ok_or_else(|| self.protocol(&info))?;
        Ok(info_field(&text, "slave0").and_then(|replica| {
            replica
                .split(',')
                .find_map(|part| part.strip_prefix("offset="))
                .and_then(|v| v.parse().ok())
        }))
    }

    /// On a primary: freezes `replicas` (`SIGSTOP`) and closes its links to its replicas
    /// (`CLIENT KILL TYPE replica`), then checks that none of `replicas` is connected.
    /// Until they are [resumed](Self::resume), its writes reach none of them — the window
    /// in which a failover to an asynchronous replica loses them — and `WAIT` does not
    /// count them. A frozen replica cannot reconnect; resumed, it resynchronises if this
    /// primary still runs. Other replicas reconnect on their own (see
    /// [`replica_online`](Self::replica_online)).
    ///
    /// # Cancel safety
    /// Not cancel safe: cancelled midway, replicas may be left frozen.
    pub async fn strand_replicas(&self, replicas: &[Arc<RedisNode>]) -> Result<()> {
        for replica in replicas {
            replica.pause()?;
        }
        let killed = self.command(&["CLIENT", "KILL", "TYPE", "replica"]).await?;
        if killed.as_int().is_none() {
            return Err(self.protocol(&killed));
        }
        for replica in replicas {
            if self.replica_entry(replica).await?.is_some() {
                return Err(ServerError::Protocol {
                    what: self.core.process.what().to_owned(),
                    detail: format!("{} still connected after CLIENT KILL", replica.addr()),
                });
            }
        }
        Ok(())
    }

    /// On a primary: whether `replica` is connected and in sync (`state=online` in its
    /// entry of `INFO replication`).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn replica_online(&self, replica: &RedisNode) -> Result<bool> {
        let entry = self.replica_entry(replica).await?;
        Ok(entry.is_some_and(|e| e.split(',').any(|part| part == "state=online")))
    }

    /// `replica`'s `slaveN:ip=…,port=…,state=…` entry in this primary's `INFO
    /// replication` (matched by its listening port), if connected.
    async fn replica_entry(&self, replica: &RedisNode) -> Result<Option<String>> {
        let info = self.command(&["INFO", "replication"]).await?;
        let text = info.as_text().ok_or_else(|| self.protocol(&info))?;
        let port = format!("port={}", replica.addr().port());
        Ok(text
            .lines()
            .filter(|line| line.starts_with("slave") && line.contains(":ip="))
            .find(|line| line.split(',').any(|part| part == port))
            .map(str::to_owned))
    }

    fn protocol(&self, r: &Resp) -> ServerError {
        ServerError::Protocol {
            what: self.core.process.what().to_owned(),
            detail: format!("{r:?}"),
        }
    }

    /// Create (not start) a node in `root/name`.
    async fn create(
        root: &Path,
        name: &str,
        persistence: Persistence,
        shim: Option<&ClockShim>,
        replica_of: Option<SocketAddr>,
        secrets: Option<&RedisSecrets>,
    ) -> Result<RedisNode> {
        let bin = find_binary("redis-server", &[], INSTALL)?;
        let port = free_port()?;
        let addr = loopback(port);
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)?;
        let port_option = if secrets.is_some() {
            "--tls-port"
        } else {
            "--port"
        };
        let mut spec = CommandSpec::new(bin)
            .cwd(&dir)
            .arg(port_option)
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&dir)
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("no")
            .arg("--logfile")
            .arg("")
            .arg("--save")
            .arg("")
            .arg("--repl-diskless-sync-delay")
            .arg("0");
        spec = match persistence {
            Persistence::None => spec.arg("--appendonly").arg("no"),
            Persistence::AofAlways => spec
                .arg("--appendonly")
                .arg("yes")
                .arg("--appendfsync")
                .arg("always"),
        };
        if let Some(secrets) = secrets {
            let acl = dir.join("users.acl");
            write_private(&acl, &secrets.acl_file())?;
            spec = spec
                .arg("--port")
                .arg("0")
                .arg("--tls-cert-file")
                .arg(secrets.pki.server_cert())
                .arg("--tls-key-file")
                .arg(secrets.pki.server_key())
                .arg("--tls-ca-cert-file")
                .arg(secrets.pki.ca())
                .arg("--tls-auth-clients")
                .arg("yes")
                .arg("--aclfile")
                .arg(acl);
        }
        if let Some(primary) = replica_of {
            spec = spec
                .arg("--replicaof")
                .arg(primary.ip().to_string())
                .arg(primary.port().to_string());
        }
        let offset_file = match shim {
            Some(shim) => {
                let (shimmed, file) = shim.install(&dir, spec)?;
                spec = shimmed;
                Some(file)
            }
            None => None,
        };
        let probe: Probe = if secrets.is_some() {
            // A TLS port: listening is ready (a node without data has nothing to load).
            Arc::new(|addr| Box::pin(async move { Ok(TcpStream::connect(addr).await.is_ok()) }))
        } else {
            Arc::new(|addr| Box::pin(async move { Ok(ping(addr).await.is_ok()) }))
        };
        let process = ServerProcess::new(
            format!("redis-server {name} on {addr}"),
            spec,
            root.join(format!("{name}.log")),
            READY_TIMEOUT,
            addr,
            probe,
        )
        .movable_port(port_option);
        Ok(RedisNode {
            core: NodeCore::new(process).await?,
            dir,
            offset_file,
        })
    }
}

/// N independent Redis nodes (not a Redis Cluster: no slots, no gossip), as used by
/// Redlock. Dropping it kills every node and deletes the data.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Arc<RedisNode>>,
    secrets: Option<RedisSecrets>,
    dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Start `options.nodes` nodes and wait until each answers `PING`.
    ///
    /// # Cancel safety
    /// Cancel safe: nodes started so far are killed when the future is dropped.
    pub async fn start(options: RedisOptions) -> Result<RedisCluster> {
        let shim = ClockShim::build_if(options.clock_shim).await?;
        retry_on_port_clash(|| Self::try_start(&options, shim.as_ref())).await
    }

    async fn try_start(options: &RedisOptions, shim: Option<&ClockShim>) -> Result<RedisCluster> {
        let dir = tempfile::Builder::new().prefix("tenure-redis-").tempdir()?;
        let secrets = match &options.secured {
            Some(commands) => Some(RedisSecrets::generate(dir.path(), commands)?),
            None => None,
        };
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(options.nodes),
            secrets,
            dir,
        };
        for i in 0..options.nodes {
            let node = RedisNode::create(
                cluster.dir.path(),
                &format!("node{i}"),
                options.persistence,
                shim,
                None,
                cluster.secrets.as_ref(),
            )
            .await?;
            node.core.process.spawn()?;
            cluster.nodes.push(Arc::new(node));
        }
        futures::future::try_join_all(cluster.nodes.iter().map(|n| n.core.process.wait_ready()))
            .await?;
        Ok(cluster)
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[Arc<RedisNode>] {
        &self.nodes
    }

    /// Direct URLs of all nodes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Proxied URLs of all nodes.
    pub fn proxied_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.proxied_url()).collect()
    }

    /// The temporary directory holding every node's data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The certificates and passwords of a [secured](RedisOptions::secured) cluster.
    pub fn secrets(&self) -> Option<&RedisSecrets> {
        self.secrets.as_ref()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        kill_now(self.nodes.iter().map(|n| &n.core));
    }
}

/// A Redis primary with one asynchronous replica. Dropping it kills both and deletes the
/// data.
///
/// The replica replicates through its own [`FaultProxy`] (the
/// [`replication_link`](Self::replication_link)), so the link can be cut without touching
/// either server. Replication is asynchronous: a write acknowledged by the primary can be
/// missing on the replica when the primary dies. Black-hole the link, write, kill the
/// primary, [`promote`](RedisNode::promote) the replica, and the write is gone.
///
/// Pausing the replica (`SIGSTOP`) is *not* enough for that: the kernel still accepts the
/// replication stream into the stopped replica's socket buffer, and the replica applies it
/// as soon as it is resumed, before it can be promoted.
#[derive(Debug)]
pub struct RedisReplicaPair {
    primary: Arc<RedisNode>,
    replica: Arc<RedisNode>,
    link: FaultProxy,
    dir: tempfile::TempDir,
}

impl RedisReplicaPair {
    /// Start a primary and a replica (no persistence) and wait until the replication link
    /// is up.
    ///
    /// # Cancel safety
    /// Cancel safe: processes started so far are killed when the future is dropped.
    pub async fn start() -> Result<RedisReplicaPair> {
        retry_on_port_clash(Self::try_start).await
    }

    async fn try_start() -> Result<RedisReplicaPair> {
        let dir = tempfile::Builder::new()
            .prefix("tenure-redis-pair-")
            .tempdir()?;
        let primary = Arc::new(
            RedisNode::create(dir.path(), "primary", Persistence::None, None, None, None).await?,
        );
        let link = FaultProxy::start(primary.addr()).await?;
        let replica = Arc::new(
            RedisNode::create(
                dir.path(),
                "replica",
                Persistence::None,
                None,
                Some(link.addr()),
                None,
            )
            .await?,
        );
        let pair = RedisReplicaPair {
            primary,
            replica,
            link,
            dir,
        };
        pair.primary.core.process.spawn()?;
        pair.replica.core.process.spawn()?;
        futures::future::try_join(
            pair.primary.core.process.wait_ready(),
            pair.replica.core.process.wait_ready(),
        )
        .await?;
        pair.wait_link_up().await?;
        Ok(pair)
    }

    /// The primary.
    pub fn primary(&self) -> &Arc<RedisNode> {
        &self.primary
    }

    /// The replica.
    pub fn replica(&self) -> &Arc<RedisNode> {
        &self.replica
    }

    /// The fault proxy that carries replication from the primary to the replica. Set it to
    /// [`ProxyMode::Blackhole`](tenure_conformance::proxy::ProxyMode::Blackhole) to cut replication while
    /// both servers keep running.
    pub fn replication_link(&self) -> &FaultProxy {
        &self.link
    }

    /// The temporary directory holding both nodes' data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Wait (up to 20 s) until the replica reports `master_link_status:up`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_link_up(&self) -> Result<()> {
        let link_up = || async {
            let status = self
                .replica
                .info_field("replication", "master_link_status")
                .await;
            match &status {
                Ok(Some(s)) if s == "up" => Ok(()),
                _ => Err(status),
            }
        };
        poll_until(REPLICATION_TIMEOUT, POLL, link_up, |status| {
            format!(
                "the replica's link to the primary (last status {status:?}); replica log:\n{}",
                self.replica.log_tail(1500)
            )
        })
        .await
    }

    /// Wait (up to 20 s) until the replica has processed everything the primary had
    /// written when this was called, and the primary knows it: the replica's
    /// acknowledged offset (what `WAIT` counts) has reached it too. (Right after the
    /// initial sync a replica can acknowledge offset 0 for a second: a `WAIT` then times
    /// out.) It publishes a message first, which advances the offset without a key.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_synced(&self) -> Result<()> {
        // A message (replicated, and no key) so that there is something to acknowledge:
        // a replica still loading the initial sync acknowledges offset 0.
        self.primary
            .command(&["PUBLISH", "tenure-harness:synced", "1"])
            .await?;
        let target = self.primary.replication_offset().await?;
        let reached = || async {
            let got = self.replica.replication_offset().await;
            let acked = self.primary.acknowledged_offset().await;
            match (&got, &acked) {
                (Ok(o), Ok(Some(a))) if *o >= target && *a >= target => Ok(()),
                _ => Err(got),
            }
        };
        poll_until(REPLICATION_TIMEOUT, POLL, reached, |got| {
            format!("the replica to reach offset {target} (last {got:?})")
        })
        .await
    }
}

impl Drop for RedisReplicaPair {
    fn drop(&mut self) {
        kill_now([&self.primary.core, &self.replica.core]);
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$3\r\nfoo` or the nil bulk string `$-1` (`None`).
    Bulk(Option<Vec<u8>>),
    /// `*2…` or the nil array `*-1` (`None`).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// True for `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Resp::Simple(s) if s == "OK")
    }

    /// True for a nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }

    /// The text of a simple string or bulk string (lossy UTF-8).
    pub fn as_text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// The value of an integer reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Integer(i) => Some(*i),
            _ => None,
        }
    }
}

/// One field of an `INFO` reply.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// A plain connection speaking RESP2, for tests and readiness checks.
#[derive(Debug)]
pub struct RespConnection {
    stream: TcpStream,
    addr: SocketAddr,
    buf: Vec<u8>,
}

impl RespConnection {
    /// Connect (unbounded: wrap in a timeout if the target may hang).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(addr: SocketAddr) -> Result<RespConnection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RespConnection {
            stream,
            addr,
            buf: Vec::new(),
        })
    }

    /// Send one command and read its reply. An `-ERR` reply is returned as
    /// [`Resp::Error`], not as an `Err`. Unbounded: wrap in a timeout if the server may
    /// hang.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call can leave a reply in flight; drop the connection.
    pub async fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Resp> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&req).await?;
        loop {
            match parse(&self.buf) {
                Ok(Some((resp, used))) => {
                    self.buf.drain(..used);
                    return Ok(resp);
                }
                Ok(None) => {}
                Err(detail) => {
                    return Err(ServerError::Protocol {
                        what: format!("redis {}", self.addr),
                        detail,
                    })
                }
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(ServerError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("redis {} closed the connection", self.addr),
                )));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Run one command on a fresh connection. Unbounded: wrap in a timeout if the server may
/// hang.
///
/// # Cancel safety
/// Cancel safe in that nothing is left behind, but the command may or may not have run.
pub async fn command<A: AsRef<[u8]>>(addr: SocketAddr, args: &[A]) -> Result<Resp> {
    RespConnection::connect(addr).await?.command(args).await
}

/// `PING` on a fresh connection; `Ok` only for `+PONG`. Unbounded: wrap in a timeout if the
/// server may hang.
///
/// # Cancel safety
/// Cancel safe.
pub async fn ping(addr: SocketAddr) -> Result<()> {
    match command(addr, &["PING"]).await? {
        Resp::Simple(s) if s == "PONG" => Ok(()),
        other => Err(ServerError::Protocol {
            what: format!("redis {addr}"),
            detail: format!("PING answered {other:?}"),
        }),
    }
}

/// Parse one reply from the front of `buf`: `Ok(None)` if incomplete.
fn parse(buf: &[u8]) -> std::result::Result<Option<(Resp, usize)>, String> {
    let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = buf[..line_end].split_first() else {
        return Err("empty line".into());
    };
    let line = std::str::from_utf8(line).map_err(|e| e.to_string())?;
    let after = line_end + 2;
    let int = || {
        line.parse::<i64>()
            .map_err(|e| format!("bad length/integer {line:?}: {e}"))
    };
    Ok(Some(match kind {
        b'+' => (Resp::Simple(line.to_owned()), after),
        b'-' => (Resp::Error(line.to_owned()), after),
        b':' => (Resp::Integer(int()?), after),
        b'$' => {
            let Ok(len) = usize::try_from(int()?) else {
                return Ok(Some((Resp::Bulk(None), after)));
            };
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            (
                Resp::Bulk(Some(buf[after..after + len].to_vec())),
                after + len + 2,
            )
        }
        b'*' => {
            let Ok(len) = usize::try_from(int()?) else {
                return Ok(Some((Resp::Array(None), after)));
            };
            let mut items = Vec::with_capacity(len.min(1024));
            let mut pos = after;
            for _ in 0..len {
                match parse(&buf[pos..])? {
                    Some((item, used)) => {
                        items.push(item);
                        pos += used;
                    }
                    None => return Ok(None),
                }
            }
            (Resp::Array(Some(items)), pos)
        }
        other => return Err(format!("unknown reply type {:?}", other as char)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replies() {
        assert_eq!(
            parse(b"+PONG\r\n"),
            Ok(Some((Resp::Simple("PONG".into()), 7)))
        );
        assert_eq!(parse(b"+PON"), Ok(None));
        assert_eq!(parse(b"$-1\r\n"), Ok(Some((Resp::Bulk(None), 5))));
        assert_eq!(parse(b"$3\r\nfo"), Ok(None));
        assert_eq!(
            parse(b"*2\r\n:1\r\n$1\r\nx\r\n"),
            Ok(Some((
                Resp::Array(Some(vec![
                    Resp::Integer(1),
                    Resp::Bulk(Some(b"x".to_vec()))
                ])),
                15
            )))
        );
        assert_eq!(
            info_field("# Replication\r\nrole:slave\r\n", "role"),
            Some("slave")
        );
    }
}
