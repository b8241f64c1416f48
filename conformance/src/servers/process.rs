//! Process plumbing shared by every server kind: spawn into its own process group with the
//! log captured to a file, signal the group (kill, pause, resume), poll readiness with a
//! bound, and keep a process-wide registry of what was spawned.

use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Child;

use super::{Result, ServerError};

/// How often readiness is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on waiting for a stop or continue signal to take effect.
const SIGNAL_EFFECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on waiting for a killed server's helpers to exit.
const HELPERS_GONE_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of the log goes into an error message.
pub(super) const LOG_TAIL_BYTES: usize = 3000;

/// Process groups (leader PIDs) spawned through this kit in this process.
static SPAWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records the process group `pid` leads as started through this kit.
pub(super) fn register_spawned(pid: u32) {
    lock(&SPAWNED).push(pid);
}

/// The PIDs of processes started through this kit (servers and anything they forked) that are
/// still alive. Zombies count as dead. Empty once every cluster handle has been dropped.
pub fn spawned_pids() -> Vec<u32> {
    let mut groups = lock(&SPAWNED);
    let procs = scan_proc();
    let mut alive = Vec::new();
    groups.retain(|&g| {
        let members: Vec<u32> = procs
            .iter()
            .filter(|p| p.pgrp == g && p.live)
            .map(|p| p.pid)
            .collect();
        let keep = !members.is_empty();
        alive.extend(members);
        if keep {
            // Helpers that left the group (Postgres backends call `setsid()`).
            alive.extend(
                procs
                    .iter()
                    .filter(|p| p.live && p.pgrp != g && is_descendant(&procs, p.pid, g))
                    .map(|p| p.pid),
            );
        }
        keep
    });
    alive.sort_unstable();
    alive.dedup();
    alive
}

/// True if the process `pid`, or any process in the process group `pid`, is alive
/// (zombies count as dead). Use it with a node's [`pid`](super::Node::pid) recorded
/// earlier to check that a server and its helpers are gone.
pub fn pid_alive(pid: u32) -> bool {
    scan_proc()
        .iter()
        .any(|p| p.live && (p.pid == pid || p.pgrp == pid))
}

struct ProcInfo {
    pid: u32,
    ppid: u32,
    pgrp: u32,
    live: bool,
}

/// One process's line of `/proc/<pid>/stat`, the fields this module uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `T` (stopped), `t`, `Z` (zombie), `X`, …
    pub state: char,
    /// The parent's pid.
    pub ppid: u32,
    /// The process group.
    pub pgrp: u32,
    /// Clock ticks after boot: with the pid, it names one process across pid reuse.
    pub starttime: u64,
}

impl Stat {
    /// Neither a zombie nor dead.
    pub fn live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// `/proc/<pid>/stat`, `None` if the process is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid pgrp ..."; comm may contain spaces and parentheses.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        // Field 22 of the line; the 20th after the state.
        starttime: fields.get(19)?.parse().ok()?,
    })
}

/// `(pgrp, live)` of one process, `None` if it is gone.
fn proc_stat(pid: u32) -> Option<(u32, bool)> {
    stat(pid).map(|s| (s.pgrp, s.live()))
}

fn scan_proc() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let s = stat(pid)?;
            Some(ProcInfo {
                pid,
                ppid: s.ppid,
                pgrp: s.pgrp,
                live: s.live(),
            })
        })
        .collect()
}

/// The live descendants of `pid` (children, their children, …), with their start times.
/// Servers may fork helpers that leave the process group: Postgres backends call
/// `setsid()`, so signalling the postmaster's group misses them.
fn descendants(pid: u32) -> Vec<(u32, u64)> {
    let procs = scan_proc();
    let mut found: Vec<u32> = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent && p.live) {
            if !found.contains(&p.pid) {
                found.push(p.pid);
                frontier.push(p.pid);
            }
        }
    }
    found
        .into_iter()
        .filter_map(|p| Some((p, stat(p)?.starttime)))
        .collect()
}

/// Whether `pid` descends from `ancestor` in `procs`.
fn is_descendant(procs: &[ProcInfo], pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    for _ in 0..64 {
        let Some(p) = procs.iter().find(|p| p.pid == current) else {
            return false;
        };
        if p.ppid == ancestor {
            return true;
        }
        if p.ppid <= 1 {
            return false;
        }
        current = p.ppid;
    }
    false
}

/// Whether the process `pid` that started at `starttime` is still alive (not a zombie).
fn same_process_alive(pid: u32, starttime: u64) -> bool {
    stat(pid).is_some_and(|s| s.live() && s.starttime == starttime)
}

/// Sends `sig` to each of `procs` that is still the same process. Errors are ignored:
/// a process that is gone needs no signal.
fn signal_each(procs: &[(u32, u64)], sig: Signal) {
    for &(pid, starttime) in procs {
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        if same_process_alive(pid, starttime) {
            let _ = nix::sys::signal::kill(Pid::from_raw(raw), sig);
        }
    }
}

/// The last `max_bytes` of a log file (lossy UTF-8), or a note that it cannot be read.
pub fn log_tail(path: &Path, max_bytes: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max_bytes);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(e) => format!("(cannot read log {}: {e})", path.display()),
    }
}

/// The last `max_bytes` of a log file written after its first `since` bytes.
pub fn log_tail_since(path: &Path, since: u64, max_bytes: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let since = usize::try_from(since)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let start = bytes.len().saturating_sub(max_bytes).max(since);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(e) => format!("(cannot read log {}: {e})", path.display()),
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to its environment.
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory (default: this process's).
    pub cwd: Option<PathBuf>,
    /// `(uid, gid)` to run as.
    pub user: Option<(u32, u32)>,
}

impl CommandSpec {
    /// Runs `program` with no arguments.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        CommandSpec {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            user: None,
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Runs in `dir`.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs as `(uid, gid)` (default: as this process).
    pub fn user(mut self, user: Option<(u32, u32)>) -> Self {
        self.user = user;
        self
    }

    /// Remove every occurrence of the option `name` and the `values` arguments after it.
    pub fn remove_option(&mut self, name: &str, values: usize) {
        while let Some(i) = self.args.iter().position(|a| a == name) {
            let end = (i + 1 + values).min(self.args.len());
            self.args.drain(i..end);
        }
    }

    /// The command, in a process group of its own, its stdout and stderr appended to
    /// `log`, not killed when dropped.
    pub(super) fn command(&self, log: File) -> std::io::Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        Ok(cmd)
    }

    pub(super) fn display(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// A readiness probe of the server's current client address: `Ok(true)` when ready,
/// `Ok(false)` or an error while not yet.
pub type Probe = Arc<dyn Fn(SocketAddr) -> BoxFuture<'static, Result<bool>> + Send + Sync>;

#[derive(Default)]
struct State {
    child: Option<Child>,
    paused: bool,
}

/// One server process that can be started, killed, paused, resumed and restarted, with
/// its output appended to a log file.
pub struct ServerProcess {
    what: String,
    spec: Mutex<CommandSpec>,
    log: PathBuf,
    /// Length of the log when the current process was spawned: start errors show and
    /// classify only what this start wrote.
    log_start: Mutex<u64>,
    probe: Probe,
    ready_timeout: Duration,
    state: Mutex<State>,
    /// The client address (it changes when a restart finds its port taken).
    addr: Mutex<SocketAddr>,
    /// The option giving the port on the command line, if a restart may move the server
    /// to another port.
    port_option: Option<&'static str>,
}

impl fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerProcess")
            .field("what", &self.what)
            .field("pid", &self.pid())
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl ServerProcess {
    /// A process description; nothing is started yet.
    pub fn new(
        what: impl Into<String>,
        spec: CommandSpec,
        log: PathBuf,
        ready_timeout: Duration,
        addr: SocketAddr,
        probe: Probe,
    ) -> Self {
        ServerProcess {
            what: what.into(),
            spec: Mutex::new(spec),
            log,
            log_start: Mutex::new(0),
            probe,
            ready_timeout,
            state: Mutex::new(State::default()),
            addr: Mutex::new(addr),
            port_option: None,
        }
    }

    /// Lets [`restart`](Self::restart) move the server to a fresh port when its own was
    /// taken meanwhile, rewriting the command-line option `option` (`--port`, `-p`).
    pub fn movable_port(mut self, option: &'static str) -> Self {
        self.port_option = Some(option);
        self
    }

    /// The server's client address.
    pub fn addr(&self) -> SocketAddr {
        *lock(&self.addr)
    }

    /// What this server is, for messages (`etcd member 1 on 127.0.0.1:…`).
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The file its stdout and stderr are appended to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Change what the next start runs.
    pub fn update_spec(&self, f: impl FnOnce(&mut CommandSpec)) {
        f(&mut lock(&self.spec));
    }

    fn start_error(&self, detail: impl fmt::Display) -> ServerError {
        ServerError::Start {
            what: self.what.clone(),
            detail: format!(
                "{detail}\n--- last lines of {} ---\n{}",
                self.log.display(),
                log_tail_since(&self.log, *lock(&self.log_start), LOG_TAIL_BYTES)
            ),
        }
    }

    /// Spawn the process (it must not be running). Does not wait for readiness.
    pub fn spawn(&self) -> Result<u32> {
        let mut st = lock(&self.state);
        reap_if_exited(&mut st);
        if st.child.is_some() {
            return Err(self.start_error("already running"));
        }
        let spec = lock(&self.spec).clone();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        *lock(&self.log_start) = log.metadata()?.len();
        writeln!(
            log,
            "==== tenure: starting {}: {}",
            self.what,
            spec.display()
        )?;
        let child = spec
            .command(log)?
            .spawn()
            .map_err(|e| self.start_error(format_args!("spawning {}: {e}", spec.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| self.start_error("spawned process has no pid"))?;
        register_spawned(pid);
        st.child = Some(child);
        st.paused = false;
        Ok(pid)
    }

    /// Poll the readiness probe until it says ready, the process exits, or the bound runs out.
    ///
    /// # Cancel safety
    /// Cancel safe (it only observes).
    pub async fn wait_ready(&self) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.ready_timeout;
        loop {
            {
                let mut st = lock(&self.state);
                if let Some(status) = reap_if_exited(&mut st) {
                    return Err(self
                        .start_error(format_args!("exited with {status} before becoming ready")));
                }
                if st.child.is_none() {
                    return Err(self.start_error("killed while starting"));
                }
            }
            let probe = (self.probe)(self.addr());
            let last = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
                Ok(Ok(true)) => {
                    tracing::debug!(what = %self.what, elapsed = ?started.elapsed(), "ready");
                    return Ok(());
                }
                Ok(Ok(false)) => "probe: not ready yet".to_owned(),
                Ok(Err(e)) => format!("probe: {e}"),
                Err(_) => format!("probe: no answer within {PROBE_TIMEOUT:?}"),
            };
            if Instant::now() >= deadline {
                return Err(self.start_error(format_args!(
                    "not ready within {:?} ({last})",
                    self.ready_timeout
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Spawn and wait until ready.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled start leaves the process running (it is still
    /// stopped on drop).
    pub async fn start(&self) -> Result<()> {
        self.spawn()?;
        self.wait_ready().await
    }

    /// `SIGKILL` the process group and every descendant that left it, reap the leader,
    /// and wait (up to 30 s) until those descendants are gone too:
    /// a Postgres backend that outlives its postmaster keeps the shared memory attached,
    /// and the next postmaster on the data dir refuses to start. Idempotent.
    ///
    /// # Cancel safety
    /// Cancel safe: the signals are sent before the first await; a dropped reap is
    /// finished by tokio's orphan reaper.
    pub async fn kill(&self) -> Result<()> {
        let child = {
            let mut st = lock(&self.state);
            st.paused = false;
            st.child.take()
        };
        let Some(mut child) = child else {
            return Ok(());
        };
        let helpers = kill_tree(&child)?;
        child.wait().await?;
        let deadline = Instant::now() + HELPERS_GONE_TIMEOUT;
        loop {
            let left: Vec<u32> = helpers
                .iter()
                .filter(|&&(pid, start)| same_process_alive(pid, start))
                .map(|&(pid, _)| pid)
                .collect();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ServerError::Timeout {
                    what: format!("{}: processes {left:?} to exit after SIGKILL", self.what),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// `SIGKILL` the process group and its descendants without awaiting; the leader is
    /// reaped if it goes within a few milliseconds, else left to tokio's orphan reaper.
    /// For `Drop`.
    pub fn kill_now(&self) {
        let child = {
            let mut st = lock(&self.state);
            st.paused = false;
            st.child.take()
        };
        let Some(mut child) = child else {
            return;
        };
        if let Err(e) = kill_tree(&child) {
            tracing::warn!(what = %self.what, error = %e, "could not kill server");
        }
        for _ in 0..50 {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Dropping an unreaped tokio Child hands it to tokio's orphan reaper.
    }

    /// Kill if running, spawn again with the same spec, wait until ready. If the port
    /// was taken meanwhile (another process may bind a port its server no longer holds)
    /// and the port is [movable](Self::movable_port), start again on a fresh port, up to
    /// three times; [`addr`](Self::addr) then gives the new address.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    pub async fn restart(&self) -> Result<()> {
        self.kill().await?;
        let mut moves = 0;
        loop {
            match self.start().await {
                Err(e) if e.is_port_clash() && moves < 3 => {
                    let Some(option) = self.port_option else {
                        return Err(e);
                    };
                    moves += 1;
                    self.kill().await?;
                    let old = self.addr();
                    let port = super::free_port()?;
                    tracing::warn!(what = %self.what, %old, port, "port taken at restart; moving");
                    if let Ok(mut log) = OpenOptions::new().append(true).open(&self.log) {
                        let _ = writeln!(
                            log,
                            "==== tenure: {old} was taken at restart; moving to port {port}"
                        );
                    }
                    self.update_spec(|spec| {
                        spec.remove_option(option, 1);
                        spec.args.push(option.into());
                        spec.args.push(port.to_string().into());
                    });
                    *lock(&self.addr) = super::loopback(port);
                }
                other => return other,
            }
        }
    }

    /// `SIGSTOP` the process group (and helpers that left it); returns once they are
    /// stopped (state `T`), blocking up to 5 s.
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP, true)
    }

    /// `SIGCONT` the process group (and helpers that left it); returns once none is
    /// stopped, blocking up to 5 s.
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT, false)
    }

    /// Signals the group, then the descendants that left it (Postgres backends), so the
    /// whole server stops or continues.
    fn signal(&self, sig: Signal, paused: bool) -> Result<()> {
        let mut st = lock(&self.state);
        reap_if_exited(&mut st);
        let child = st.child.as_ref().ok_or_else(|| ServerError::NotRunning {
            what: self.what.clone(),
        })?;
        signal_group(child, sig)?;
        let Some(pid) = child.id() else {
            return Ok(());
        };
        let helpers = descendants(pid);
        signal_each(&helpers, sig);
        st.paused = paused;
        drop(st);
        // Signals are delivered asynchronously: return once every process shows the effect,
        // so that nothing sent after `pause` returns is still served.
        let settled = |pid: u32| match stat(pid) {
            Some(s) if s.live() => matches!(s.state, 'T' | 't') == paused,
            _ => true,
        };
        let deadline = Instant::now() + SIGNAL_EFFECT_TIMEOUT;
        while !(settled(pid) && helpers.iter().all(|&(h, _)| settled(h))) {
            if Instant::now() >= deadline {
                return Err(ServerError::Timeout {
                    what: format!(
                        "{} to {} after {sig}",
                        self.what,
                        if paused { "stop" } else { "continue" }
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The process-group leader's pid while running.
    pub fn pid(&self) -> Option<u32> {
        let mut st = lock(&self.state);
        reap_if_exited(&mut st);
        st.child.as_ref().and_then(Child::id)
    }

    /// Runs the readiness probe once, bounded by the probe timeout.
    ///
    /// # Cancel safety
    /// Cancel safe (it only observes).
    pub async fn probe_once(&self) -> Result<()> {
        if !self.is_running() {
            return Err(ServerError::NotRunning {
                what: self.what.clone(),
            });
        }
        match tokio::time::timeout(PROBE_TIMEOUT, (self.probe)(self.addr())).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(ServerError::Protocol {
                what: self.what.clone(),
                detail: "not ready".into(),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ServerError::Timeout {
                what: format!("{} to answer its readiness probe", self.what),
            }),
        }
    }

    /// True while the process is alive (also while paused).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// True while paused with [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        let mut st = lock(&self.state);
        reap_if_exited(&mut st);
        st.child.is_some() && st.paused
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Freezes the child's group (so nothing new is forked), finds its descendants, and
/// `SIGKILL`s them and the group. Returns the descendants, to wait for.
fn kill_tree(child: &Child) -> Result<Vec<(u32, u64)>> {
    signal_group(child, Signal::SIGSTOP)?;
    let helpers = child.id().map(descendants).unwrap_or_default();
    signal_each(&helpers, Signal::SIGKILL);
    signal_group(child, Signal::SIGKILL)?;
    Ok(helpers)
}

/// Send `sig` to the child's process group. The leader is our unreaped child, so its PID
/// (the group id) cannot have been reused. A group that is already gone is not an error.
fn signal_group(child: &Child, sig: Signal) -> Result<()> {
    let Some(pid) = child.id() else {
        return Ok(());
    };
    let pid = i32::try_from(pid).map_err(|_| Errno::EINVAL)?;
    match killpg(Pid::from_raw(pid), sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// If the leader has exited, kill what is left of its group, reap it and clear the state.
fn reap_if_exited(st: &mut State) -> Option<ExitStatus> {
    let child = st.child.as_mut()?;
    let pid = child.id()?;
    // Still running (or stopped): leave it. Checked via /proc so that we can signal the
    // group while the zombie leader still holds the PID.
    if matches!(proc_stat(pid), Some((_, true))) {
        return None;
    }
    let _ = signal_group(child, Signal::SIGKILL);
    match child.try_wait() {
        Ok(Some(status)) => {
            st.child = None;
            st.paused = false;
            Some(status)
        }
        _ => None,
    }
}
