//! Other recipes' real clients (kazoo, Curator, `etcdctl`, redis-py) in child processes,
//! for the tests that share a lock with them: a [`ForeignClient`] writes lines to the
//! child's stdin and reads lines from its stdout, and kills the child when dropped, even
//! on a panic. Its methods panic with the client's name on anything unexpected (they are
//! test steps).
//!
//! A *lock driver* holds one lock of its recipe and speaks a line protocol: it prints
//! `ready` once connected, answers `acquire MILLIS` with `acquired` or `timeout` and
//! `release` with `released` ([`ForeignClient::acquire`], [`ForeignClient::release`]).
//! [`PYTHON_LOCK`] is the driver of kazoo's and redis-py's locks.

use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tenure_api::{async_trait, LockError, LockKey};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The lock driver of Python recipes (`foreign/python_lock.py` in this crate): run as
/// `python_lock.py kazoo HOSTS SESSION_TIMEOUT_MS PATH [EXTRA_LOCK_PATTERN…]` or
/// `python_lock.py redis-py REDIS_URL NAME TIMEOUT_MS` (0: no expiry).
pub const PYTHON_LOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/foreign/python_lock.py");
/// A foreign client in a child process, driven a line at a time.
#[derive(Debug)]
pub struct ForeignClient {
    what: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ForeignClient {
    /// Starts `command` (stdin and stdout piped, stderr inherited) as the client `what`.
    ///
    /// # Panics
    /// If it cannot start (`./x test` installs every client the tests run).
    pub fn spawn(what: impl Into<String>, command: Command) -> Self {
        Self::try_spawn(what, command).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`spawn`](Self::spawn), or why it cannot start.
    pub fn try_spawn(what: impl Into<String>, mut command: Command) -> Result<Self, String> {
        let what = what.into();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| format!("{what}: cannot start (./x installs it): {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("{what}: no pipes"));
        };
        Ok(Self {
            what,
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// A lock driver (see the module docs) started by `command`, once it is `ready`; or
    /// why it did not start, or did not get ready within a minute.
    pub async fn lock_driver(what: impl Into<String>, command: Command) -> Result<Self, String> {
        let mut client = Self::try_spawn(what, command)?;
        let ready = tokio::time::timeout(Duration::from_secs(60), client.lines.next_line());
        match ready.await {
            Ok(Ok(Some(line))) if line == "ready" => Ok(client),
            Ok(Ok(Some(line))) => Err(format!("{}: {line}", client.what)),
            Ok(Ok(None)) => Err(format!(
                "{} exited: {:?}",
                client.what,
                client.child.wait().await
            )),
            Ok(Err(e)) => Err(format!("{}: {e}", client.what)),
            Err(_) => Err(format!("{}: not ready within a minute", client.what)),
        }
    }

    /// [`PYTHON_LOCK`] for `recipe` (`kazoo`, `redis-py`) with `args`, under Debian's
    /// `/usr/bin/python3` (where `python3-kazoo` and `python3-redis` install; it may not
    /// be the first `python3` on the PATH), once it is `ready`.
    pub async fn python_lock(recipe: &str, args: &[&str]) -> Result<Self, String> {
        let mut command = Command::new("/usr/bin/python3");
        command.arg(PYTHON_LOCK).arg(recipe).args(args);
        Self::lock_driver(format!("{recipe} {args:?}"), command).await
    }

    /// A lock driver's `acquire`: whether it is granted the lock within `wait`.
    pub async fn acquire(&mut self, wait: Duration) -> bool {
        self.send(&format!("acquire {}", wait.as_millis())).await;
        match self.line(wait + Duration::from_secs(30)).await.as_str() {
            "acquired" => true,
            "timeout" => false,
            other => panic!("{}: {other}", self.what),
        }
    }

    /// A lock driver's `release`.
    pub async fn release(&mut self) {
        self.send("release").await;
        let released = self.line(Duration::from_secs(10)).await;
        assert_eq!(released, "released", "{}", self.what);
    }

    /// The client's name, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Writes `line` to the client's stdin.
    pub async fn send(&mut self, line: &str) {
        let what = &self.what;
        let written = self.stdin.write_all(format!("{line}\n").as_bytes()).await;
        written.unwrap_or_else(|e| panic!("{what}: write {line:?}: {e}"));
        self.stdin
            .flush()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }

    /// The next line the client prints, if one comes `within`.
    ///
    /// # Panics
    /// If the client exits first.
    pub async fn line_within(&mut self, within: Duration) -> Option<String> {
        let what = &self.what;
        match tokio::time::timeout(within, self.lines.next_line()).await {
            Err(_) => None,
            Ok(Ok(Some(line))) => Some(line),
            Ok(Ok(None)) => panic!("{what} exited: {:?}", self.child.try_wait()),
            Ok(Err(e)) => panic!("{what}: {e}"),
        }
    }

    /// The next line the client prints, which must come `within`.
    pub async fn line(&mut self, within: Duration) -> String {
        match self.line_within(within).await {
            Some(line) => line,
            None => panic!("{}: no line within {within:?}", self.what),
        }
    }

    /// Asks the client to stop (SIGTERM to its process, by PID), as a service manager
    /// would: it lets go of what it holds and exits.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("a running client");
        let pid = Pid::from_raw(i32::try_from(pid).expect("a PID fits an i32"));
        kill(pid, Signal::SIGTERM).unwrap_or_else(|e| panic!("{}: SIGTERM: {e}", self.what));
    }

    /// Waits for the client to exit, at most `within`; whether it exited successfully.
    pub async fn exited(mut self, within: Duration) -> bool {
        let what = self.what.clone();
        let status = tokio::time::timeout(within, self.child.wait()).await;
        let status = status.unwrap_or_else(|_| panic!("{what}: still running after {within:?}"));
        status.unwrap_or_else(|e| panic!("{what}: {e}")).success()
    }

    /// Kills the client (SIGKILL) and waits for it: what it held stays until the server
    /// ends its session or lease.
    pub async fn kill(mut self) {
        let what = self.what.clone();
        self.child
            .kill()
            .await
            .unwrap_or_else(|e| panic!("{what}: kill: {e}"));
    }
}

/// Another recipe's lock, held by a real client of it: what the mixed-fleet fault
/// contends with.
#[async_trait]
pub trait ForeignLock: Send {
    /// The client, for messages.
    fn what(&self) -> String;

    /// Whether the client is granted the lock within `wait` (it gives up after).
    async fn acquire(&mut self, wait: Duration) -> bool;

    /// Lets go of the lock the client holds.
    async fn release(&mut self);
}

#[async_trait]
impl ForeignLock for ForeignClient {
    fn what(&self) -> String {
        self.what.clone()
    }

    async fn acquire(&mut self, wait: Duration) -> bool {
        ForeignClient::acquire(self, wait).await
    }

    async fn release(&mut self) {
        ForeignClient::release(self).await;
    }
}

/// Another recipe whose real client shares the backend's locks, as a testbed declares
/// it: for tenure's lock `key`, a client of the recipe contending for the same lock.
/// `Err` says why none can start (its client not installed, say).
pub type ForeignRecipe = std::sync::Arc<
    dyn Fn(LockKey) -> BoxFuture<'static, Result<Box<dyn ForeignLock>, String>> + Send + Sync,
>;

/// How a testbed makes its [`ForeignRecipe`] for the servers at `url` (plain ones: the
/// harness starts no foreign client with TLS), with the recipe's name.
pub type ForeignRecipeFn =
    fn(url: String) -> BoxFuture<'static, Result<(&'static str, ForeignRecipe), LockError>>;
