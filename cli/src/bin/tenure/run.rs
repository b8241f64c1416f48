//! `tenure run`: a command under a lock, stopped before the lease can expire.
//!
//! Three processes take part:
//!
//! - **tenure** holds the lock (a renewing [`MultiGuard`] of one key or several), is a
//!   child subreaper on Linux so
//!   that orphaned members of the command's process group are reaped by it, and decides
//!   when the command must stop.
//! - **the keeper** (`tenure __keeper`, this same binary) is spawned by tenure as the
//!   leader of a new process group, starts the command in that group and exits with its
//!   status. It exists for the cases tenure cannot handle itself:
//!   - tenure dying without warning (SIGKILL, the OOM killer): the kernel sends the
//!     keeper SIGTERM (`PR_SET_PDEATHSIG`), and the keeper SIGKILLs the whole group;
//!   - tenure stopped or starved (SIGSTOP, a debugger, swapping) while the lease runs
//!     out: tenure tells the keeper each new lease deadline over a socket (the *switch*),
//!     and the keeper stops the group on the same schedule tenure would have, if no newer
//!     deadline came. The switch closing also means tenure is gone.
//! - **the command** and everything it starts, in the keeper's process group.
//!
//! Every stop (lease lost or about to expire, SIGTERM/SIGINT/SIGHUP to tenure, leftovers
//! of a finished command) is one sequence: the signal to the group, then SIGKILL once the
//! grace has run out, and a wait until no process of the group is left. The grace is
//! budgeted inside the lease: tenure starts stopping the command `grace + margin` before
//! the lease's local deadline, so the group is gone before the lease can expire.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::{getpgrp, getpid, getppid, Pid};
use tenure::{AcquireOptions, DistributedLock, LockError, LockKey, MultiGuard, MultiLock};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal as signal_stream, SignalKind};

/// Exit code: the lease was lost while the command ran; the command was stopped.
pub(crate) const EXIT_LOST: u8 = 76;
/// Exit code of the keeper when the command cannot be found (as `env` and shells).
const EXIT_NOT_FOUND: u8 = 127;
/// Exit code of the keeper when the command cannot be started for another reason.
const EXIT_CANNOT_RUN: u8 = 126;
/// The grace when `--grace` is not given, at most a quarter of the TTL.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How long tenure waits for the group to vanish after SIGKILL before it gives up.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Bounds of how often tenure tells the keeper the lease deadline (a twentieth of the TTL).
const MIN_TELL: Duration = Duration::from_millis(10);
const MAX_TELL: Duration = Duration::from_millis(250);
/// How often the keeper looks for leftovers of a finished command in its group.
const POLL: Duration = Duration::from_millis(20);
/// How long tenure waits for its keeper to connect to the switch.
const SWITCH_WAIT: Duration = Duration::from_secs(10);

/// How `tenure run` behaves around the command.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    /// SIGTERM-to-SIGKILL time; `None` for the default.
    pub grace: Option<Duration>,
    /// Keep the lock at least this long after it was granted.
    pub hold_at_least: Duration,
    /// Take the keys shared, as their readers.
    pub shared: bool,
}

/// When to start stopping the command, so that it is gone before the lease deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopPlan {
    grace: Duration,
    /// Time left after SIGKILL for the group to die and be reaped.
    margin: Duration,
}

impl StopPlan {
    /// The plan for a lease of `ttl`. A stop takes at most `grace + margin`, and it must
    /// fit in half the TTL: the renewal that keeps the lease alive starts when a third of
    /// the lease has passed, and needs the rest of the first half for its round trip.
    fn new(ttl: Duration, grace: Option<Duration>) -> Result<Self, LockError> {
        let margin = (ttl / 10).min(Duration::from_secs(1));
        let fits = (ttl / 2).saturating_sub(margin);
        let grace = match grace {
            None => DEFAULT_GRACE.min(ttl / 4),
            Some(grace) if grace <= fits => grace,
            Some(grace) => {
                return Err(LockError::Config(format!(
                    "--grace {} does not fit in --ttl {}: tenure stops the command (SIGTERM, \
                     then SIGKILL after the grace) so that it is gone before the lease could \
                     expire, and that stop must fit in half the TTL with {} to spare, leaving \
                     the rest to renewals; use --grace {} or less, or a longer --ttl",
                    humantime::format_duration(grace),
                    humantime::format_duration(ttl),
                    humantime::format_duration(margin),
                    humantime::format_duration(fits),
                )))
            }
        };
        Ok(Self { grace, margin })
    }

    /// The plan tenure passed to its keeper.
    pub(crate) fn from_millis(grace_ms: u64, margin_ms: u64) -> Self {
        Self {
            grace: Duration::from_millis(grace_ms),
            margin: Duration::from_millis(margin_ms),
        }
    }

    /// How long before the lease deadline the stop starts.
    fn budget(&self) -> Duration {
        self.grace + self.margin
    }

    /// When the stop must start for a lease that ends at `deadline`.
    fn stop_at(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.budget()).unwrap_or(deadline)
    }

    /// When a stop that starts now must turn to SIGKILL, given the lease `deadline`.
    fn kill_at(&self, deadline: Instant) -> Instant {
        let latest = deadline.checked_sub(self.margin).unwrap_or(deadline);
        (Instant::now() + self.grace).min(latest)
    }
}

/// How the command's run ended, before the stop and the release.
enum End {
    /// The keeper exited with this code (the command's, or 128+signal).
    Exited(u8),
    /// tenure received this signal.
    Signal(Signal),
    /// The lease was lost, or no renewal came before the stop had to start.
    Lost(String),
}

/// Runs `cmd` under `key`: see the module docs.
pub(crate) async fn run_under_lock(
    lock: Arc<dyn DistributedLock>,
    keys: Vec<LockKey>,
    opts: AcquireOptions,
    run: RunOptions,
    cmd: Vec<String>,
) -> Result<ExitCode, LockError> {
    let plan = StopPlan::new(opts.ttl, run.grace)?;
    let multi = match run.shared {
        false => MultiLock::new(lock, keys)?,
        true => MultiLock::new(lock, keys)?.shared()?,
    };
    let key = joined(multi.keys().iter().map(LockKey::as_str), "`, `");
    let mut signals = StopSignals::new()?;
    let mut group = Group::new()?;
    // A signal during the wait gives back the keys taken so far before tenure exits.
    let guard = match multi.lock_until(&opts, signals.recv()).await? {
        Ok(guard) => guard,
        Err(signal) => return Ok(signalled(signal)),
    };
    let granted = Instant::now();
    if let Err(error) = group.spawn(&cmd, &guard, plan).await {
        release(guard).await;
        return Err(error);
    }
    let end = watch(&guard, plan, &mut signals, &mut group).await;
    let code = match end {
        End::Exited(code) if guard.is_lost() || group.keeper_stopped().await => {
            let reason = match guard.lost_reason() {
                Some(reason) => format!("lost ({reason})"),
                None => "not renewed in time: tenure was not running".into(),
            };
            eprintln!("tenure: lease on `{key}` {reason}; the command was stopped (exit {code})");
            if !group.is_gone() {
                group.stop(Signal::SIGKILL, Instant::now()).await;
            }
            ExitCode::from(EXIT_LOST)
        }
        End::Exited(code) => {
            if !group.is_gone() {
                eprintln!(
                    "tenure: the command exited and left processes in its group; stopping them"
                );
                group
                    .stop(Signal::SIGTERM, plan.kill_at(guard.deadline()))
                    .await;
            }
            let until = granted + run.hold_at_least;
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = guard.lost() => eprintln!(
                    "tenure: the command finished, but the lease on `{key}` was lost before \
                     --hold-at-least ran out ({})",
                    guard.lost_reason().unwrap_or_default()
                ),
                signal = signals.recv() => {
                    release(guard).await;
                    return Ok(signalled(signal));
                }
            }
            ExitCode::from(code)
        }
        End::Signal(signal) => {
            eprintln!("tenure: received {signal}; stopping the command");
            group.stop(signal, plan.kill_at(guard.deadline())).await;
            signalled(signal)
        }
        End::Lost(reason) => {
            eprintln!("tenure: lease on `{key}` lost ({reason}); stopping the command");
            group
                .stop(Signal::SIGTERM, plan.kill_at(guard.deadline()))
                .await;
            ExitCode::from(EXIT_LOST)
        }
    };
    release(guard).await;
    Ok(code)
}

/// `items` joined by `separator`.
fn joined<T: AsRef<str>>(items: impl Iterator<Item = T>, separator: &str) -> String {
    let mut out = String::new();
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(item.as_ref());
    }
    out
}

/// Releases the lock at the end of a run. A failure is reported, not returned: the exit
/// status says how the command ended, and the lease expires on its own.
async fn release(guard: MultiGuard) {
    let key = joined(guard.members().iter().map(|m| m.key().as_str()), "`, `");
    let which = match guard.members().len() {
        1 => format!("`{key}`"),
        _ => format!("one of `{key}`"),
    };
    match guard.release().await {
        Ok(_) => {}
        Err(error) => eprintln!(
            "tenure: releasing {which} failed ({}); it is freed when its lease expires",
            tenure::redact_url(&error.to_string())
        ),
    }
}

/// Waits until the command exits, tenure is signalled, or the lease is lost — or is
/// about to expire without a renewal, `plan.budget()` before its deadline.
async fn watch(
    guard: &MultiGuard,
    plan: StopPlan,
    signals: &mut StopSignals,
    group: &mut Group,
) -> End {
    // Often enough that the keeper hears of a renewal long before the old deadline's stop.
    let mut ttl = None::<Duration>;
    for member in guard.members() {
        if let Some(lease) = member.lease().await {
            ttl = Some(ttl.map_or(lease.ttl(), |t| t.min(lease.ttl())));
        }
    }
    let ttl = ttl.unwrap_or(Duration::from_secs(1));
    let mut tell = tokio::time::interval((ttl / 20).clamp(MIN_TELL, MAX_TELL));
    loop {
        group.reap();
        if let Some(code) = group.exit {
            return End::Exited(code);
        }
        let stop_at = plan.stop_at(guard.deadline());
        tokio::select! {
            _ = group.children.recv() => {}
            _ = tell.tick() => group.tell(guard.deadline()).await,
            signal = signals.recv() => return End::Signal(signal),
            _ = guard.lost() => {
                return End::Lost(guard.lost_reason().unwrap_or_default());
            }
            _ = tokio::time::sleep_until(stop_at.into()) => {
                if guard.deadline() <= Instant::now() + plan.budget() {
                    return End::Lost(format!(
                        "no renewal succeeded and the lease expires in less than the {} its \
                         stop needs",
                        humantime::format_duration(plan.budget())
                    ));
                }
            }
        }
    }
}

/// tenure's exit for a received signal: 128 + its number, as shells report it.
pub(crate) fn signalled(signal: Signal) -> ExitCode {
    ExitCode::from(128 + signal as u8)
}

/// SIGTERM, SIGINT and SIGHUP, the signals that stop `tenure run` and its command — those
/// of them not ignored when tenure started (`nohup tenure run …` keeps ignoring SIGHUP).
pub(crate) struct StopSignals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl StopSignals {
    pub(crate) fn new() -> Result<Self, LockError> {
        let ignored = ignored_signals();
        let mut streams = Vec::new();
        for (signal, kind) in [
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGHUP, SignalKind::hangup()),
        ] {
            if ignored & (1 << (signal as u64 - 1)) == 0 {
                let stream = signal_stream(kind)
                    .map_err(|e| LockError::backend(format!("cannot handle signals: {e}")))?;
                streams.push((signal, stream));
            }
        }
        Ok(Self { streams })
    }

    /// The next stop signal.
    ///
    /// # Cancel safety
    /// Cancel-safe: a signal not yet returned stays pending.
    pub(crate) async fn recv(&mut self) -> Signal {
        if self.streams.is_empty() {
            return std::future::pending().await; // all three ignored
        }
        let next = self.streams.iter_mut().map(|(signal, stream)| {
            Box::pin(async move {
                stream.recv().await;
                *signal
            })
        });
        futures::future::select_all(next).await.0
    }
}

/// The signals this process ignores (the `SigIgn` mask of `/proc/self/status`; none
/// where it cannot be read).
fn ignored_signals() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0)
}

/// The command's process group, led by the keeper.
struct Group {
    leader: Pid,
    /// The keeper's exit code, once reaped.
    exit: Option<u8>,
    /// SIGCHLD: a child of tenure (the keeper, or an orphan of the group) changed state.
    children: tokio::signal::unix::Signal,
    /// tenure's end of the switch, and the deadline last told.
    switch: Option<(UnixStream, Option<Instant>)>,
}

impl Group {
    /// Listens for SIGCHLD (before any child exists, so that no exit is missed) and makes
    /// tenure the reaper of the group's orphans.
    fn new() -> Result<Self, LockError> {
        #[cfg(target_os = "linux")]
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| LockError::backend(format!("cannot become a child subreaper: {e}")))?;
        let children = signal_stream(SignalKind::child())
            .map_err(|e| LockError::backend(format!("cannot handle signals: {e}")))?;
        Ok(Self {
            leader: Pid::from_raw(0),
            exit: None,
            children,
            switch: None,
        })
    }

    /// Starts the keeper, which starts `cmd`, in a new process group, and connects the
    /// switch to it.
    ///
    /// Called on tenure's main thread: the kernel sends the parent-death signal when the
    /// *thread* that forked the keeper ends, and the keeper ignores one while tenure lives.
    async fn spawn(
        &mut self,
        cmd: &[String],
        guard: &MultiGuard,
        plan: StopPlan,
    ) -> Result<(), LockError> {
        let (listener, rendezvous) = switch::listen()
            .map_err(|e| LockError::backend(format!("cannot open the keeper's switch: {e}")))?;
        // One key's token and name; several keys' joined by commas, in key order.
        let tokens = guard.fencing_tokens();
        let fences = joined(tokens.iter().map(|(_, token)| token.to_string()), ",");
        let keys = joined(tokens.iter().map(|(key, _)| key.as_str()), ",");
        let keeper = std::process::Command::new(own_executable())
            .arg0("tenure")
            .arg("__keeper")
            .arg(std::process::id().to_string())
            .arg({
                let mut arg = std::ffi::OsString::from("--switch=");
                arg.push(rendezvous.path());
                arg
            })
            .arg(format!(
                "--deadline-ns={}",
                switch::monotonic(guard.deadline()).as_nanos()
            ))
            .arg(format!("--grace-ms={}", plan.grace.as_millis()))
            .arg(format!("--margin-ms={}", plan.margin.as_millis()))
            .arg("--")
            .args(cmd)
            .env("TENURE_FENCE", fences)
            .env("TENURE_KEY", keys)
            .process_group(0)
            .spawn()
            .map_err(|e| LockError::backend(format!("cannot start the keeper process: {e}")))?;
        self.leader = Pid::from_raw(keeper.id() as i32);
        let accepted = tokio::time::timeout(SWITCH_WAIT, async {
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) if switch::peer_is(&stream, self.leader) => {
                            return Some(stream);
                        }
                        Ok(_) => {} // not our keeper
                        Err(_) => return None,
                    },
                    _ = self.children.recv() => {
                        self.reap();
                        if self.exit.is_some() {
                            return None; // the keeper ended before connecting
                        }
                    }
                }
            }
        })
        .await;
        // Connected or not, nobody else is to find the socket.
        drop(rendezvous);
        if let Ok(Some(stream)) = accepted {
            self.switch = Some((stream, None));
            self.tell(guard.deadline()).await;
        } else if self.exit.is_none() {
            self.stop(Signal::SIGKILL, Instant::now()).await;
            return Err(LockError::backend(
                "the keeper process did not connect to tenure; the command was stopped",
            ));
        }
        Ok(())
    }

    /// True if the keeper said it stopped the group on its own (tenure did not renew).
    /// Called once the keeper has exited, so its end is closed: the read ends at once.
    async fn keeper_stopped(&mut self) -> bool {
        let Some((stream, _)) = &mut self.switch else {
            return false;
        };
        let mut said = Vec::new();
        let read = tokio::time::timeout(SWITCH_WAIT, stream.read_to_end(&mut said)).await;
        read.is_ok() && said.starts_with(switch::STOPPED)
    }

    /// Tells the keeper the lease's current `deadline`, if it changed. A keeper that is
    /// gone is not an error here: its exit is reaped and handled by the caller.
    async fn tell(&mut self, deadline: Instant) {
        if let Some((stream, told)) = &mut self.switch {
            if *told != Some(deadline) {
                let line = format!("{}\n", switch::monotonic(deadline).as_nanos());
                if stream.write_all(line.as_bytes()).await.is_ok() {
                    *told = Some(deadline);
                }
            }
        }
    }

    /// Reaps every exited child of tenure; records the keeper's exit.
    fn reap(&mut self) {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == self.leader => {
                    self.exit = Some(u8::try_from(code).unwrap_or(u8::MAX));
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == self.leader => {
                    self.exit = Some(128 + signal as u8);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => {} // an orphan of the group
            }
        }
    }

    /// True when no process of the group is left (exited processes reaped).
    fn is_gone(&mut self) -> bool {
        self.reap();
        killpg(self.leader, None) == Err(Errno::ESRCH)
    }

    /// Waits until the group is gone or `until`; true if it is gone.
    async fn wait_gone(&mut self, until: Instant) -> bool {
        loop {
            if self.is_gone() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            // SIGCHLD wakes us for the group's members tenure reaps; the poll covers
            // members reaped by a parent of their own.
            let poll = Instant::now() + Duration::from_millis(20);
            tokio::select! {
                _ = self.children.recv() => {}
                _ = tokio::time::sleep_until(poll.min(until).into()) => {}
            }
        }
    }

    /// Sends `signal` to the group, SIGKILL at `kill_at` if any of it is left, and waits
    /// until the group is gone.
    async fn stop(&mut self, signal: Signal, kill_at: Instant) {
        let _ = killpg(self.leader, signal);
        if self.wait_gone(kill_at).await {
            return;
        }
        let _ = killpg(self.leader, Signal::SIGKILL);
        if !self.wait_gone(Instant::now() + KILL_WAIT).await {
            eprintln!(
                "tenure: processes of the command's group are still there {} after SIGKILL",
                humantime::format_duration(KILL_WAIT)
            );
        }
    }
}

/// This executable, for the keeper; on Linux `/proc/self/exe` still works after a deploy
/// replaced the file.
fn own_executable() -> std::path::PathBuf {
    if cfg!(target_os = "linux") {
        "/proc/self/exe".into()
    } else {
        std::env::current_exe().unwrap_or_else(|_| "tenure".into())
    }
}

/// The keeper (`tenure __keeper PARENT --switch PATH … -- CMD…`): runs `cmd` in its own
/// process group and exits with its status (128+signal if it was killed). A stop signal
/// while `parent` lives was sent to the whole group by tenure, which does the stopping.
/// The keeper stops the group itself only when tenure cannot: tenure died (the
/// parent-death signal, the switch closing, or the check every second) — SIGKILL at once,
/// since nobody renews the lease any more — or the last deadline tenure told it comes
/// within the stop plan without a newer one — SIGTERM, then SIGKILL, as tenure would.
pub(crate) fn keeper(
    parent: i32,
    switch: Option<&std::path::Path>,
    deadline_ns: Option<u64>,
    plan: StopPlan,
    cmd: &[String],
) -> ExitCode {
    let parent = Pid::from_raw(parent);
    let first = deadline_ns.map(|ns| switch::instant(Duration::from_nanos(ns)));
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    if getppid() != parent {
        return ExitCode::from(EXIT_LOST); // tenure died before the command started
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tenure: cannot start the keeper: {e}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    runtime.block_on(keep(parent, switch, first, plan, cmd))
}

async fn keep(
    parent: Pid,
    switch: Option<&std::path::Path>,
    first: Option<Instant>,
    plan: StopPlan,
    cmd: &[String],
) -> ExitCode {
    let (me, group) = (getpid(), getpgrp());
    let orphaned = || {
        if getppid() != parent {
            let _ = killpg(group, Signal::SIGKILL);
        }
    };
    let mut signals = match StopSignals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("tenure: {e}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let (mut deadlines, mut answer) = match switch.map(switch::connect).transpose() {
        Ok(Some((deadlines, answer))) => (Some(deadlines), Some(answer)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("tenure: the keeper cannot reach tenure: {e}");
            return ExitCode::from(EXIT_CANNOT_RUN);
        }
    };
    let Some((program, args)) = cmd.split_first() else {
        return ExitCode::from(EXIT_CANNOT_RUN);
    };
    if let Some(signal) = futures::FutureExt::now_or_never(signals.recv()) {
        return signalled(signal); // tenure is already stopping: never start the command
    }
    let mut child = match tokio::process::Command::new(program).args(args).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("tenure: cannot run {program:?}: {e}");
            return ExitCode::from(match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            });
        }
    };
    let mut check = tokio::time::interval(Duration::from_secs(1));
    // The last deadline heard (the first one came with the arguments, so that the
    // command never runs without a schedule), the command's exit once it came, and
    // when SIGKILL is due once the keeper is stopping the group.
    let mut deadline = first;
    let mut exit: Option<u8> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Some(code) = exit {
            // The command is done; the keeper stays until the rest of its group is.
            let others = group_members(group, me);
            if others.is_empty() {
                return ExitCode::from(code);
            }
            if kill_at.is_none() {
                let _ = killpg(group, Signal::SIGTERM);
                kill_at = Some(match deadline {
                    Some(deadline) => plan.kill_at(deadline),
                    None => Instant::now() + plan.grace,
                });
                eprintln!(
                    "tenure: the command exited and left processes in its group; stopping them"
                );
            }
        }
        let next = kill_at.or(deadline.map(|d| plan.stop_at(d)));
        tokio::select! {
            status = child.wait(), if exit.is_none() => exit = Some(exit_code(status)),
            _ = signals.recv() => orphaned(),
            _ = check.tick() => orphaned(),
            // Leftovers of the command are not the keeper's children: poll for them.
            _ = tokio::time::sleep(POLL), if exit.is_some() => {}
            told = switch::next(&mut deadlines) => match told {
                Some(told) => deadline = Some(told),
                None => {
                    // tenure is gone: nobody renews the lease.
                    let _ = killpg(group, Signal::SIGKILL);
                }
            },
            _ = sleep_until(next) => match (kill_at, exit) {
                (Some(_), None) => {
                    let _ = killpg(group, Signal::SIGKILL);
                }
                (Some(_), Some(_)) => {
                    for pid in group_members(group, me) {
                        let _ = kill(pid, Signal::SIGKILL);
                    }
                }
                (None, _) => {
                    let _ = killpg(group, Signal::SIGTERM);
                    kill_at = deadline.map(|d| plan.kill_at(d));
                    if let Some(answer) = &mut answer {
                        let _ = answer.write_all(switch::STOPPED).await;
                    }
                    eprintln!(
                        "tenure: the lease is about to expire and tenure has not renewed it \
                         (is it stopped?); stopping the command"
                    );
                }
            },
        }
    }
}

/// The keeper's exit code for the command's `status`: its code, or 128+signal.
fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(u8::MAX),
            (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
            (None, None) => EXIT_CANNOT_RUN,
        },
        Err(_) => EXIT_CANNOT_RUN,
    }
}

/// The running (not zombie) processes of process group `group` other than `me`, from
/// `/proc`.
fn group_members(group: Pid, me: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
        let mut fields = stat
            .rsplit_once(") ")
            .map_or("", |(_, rest)| rest)
            .split(' ');
        let (state, pgrp) = (fields.next(), fields.nth(1));
        if pgrp == Some(&group.as_raw().to_string()) && state != Some("Z") && pid != me.as_raw() {
            members.push(Pid::from_raw(pid));
        }
    }
    members
}

/// Sleeps until `at`, forever if `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The switch: a Unix socket on which tenure writes each lease deadline, as nanoseconds
/// of `CLOCK_MONOTONIC` — one clock for both processes — one per line. Its path is in a
/// private directory (`mkdtemp`, mode 0700) that tenure removes as soon as the keeper has
/// connected (or failed to), so that no file outlives the start, and no other user's
/// process can connect meanwhile.
mod switch {
    use super::*;
    use std::path::{Path, PathBuf};
    use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

    /// The switch's socket file and its private directory, removed when dropped.
    pub(super) struct Rendezvous {
        dir: PathBuf,
        path: PathBuf,
    }

    impl Rendezvous {
        /// The socket's path, for the keeper.
        pub(super) fn path(&self) -> &Path {
            &self.path
        }
    }

    impl Drop for Rendezvous {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    /// The longest socket path every Unix takes (`sun_path` is 104 bytes on macOS and
    /// the BSDs, 108 on Linux, with its NUL).
    const MAX_SOCKET_PATH: usize = 100;

    /// Listens on a socket in a fresh private directory under the temporary directory
    /// (`/tmp` where that one is unset or too long a path for a socket).
    pub(super) fn listen() -> std::io::Result<(tokio::net::UnixListener, Rendezvous)> {
        let name = "tenure-keeper-XXXXXX";
        let mut parent = std::env::temp_dir();
        let fits = |parent: &Path| {
            parent.is_absolute()
                && parent.join(name).join("switch").as_os_str().len() <= MAX_SOCKET_PATH
        };
        if !fits(&parent) {
            parent = PathBuf::from("/tmp");
        }
        let dir = nix::unistd::mkdtemp(&parent.join(name))?;
        let path = dir.join("switch");
        let rendezvous = Rendezvous { dir, path };
        let listener = tokio::net::UnixListener::bind(rendezvous.path()).map_err(|e| {
            let path = rendezvous.path().display();
            std::io::Error::new(e.kind(), format!("{path}: {e}"))
        })?;
        Ok((listener, rendezvous))
    }

    /// True if `stream`'s other end is process `pid` (where the platform names the peer's
    /// process; elsewhere, a process of this user: the directory admits no other).
    pub(super) fn peer_is(stream: &UnixStream, pid: Pid) -> bool {
        stream.peer_cred().is_ok_and(|cred| match cred.pid() {
            Some(peer) => peer == pid.as_raw(),
            None => cred.uid() == nix::unistd::getuid().as_raw(),
        })
    }

    /// What the keeper says when it stopped the group on its own.
    pub(super) const STOPPED: &[u8] = b"stopped\n";

    /// The deadlines tenure tells, and the keeper's way to answer.
    pub(super) type Deadlines = Lines<BufReader<OwnedReadHalf>>;

    /// The keeper's end: the deadlines tenure tells, and the half to answer on.
    pub(super) fn connect(path: &Path) -> std::io::Result<(Deadlines, OwnedWriteHalf)> {
        let stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.set_nonblocking(true)?;
        let (read, write) = UnixStream::from_std(stream)?.into_split();
        Ok((BufReader::new(read).lines(), write))
    }

    /// The next deadline told; `None` once tenure closed the switch (or it failed).
    /// Pending forever without a switch.
    ///
    /// # Cancel safety
    /// Cancel-safe (`Lines::next_line` is).
    pub(super) async fn next(deadlines: &mut Option<Deadlines>) -> Option<Instant> {
        let Some(lines) = deadlines else {
            return std::future::pending().await;
        };
        loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if let Ok(nanos) = line.trim().parse::<u64>() {
                        return Some(instant(Duration::from_nanos(nanos)));
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }

    fn monotonic_now() -> Duration {
        clock_gettime(ClockId::CLOCK_MONOTONIC)
            .map(|t| Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
            .unwrap_or_default()
    }

    /// `at` on `CLOCK_MONOTONIC` (read first, so the result errs early).
    pub(super) fn monotonic(at: Instant) -> Duration {
        let mono = monotonic_now();
        let now = Instant::now();
        match at.checked_duration_since(now) {
            Some(ahead) => mono + ahead,
            None => mono.saturating_sub(now - at),
        }
    }

    /// The instant of `mono` on `CLOCK_MONOTONIC` (the clock read last, so it errs early).
    pub(super) fn instant(mono: Duration) -> Instant {
        let now = Instant::now();
        let current = monotonic_now();
        match mono.checked_sub(current) {
            Some(ahead) => now + ahead,
            None => now.checked_sub(current - mono).unwrap_or(now),
        }
    }
}
