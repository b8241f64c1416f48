//! Real servers on loopback ports, for tests, and the kit a backend's launcher is built
//! from ([`process`], [`NodeCore`], [`impl_node!`](crate::servers::impl_node),
//! [`free_port`], [`find_binary`], [`run_as`], [`tls`]). The launchers themselves are in each
//! backend's `lab` module (feature `testbed`): `tenure_redis::lab::RedisCluster`,
//! `tenure_etcd::lab::EtcdCluster`, and so on.
//!
//! Every server is started from the installed binaries on free `127.0.0.1` ports, with its
//! data and log files in a [`tempfile::TempDir`] owned by the cluster handle. Each node can
//! be killed (`SIGKILL`), paused (`SIGSTOP`/`SIGCONT`), restarted on the same port and data
//! dir, and reached directly or through its own [`FaultProxy`](crate::proxy::FaultProxy).
//!
//! Every process is started in its own process group; signals go to that group and to
//! every descendant that left it (Postgres backends call `setsid()`), so helpers a server
//! forks are stopped with it, and a kill waits until they are gone. Cluster handles kill
//! everything they started when dropped, also while unwinding from a panic.
//! [`spawned_pids`] lists the processes started through this kit that are still alive, so a test
//! can check that none outlive their handles.
//!
//! A missing binary is reported as [`ServerError::MissingBinary`], naming the `apt-get`
//! command that installs it.

use std::collections::HashSet;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

mod oneshot;
pub mod process;
pub mod tls;
mod user;

pub use oneshot::run_once;
pub use process::{pid_alive, spawned_pids};
pub use user::{give_to, run_as};

#[doc(hidden)]
pub use async_trait::async_trait;

/// Errors from starting or controlling a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A required program is not installed.
    #[error("{binary} not found: install it with `{install}`")]
    MissingBinary {
        /// The program (or jar) that was looked for.
        binary: String,
        /// The command that installs it.
        install: String,
    },
    /// A server did not start or did not become ready; `detail` includes the tail of its log.
    #[error("failed to start {what}: {detail}")]
    Start {
        /// Which server.
        what: String,
        /// Why, with the tail of the server's log where there is one.
        detail: String,
    },
    /// Waiting for a condition (a leader, a replica catching up, …) ran out of time.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
    },
    /// The operation needs a running process, and this one is not running.
    #[error("{what} is not running")]
    NotRunning {
        /// Which server.
        what: String,
    },
    /// A server answered something this harness did not expect.
    #[error("unexpected reply from {what}: {detail}")]
    Protocol {
        /// Which server.
        what: String,
        /// What was wrong with the reply.
        detail: String,
    },
    /// The operation needs an option that this server was not started with.
    #[error("{what}")]
    Unsupported {
        /// What is not supported, and how to enable it.
        what: String,
    },
    /// Compiling the clock shim failed.
    #[error("compiling the clock shim failed: {detail}")]
    ShimBuild {
        /// Compiler output.
        detail: String,
    },
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, ServerError>;

/// Asks `probe` every `every` until it answers `Ok`, for up to `limit` (at least once):
/// its `Err` is the state that is not there yet. Past `limit`, a
/// [`ServerError::Timeout`] waiting for `what(last state)`.
///
/// # Cancel safety
/// As cancel-safe as one `probe`.
pub async fn poll_until<T, S, Fut>(
    limit: std::time::Duration,
    every: std::time::Duration,
    mut probe: impl FnMut() -> Fut,
    what: impl FnOnce(S) -> String,
) -> Result<T>
where
    Fut: std::future::Future<Output = std::result::Result<T, S>>,
{
    let deadline = std::time::Instant::now() + limit;
    loop {
        let state = match probe().await {
            Ok(done) => return Ok(done),
            Err(state) => state,
        };
        if std::time::Instant::now() >= deadline {
            return Err(ServerError::Timeout { what: what(state) });
        }
        tokio::time::sleep(every).await;
    }
}

impl From<nix::errno::Errno> for ServerError {
    fn from(e: nix::errno::Errno) -> Self {
        ServerError::Io(e.into())
    }
}

impl ServerError {
    /// True when a start failed because a port was already taken (another process grabbed
    /// a port between our probe and the server's bind); starts are retried on fresh ports.
    fn is_port_clash(&self) -> bool {
        match self {
            ServerError::Start { detail, .. } => {
                let d = detail.to_ascii_lowercase();
                d.contains("address already in use") || d.contains("addrinuse")
            }
            _ => false,
        }
    }
}

/// Ports handed out by [`free_port`] in this process, never handed out twice.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Port 2024 is taken on the project's machines; never hand it out.
const FORBIDDEN_PORT: u16 = 2024;

/// A free loopback TCP port for a server, never 2024 and never one already handed out by
/// this process. It is taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where no outgoing connection can take it while its
/// server is down: a killed member's port would otherwise be reused as the local port of
/// some connection (the fault proxies open many) and its restart fail to bind (ZooKeeper
/// exits with status 14). Falls back to a kernel-chosen port if that range is unusable.
pub fn free_port() -> Result<u16> {
    let (low, _) = ephemeral_range();
    let below = 10_000u16..low.max(10_000);
    if below.len() >= 1024 {
        // A start that differs between processes, so that concurrent harnesses rarely try
        // the same ports; each candidate is checked by binding it.
        let span = below.len();
        let seed = std::process::id() as usize
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as usize);
        for i in 0..span.min(4096) {
            let port = below.start + ((seed + i * 7919) % span) as u16;
            if port == FORBIDDEN_PORT
                || TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_err()
            {
                continue;
            }
            if hand_out(port) {
                return Ok(port);
            }
        }
    }
    for _ in 0..64 {
        let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        let port = l.local_addr()?.port();
        drop(l);
        if port != FORBIDDEN_PORT && hand_out(port) {
            return Ok(port);
        }
    }
    Err(ServerError::Io(std::io::Error::other(
        "could not find a free loopback port",
    )))
}

/// Records `port` as handed out; false if it already was, by this process or (see
/// [`reserve_across_processes`]) by another one alive.
fn hand_out(port: u16) -> bool {
    let mut set = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let set = set.get_or_insert_with(HashSet::new);
    if set.contains(&port) || !reserve_across_processes(port) {
        return false;
    }
    set.insert(port)
}

/// The ports this process reserved for other processes to see: an exclusive `flock` on
/// `$TMPDIR/tenure-ports/<port>`, held until this process exits (the kernel drops it then,
/// also on a crash). Harnesses in test executables run side by side thus never hand out
/// one port twice, even while its server is down for a fault (a stopped member's port,
/// free to bind, stays its own). The files are left in place: removing one could let two
/// processes lock different files of one name. Where the directory cannot be used, only
/// this process's own record applies.
static RESERVED: Mutex<Vec<Flock<File>>> = Mutex::new(Vec::new());

/// Takes `port`'s lock file (see [`RESERVED`]); false if another live process holds it.
fn reserve_across_processes(port: u16) -> bool {
    let dir = std::env::temp_dir().join("tenure-ports");
    let file = std::fs::create_dir_all(&dir).and_then(|()| {
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
    });
    let Ok(file) = file else {
        return true;
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            RESERVED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(lock);
            true
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => false,
        Err(_) => true,
    }
}

/// The kernel's ephemeral port range (Linux's default if it cannot be read).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut parts = text.split_whitespace().map(str::parse::<u16>);
            Some((parts.next()?.ok()?, parts.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999))
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Run `start` up to three times while it fails with a port clash.
pub async fn retry_on_port_clash<T, F, Fut>(mut start: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match start().await {
            Err(e) if attempt < 3 && e.is_port_clash() => {
                tracing::warn!(error = %e, "port clash while starting a server; retrying");
            }
            other => return other,
        }
    }
}

/// Find `name` in `PATH`, else in the first existing of `extra_dirs`.
pub fn find_binary(name: &str, extra_dirs: &[PathBuf], install: &str) -> Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .iter()
        .chain(extra_dirs)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| ServerError::MissingBinary {
            binary: name.to_owned(),
            install: install.to_owned(),
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Generates the node-control methods shared by every node type (`kill`, `pause`,
/// `restart`, `addr`, `proxy`, `log_tail`, …) inside its `impl` block, delegating to the
/// node's `core: NodeCore` field.
#[doc(hidden)]
#[macro_export]
macro_rules! __node_control_methods {
    () => {
        /// Kill the server with `SIGKILL` (its whole process group) and reap it. Does nothing
        /// when it is not running.
        ///
        /// # Cancel safety
        /// Cancel safe: the signal is sent before the first await; a cancelled reap is
        /// finished in the background by tokio.
        pub async fn kill(&self) -> $crate::servers::Result<()> {
            self.core.process.kill().await
        }

        /// Freeze the server with `SIGSTOP` (its whole process group and helpers that left
        /// it); returns once the processes are stopped. Its sockets stay open; clients see
        /// timeouts rather than errors.
        pub fn pause(&self) -> $crate::servers::Result<()> {
            self.core.process.pause()
        }

        /// Unfreeze the server with `SIGCONT`; returns once no process is stopped.
        pub fn resume(&self) -> $crate::servers::Result<()> {
            self.core.process.resume()
        }

        /// Kill the server if it is running, start it again on the same port and data dir
        /// and wait until it is ready.
        ///
        /// # Cancel safety
        /// Not cancel safe: cancelled midway, the server may be left stopped or starting.
        pub async fn restart(&self) -> $crate::servers::Result<()> {
            self.core.restart().await
        }

        /// PID of the running server process (its process-group leader), if running.
        pub fn pid(&self) -> Option<u32> {
            self.core.process.pid()
        }

        /// True while the server process is alive (also while it is paused).
        pub fn is_running(&self) -> bool {
            self.core.process.is_running()
        }

        /// True while the server is paused with [`pause`](Self::pause) (the harness's
        /// record; [`state`](Self::state) observes it).
        pub fn is_paused(&self) -> bool {
            self.core.process.is_paused()
        }

        /// The server process's state from `/proc/<pid>/stat` (`T` while stopped), if
        /// running.
        pub fn state(&self) -> Option<char> {
            self.pid()
                .and_then($crate::servers::process::stat)
                .map(|s| s.state)
        }

        /// Direct address of the server's client port (a restart may move it to another
        /// port when its own was taken; the [proxy](Self::proxy) follows).
        pub fn addr(&self) -> std::net::SocketAddr {
            self.core.addr()
        }

        /// The fault proxy in front of this node; started with the node and stable across
        /// restarts.
        pub fn proxy(&self) -> &$crate::proxy::FaultProxy {
            &self.core.proxy
        }

        /// Address of the fault proxy in front of this node.
        pub fn proxied_addr(&self) -> std::net::SocketAddr {
            self.core.proxy.addr()
        }

        /// The file that the server's stdout and stderr are appended to.
        pub fn log_path(&self) -> &std::path::Path {
            self.core.process.log_path()
        }

        /// The last `max_bytes` of the server's log, for diagnostics.
        pub fn log_tail(&self, max_bytes: usize) -> String {
            $crate::servers::process::log_tail(self.core.process.log_path(), max_bytes)
        }
    };
}
#[doc(inline)]
pub use crate::__node_control_methods as node_control_methods;

/// `nodes` as the trait objects fault code takes.
pub fn dyn_nodes<N: Node + 'static>(nodes: &[Arc<N>]) -> Vec<Arc<dyn Node>> {
    nodes.iter().map(|n| n.clone() as Arc<dyn Node>).collect()
}

/// Process control every server node offers, so a fault scenario can be written once for
/// all backends (`Arc<dyn Node>`).
#[async_trait::async_trait]
pub trait Node: Send + Sync + std::fmt::Debug {
    /// What this node is, for reports (`redis on 127.0.0.1:6379`).
    fn label(&self) -> String;
    /// Direct address of the client port.
    fn addr(&self) -> SocketAddr;
    /// `SIGKILL` (see the node type's `kill`).
    ///
    /// # Cancel safety
    /// The signal is sent before the first await.
    async fn kill(&self) -> Result<()>;
    /// `SIGSTOP`.
    fn pause(&self) -> Result<()>;
    /// `SIGCONT`.
    fn resume(&self) -> Result<()>;
    /// Kill if running, start again on the same data, wait until ready.
    ///
    /// # Cancel safety
    /// Not cancel safe: the node may be left stopped.
    async fn restart(&self) -> Result<()>;
    /// True while the process is alive (also while paused).
    fn is_running(&self) -> bool;
    /// PID of the running server process (its process-group leader), if running.
    fn pid(&self) -> Option<u32>;
    /// The server process's state from `/proc/<pid>/stat` (`T` while stopped), if running:
    /// evidence a pause took effect.
    fn state(&self) -> Option<char> {
        self.pid().and_then(process::stat).map(|s| s.state)
    }
    /// True while paused with [`pause`](Self::pause).
    fn is_paused(&self) -> bool;
    /// Runs the server's readiness probe once (the one a start waits on): `Ok` when the
    /// server answers.
    ///
    /// # Cancel safety
    /// Cancel safe (it only observes).
    async fn probe(&self) -> Result<()>;
    /// Evidence from the clock shim: the last offset (ms) the server process read from its
    /// offset file, and that process's pid. `None` without the shim, or before the process
    /// first read the clock.
    fn clock_applied(&self) -> Option<(i64, u32)> {
        None
    }
    /// Shifts the node's wall clock by `offset_ms` (0 undoes it). Only redis-server, postgres
    /// and mariadb nodes started with the clock shim support it; others are
    /// [`ServerError::Unsupported`].
    fn set_clock_offset(&self, offset_ms: i64) -> Result<()>;
}

/// Implements [`Node`] for a node type with a `core: NodeCore` field, delegating to the
/// methods of [`node_control_methods`]; `clock` says how to shift its clock and `applied`
/// reads the clock shim's evidence.
#[doc(hidden)]
#[macro_export]
macro_rules! __impl_node {
    ($ty:ty) => {
        $crate::servers::impl_node!($ty, |node: &$ty, _offset_ms: i64| {
            Err($crate::servers::ServerError::Unsupported {
                what: format!(
                    "{}: the clock shim works for redis-server, postgres and mariadb only (Go and the \
                     JVM read the clock without libc)",
                    node.core.process.what()
                ),
            })
        });
    };
    ($ty:ty, $clock:expr) => {
        $crate::servers::impl_node!($ty, $clock, |_: &$ty| None);
    };
    ($ty:ty, $clock:expr, $applied:expr) => {
        #[$crate::servers::async_trait]
        impl $crate::servers::Node for $ty {
            fn label(&self) -> String {
                self.core.process.what().to_owned()
            }
            fn addr(&self) -> std::net::SocketAddr {
                self.core.addr()
            }
            async fn kill(&self) -> $crate::servers::Result<()> {
                self.core.process.kill().await
            }
            fn pause(&self) -> $crate::servers::Result<()> {
                self.core.process.pause()
            }
            fn resume(&self) -> $crate::servers::Result<()> {
                self.core.process.resume()
            }
            async fn restart(&self) -> $crate::servers::Result<()> {
                self.core.restart().await
            }
            fn is_running(&self) -> bool {
                self.core.process.is_running()
            }
            fn pid(&self) -> Option<u32> {
                self.core.process.pid()
            }
            fn is_paused(&self) -> bool {
                self.core.process.is_paused()
            }
            async fn probe(&self) -> $crate::servers::Result<()> {
                self.core.process.probe_once().await
            }
            fn clock_applied(&self) -> Option<(i64, u32)> {
                ($applied)(self)
            }
            fn set_clock_offset(&self, offset_ms: i64) -> $crate::servers::Result<()> {
                ($clock)(self, offset_ms)
            }
        }
    };
}
#[doc(inline)]
pub use crate::__impl_node as impl_node;

/// State shared by every node type: the managed process, its client address and the fault
/// proxy in front of it.
#[derive(Debug)]
pub struct NodeCore {
    /// The server process.
    pub process: process::ServerProcess,
    /// The fault proxy in front of its client port.
    pub proxy: crate::proxy::FaultProxy,
}

impl NodeCore {
    /// A core for `process`, with a fresh proxy in front of its address. Does not start
    /// the process.
    pub async fn new(process: process::ServerProcess) -> Result<Self> {
        let proxy = crate::proxy::FaultProxy::start(process.addr()).await?;
        Ok(NodeCore { process, proxy })
    }

    /// The process's current client address.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// Restarts the process (on a fresh port if its own was taken) and points the proxy
    /// at wherever it listens now.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    pub async fn restart(&self) -> Result<()> {
        let result = self.process.restart().await;
        self.proxy.set_target(self.process.addr());
        result
    }
}

/// Kill every process among `cores` without awaiting (for `Drop`).
pub fn kill_now<'a>(cores: impl IntoIterator<Item = &'a NodeCore>) {
    for c in cores {
        c.process.kill_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another process opening a handed-out port's lock file cannot take it (a second
    /// open file description in this process stands in for that process).
    #[test]
    fn a_handed_out_port_is_locked_for_other_processes() {
        let port = free_port().unwrap();
        let path = std::env::temp_dir()
            .join("tenure-ports")
            .join(port.to_string());
        let other = Flock::lock(File::open(&path).unwrap(), FlockArg::LockExclusiveNonblock);
        assert!(
            matches!(other, Err((_, nix::errno::Errno::EWOULDBLOCK))),
            "{} is not locked",
            path.display()
        );
    }

    #[test]
    fn missing_binary_names_the_install_command() {
        let e = find_binary(
            "tenure-no-such-binary",
            &[],
            "apt-get install -y redis-server",
        )
        .unwrap_err();
        assert!(matches!(e, ServerError::MissingBinary { .. }));
        assert_eq!(
            e.to_string(),
            "tenure-no-such-binary not found: install it with `apt-get install -y redis-server`"
        );
    }

    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let (low, _) = ephemeral_range();
        for _ in 0..20 {
            let port = free_port().unwrap();
            assert!(port < low, "{port} is in the ephemeral range from {low}");
        }
    }

    #[test]
    fn free_ports_are_distinct_and_never_2024() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(!distinct.contains(&FORBIDDEN_PORT));
    }

    #[test]
    fn port_clash_is_detected() {
        let e = ServerError::Start {
            what: "x".into(),
            detail: "bind: Address already in use".into(),
        };
        assert!(e.is_port_clash());
        assert!(!ServerError::Timeout { what: "x".into() }.is_port_clash());
    }
}
