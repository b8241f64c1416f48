//! ZooKeeper: a standalone server or a 3-node ensemble on loopback ports.
//!
//! Servers run `java -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
//! org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg` (the jar's manifest pulls in
//! jute, netty, slf4j-api and the rest; set `TENURE_ZK_CLASSPATH` to override) with a small
//! heap, the admin server off, and every four-letter word enabled. Readiness is `ruok` →
//! `imok` and `srvr` reporting `Mode: standalone`, `leader` or `follower`.
//!
//! Sessions expire between 2 and 20 × `tickTime`; use a short
//! [`tick_time_ms`](ZkOptions::tick_time_ms) (e.g. 200) for fast expiry and fast failure
//! detection in an ensemble (`syncLimit` is 5 ticks, `initLimit` 10).
//!
//! For partitions between members, start an ensemble with
//! [`peer_proxies`](ZkOptions::peer_proxies): each server's `zoo.cfg` then names every
//! *other* member through a [`FaultProxy`] of its own (one per ordered pair and port, quorum
//! and election), so all member-to-member traffic — each TCP connection goes through the
//! proxy of the server that opened it — can be cut with
//! [`isolate`](ZkEnsemble::isolate) and restored with [`heal`](ZkEnsemble::heal), while
//! client ports stay direct. ([`sync_limit_ticks`](ZkOptions::sync_limit_ticks) sets how
//! long a cut-off follower keeps serving before it notices.)
//!
//! A [secured](ZkOptions::secured) server gives clients a secure client port only (TLS
//! with client certificates, Netty); a plain port stays open on loopback for the
//! harness's own four-letter-word probes.
//!
//! The JVM reads the clock without libc: the [clock shim](tenure_conformance::clock_shim) cannot shift
//! it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tenure_conformance::proxy::{FaultProxy, ProxyMode, ProxyStats};
use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::tls::{write_private, TestSecrets};
use tenure_conformance::servers::{
    find_binary, free_port, impl_node, kill_now, loopback, node_control_methods, poll_until,
    retry_on_port_clash, NodeCore, Result, ServerError,
};

const INSTALL: &str = "apt-get install -y zookeeper";
const JAVA_INSTALL: &str = "apt-get install -y default-jre-headless";
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_BINDING: &str = "/usr/share/java/slf4j-simple.jar";
const NETTY_CODEC: &str = "/usr/share/java/netty-codec.jar";
/// Environment variable overriding the ZooKeeper classpath.
pub const CLASSPATH_ENV: &str = "TENURE_ZK_CLASSPATH";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(1);

/// Options for [`ZkEnsemble::start`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkOptions {
    /// Number of servers: 1 (standalone) or 3 (default 1).
    pub nodes: usize,
    /// `tickTime` in milliseconds (default 2000). Session timeouts are bounded to
    /// 2–20 ticks.
    pub tick_time_ms: u32,
    /// `syncLimit` in ticks (default 5): how long a follower cut off from its leader keeps
    /// serving clients before it gives up on the leader (and the leader on it).
    pub sync_limit_ticks: u32,
    /// Route member-to-member traffic through fault proxies (default off), so that
    /// [`ZkEnsemble::isolate`] can partition a member.
    pub peer_proxies: bool,
    /// Clients get a TLS port requiring client certificates (default off): see
    /// [`ZkOptions::secured`].
    pub secured: bool,
    /// How often the servers remove emptied container nodes, in milliseconds
    /// (`znode.container.checkIntervalMs`; ZooKeeper's default, 60000).
    pub container_check_ms: u32,
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            nodes: 1,
            tick_time_ms: 2000,
            sync_limit_ticks: 5,
            peer_proxies: false,
            secured: false,
            container_check_ms: 60_000,
        }
    }
}

impl ZkOptions {
    /// Set the number of servers.
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    /// Set `tickTime` in milliseconds.
    pub fn tick_time_ms(mut self, ms: u32) -> Self {
        self.tick_time_ms = ms;
        self
    }

    /// Set `syncLimit` in ticks.
    pub fn sync_limit_ticks(mut self, ticks: u32) -> Self {
        self.sync_limit_ticks = ticks;
        self
    }

    /// Route member-to-member traffic through fault proxies (see [`ZkEnsemble::isolate`]).
    pub fn peer_proxies(mut self, on: bool) -> Self {
        self.peer_proxies = on;
        self
    }

    /// Servers whose client address ([`ZkNode::addr`]) is a `secureClientPort`: TLS only,
    /// with a certificate from a throwaway CA made now, and client certificates that CA
    /// signed required (`ssl.clientAuth=need`). The CA and two passwords (for `digest`
    /// users `tenure` and `stranger`, which ZooKeeper does not register: a digest identity
    /// is whatever `user:password` a client adds) are in [`ZkEnsemble::secrets`].
    pub fn secured(mut self) -> Self {
        self.secured = true;
        self
    }
}

/// What clients of a [secured](ZkOptions::secured) ensemble need: its CA and passwords
/// (through `Deref`), and the URLs that use them.
#[derive(Clone, Debug)]
pub struct ZkSecrets {
    users: TestSecrets,
}

impl std::ops::Deref for ZkSecrets {
    type Target = TestSecrets;

    fn deref(&self) -> &TestSecrets {
        &self.users
    }
}

impl ZkSecrets {
    /// A `zks://` URL of digest user `tenure` on chroot `/tenure` with the TLS options;
    /// `hosts` is `h:p,…` or a harness template's `{hosts}`.
    pub fn url(&self, hosts: &str) -> String {
        format!(
            "zks://tenure:{}@{hosts}/tenure?{}",
            self.password,
            self.tls_options()
        )
    }

    /// `zoo.cfg` lines for a secure client port on `port` with this CA: the server's
    /// certificate and key in one PEM key store, the CA as trust store.
    fn zoo_cfg(&self, port: u16, dir: &Path) -> Result<String> {
        let pki = &self.pki;
        let key_store = dir.join("server-keystore.pem");
        let pem = format!(
            "{}{}",
            std::fs::read_to_string(pki.server_key())?,
            std::fs::read_to_string(pki.server_cert())?
        );
        write_private(&key_store, &pem)?;
        Ok(format!(
            "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n",
            key_store.display(),
            pki.ca().display()
        ))
    }
}

/// A proxy carrying the connections server `from` opens to server `to` (indexes into
/// [`ZkEnsemble::nodes`]) on one of `to`'s quorum or election ports.
#[derive(Debug)]
struct PeerLink {
    from: usize,
    to: usize,
    proxy: FaultProxy,
}

/// One ZooKeeper server.
#[derive(Debug)]
pub struct ZkNode {
    core: NodeCore,
    id: u32,
    /// The plain client port the four-letter words go to (the client port itself unless
    /// secured).
    plain: SocketAddr,
}

impl_node!(ZkNode);

impl ZkNode {
    node_control_methods!();

    /// The server id (`myid`, from 1).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `127.0.0.1:<port>`, direct.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// Send a four-letter word (`ruok`, `srvr`, `mntr`, …) and return the reply, bounded
    /// by 1 s.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn four_letter(&self, word: &str) -> Result<String> {
        four_letter(self.plain, word).await
    }

    /// The `Mode:` reported by `srvr` (`standalone`, `leader`, `follower`), or `None` while
    /// the server is not serving (e.g. during an election).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn mode(&self) -> Result<Option<String>> {
        Ok(srvr_mode(&self.four_letter("srvr").await?).map(str::to_owned))
    }
}

/// A ZooKeeper ensemble (or a standalone server). Dropping it kills every server and
/// deletes the data.
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<Arc<ZkNode>>,
    /// Member-to-member proxies (empty unless [`ZkOptions::peer_proxies`]).
    links: Vec<PeerLink>,
    secrets: Option<ZkSecrets>,
    dir: tempfile::TempDir,
}

impl ZkEnsemble {
    /// Start the servers and wait until each is serving (in an ensemble: a leader has been
    /// elected and every server has joined it).
    ///
    /// # Cancel safety
    /// Cancel safe: servers started so far are killed when the future is dropped.
    pub async fn start(options: ZkOptions) -> Result<ZkEnsemble> {
        if options.nodes == 0 || options.tick_time_ms == 0 || options.sync_limit_ticks == 0 {
            return Err(ServerError::Unsupported {
                what: format!("ZooKeeper needs at least one node and a tick: {options:?}"),
            });
        }
        retry_on_port_clash(|| Self::try_start(&options)).await
    }

    async fn try_start(options: &ZkOptions) -> Result<ZkEnsemble> {
        let java = find_binary("java", &[], JAVA_INSTALL)?;
        let classpath = classpath()?;
        let dir = tempfile::Builder::new().prefix("tenure-zk-").tempdir()?;
        let n = options.nodes;
        let ports = (0..n)
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect::<Result<Vec<(u16, u16, u16)>>>()?;
        let mut links = Vec::new();
        // `servers[i]`: the `server.N=` lines of member i's zoo.cfg. Its own entry is its
        // real ports (it binds them); with peer proxies, the others' go through proxies.
        let mut servers = vec![String::new(); n];
        if n > 1 {
            for (i, lines) in servers.iter_mut().enumerate() {
                for (j, &(_, quorum, election)) in ports.iter().enumerate() {
                    let (quorum, election) = if options.peer_proxies && i != j {
                        let via = |port| {
                            let link = FaultProxy::start(loopback(port));
                            async move { link.await.map(|proxy| (proxy.addr().port(), proxy)) }
                        };
                        let (q, q_proxy) = via(quorum).await?;
                        let (e, e_proxy) = via(election).await?;
                        for proxy in [q_proxy, e_proxy] {
                            links.push(PeerLink {
                                from: i,
                                to: j,
                                proxy,
                            });
                        }
                        (q, e)
                    } else {
                        (quorum, election)
                    };
                    lines.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", j + 1));
                }
            }
        }
        let secrets = match options.secured {
            true => Some(ZkSecrets {
                users: TestSecrets::generate(&dir.path().join("pki"))?,
            }),
            false => None,
        };
        let mut ensemble = ZkEnsemble {
            nodes: Vec::with_capacity(n),
            links,
            secrets,
            dir,
        };
        for (i, &(plain, _, _)) in ports.iter().enumerate() {
            let id = u32::try_from(i + 1).map_err(|_| ServerError::Unsupported {
                what: "too many ZooKeeper nodes".into(),
            })?;
            let root = ensemble.dir.path();
            let data = root.join(format!("zk{id}"));
            std::fs::create_dir_all(&data)?;
            std::fs::write(data.join("myid"), format!("{id}\n"))?;
            let cfg = root.join(format!("zoo{id}.cfg"));
            let (client, secure) = match &ensemble.secrets {
                Some(secrets) => {
                    let port = free_port()?;
                    (port, secrets.zoo_cfg(port, &data)?)
                }
                None => (plain, String::new()),
            };
            std::fs::write(
                &cfg,
                format!(
                    "tickTime={tick}\ninitLimit=10\nsyncLimit={sync}\ndataDir={data}\n\
                     clientPort={plain}\nclientPortAddress=127.0.0.1\n\
                     admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n\
                     {secure}{servers}",
                    servers = servers[i],
                    tick = options.tick_time_ms,
                    sync = options.sync_limit_ticks,
                    data = data.display(),
                ),
            )?;
            let addr = loopback(client);
            let plain = loopback(plain);
            let spec = CommandSpec::new(&java)
                .cwd(root)
                .arg("-Xmx256m")
                .arg("-Xms32m")
                .arg("-XX:+UseSerialGC")
                .arg("-XX:TieredStopAtLevel=1")
                // No /tmp/hsperfdata_<user>/<pid> file left behind by a SIGKILLed JVM.
                .arg("-XX:-UsePerfData")
                .arg("-Djava.net.preferIPv4Stack=true")
                .arg("-Dzookeeper.admin.enableServer=false")
                .arg("-Dzookeeper.preAllocSize=1024")
                .arg(format!(
                    "-Dznode.container.checkIntervalMs={}",
                    options.container_check_ms
                ))
                .arg("-cp")
                .arg(&classpath)
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(&cfg);
            let probe: Probe = Arc::new(move |_| Box::pin(serving(plain)));
            let process = ServerProcess::new(
                format!("zookeeper {id} on {addr}"),
                spec,
                root.join(format!("zk{id}.log")),
                READY_TIMEOUT,
                addr,
                probe,
            );
            let node = ZkNode {
                core: NodeCore::new(process).await?,
                id,
                plain,
            };
            node.core.process.spawn()?;
            ensemble.nodes.push(Arc::new(node));
        }
        futures::future::try_join_all(ensemble.nodes.iter().map(|n| n.core.process.wait_ready()))
            .await?;
        Ok(ensemble)
    }

    /// The servers, in id order (index 0 has id 1).
    pub fn nodes(&self) -> &[Arc<ZkNode>] {
        &self.nodes
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,…`, direct.
    pub fn connect_string(&self) -> String {
        join(self.nodes.iter().map(|n| n.addr()))
    }

    /// The same through each server's fault proxy.
    pub fn proxied_connect_string(&self) -> String {
        join(self.nodes.iter().map(|n| n.proxied_addr()))
    }

    /// Cuts every member-to-member link of server `index` (into [`nodes`](Self::nodes)),
    /// both directions, quorum and election: the rest of the ensemble and it can no longer
    /// hear each other (connections stay open, bytes are dropped), while its client port
    /// still answers. Needs [`ZkOptions::peer_proxies`].
    pub fn isolate(&self, index: usize) -> Result<()> {
        self.set_links(index, ProxyMode::Blackhole)
    }

    /// Restores every member-to-member link (undoes [`isolate`](Self::isolate)).
    pub fn heal(&self) {
        for link in &self.links {
            link.proxy.set_mode(ProxyMode::Pass);
        }
    }

    /// The counters of server `index`'s member-to-member links, summed over both
    /// directions (e.g. `bytes_blackholed` shows an isolation dropped traffic). Needs
    /// [`ZkOptions::peer_proxies`].
    pub fn peer_link_stats(&self, index: usize) -> Result<ProxyStats> {
        let mut sum = ProxyStats::default();
        for link in self.links_of(index)? {
            let s = link.proxy.stats();
            sum.accepted += s.accepted;
            sum.active += s.active;
            sum.resets += s.resets;
            sum.connect_failures += s.connect_failures;
            sum.bytes_up += s.bytes_up;
            sum.bytes_down += s.bytes_down;
            sum.bytes_blackholed += s.bytes_blackholed;
        }
        Ok(sum)
    }

    fn set_links(&self, index: usize, mode: ProxyMode) -> Result<()> {
        for link in self.links_of(index)? {
            link.proxy.set_mode(mode);
        }
        Ok(())
    }

    fn links_of(&self, index: usize) -> Result<impl Iterator<Item = &PeerLink>> {
        if self.links.is_empty() || index >= self.nodes.len() {
            return Err(ServerError::Unsupported {
                what: format!(
                    "member {index} of a {}-node ensemble has no peer proxies \
                     (start it with ZkOptions::peer_proxies)",
                    self.nodes.len()
                ),
            });
        }
        Ok(self
            .links
            .iter()
            .filter(move |l| l.from == index || l.to == index))
    }

    /// The CA and passwords of a [secured](ZkOptions::secured) ensemble.
    pub fn secrets(&self) -> Option<&ZkSecrets> {
        self.secrets.as_ref()
    }

    /// The temporary directory holding every server's config, data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Index (into [`nodes`](Self::nodes)) of the server reporting `Mode: leader` (or
    /// `standalone`). Waits up to 30 s, e.g. while an election is running.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn leader_index(&self) -> Result<usize> {
        let leading = || async {
            let modes = futures::future::join_all(self.nodes.iter().map(|n| async move {
                if n.is_running() && !n.is_paused() {
                    n.mode().await.ok().flatten()
                } else {
                    None
                }
            }))
            .await;
            modes
                .iter()
                .position(|m| matches!(m.as_deref(), Some("leader" | "standalone")))
                .ok_or(modes)
        };
        poll_until(
            LEADER_TIMEOUT,
            Duration::from_millis(50),
            leading,
            |modes| format!("a ZooKeeper leader (modes {modes:?})"),
        )
        .await
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        kill_now(self.nodes.iter().map(|n| &n.core));
    }
}

fn join(addrs: impl Iterator<Item = SocketAddr>) -> String {
    addrs.map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

fn classpath() -> Result<String> {
    if let Some(cp) = std::env::var_os(CLASSPATH_ENV).filter(|cp| !cp.is_empty()) {
        return Ok(cp.to_string_lossy().into_owned());
    }
    if !Path::new(ZK_JAR).is_file() {
        return Err(ServerError::MissingBinary {
            binary: ZK_JAR.into(),
            install: INSTALL.into(),
        });
    }
    let mut cp = vec![PathBuf::from(ZK_JAR)];
    // Without a binding slf4j logs nothing (and says so); with slf4j-simple the log goes
    // to stderr, which is captured.
    if Path::new(SLF4J_BINDING).is_file() {
        cp.push(SLF4J_BINDING.into());
    }
    // Debian's zookeeper.jar manifest leaves out netty-codec, which the Netty connection
    // factory of a secure client port needs (the package that ships the jar is installed
    // with zookeeper).
    if Path::new(NETTY_CODEC).is_file() {
        cp.push(NETTY_CODEC.into());
    }
    Ok(cp
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":"))
}

fn srvr_mode(srvr: &str) -> Option<&str> {
    srvr.lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(str::trim)
}

async fn serving(addr: SocketAddr) -> Result<bool> {
    if four_letter(addr, "ruok").await?.trim() != "imok" {
        return Ok(false);
    }
    Ok(matches!(
        srvr_mode(&four_letter(addr, "srvr").await?),
        Some("standalone" | "leader" | "follower")
    ))
}

async fn four_letter(addr: SocketAddr, word: &str) -> Result<String> {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, ServerError>(out)
    };
    tokio::time::timeout(FOUR_LETTER_TIMEOUT, exchange)
        .await
        .map_err(|_| ServerError::Timeout {
            what: format!("zookeeper {addr} to answer {word}"),
        })?
}
