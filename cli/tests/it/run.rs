//! `tenure run` as systemd, cron and an operator treat it: real `tenure` processes on a
//! live Redis, ZooKeeper and etcd, signalled and killed, with a command that has a child
//! of its own (a grandchild of tenure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_etcd::lab::EtcdCluster;
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};

/// `tenure --url URL ARGS…`, started with the stop signals' default dispositions (as
/// from a terminal or a service manager, whatever this test process inherited: a
/// background job of a script ignores SIGINT, and tenure keeps ignored signals ignored).
pub(crate) fn tenure(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new("env");
    command
        .arg("--default-signal=INT,HUP,TERM")
        .arg(env!("CARGO_BIN_EXE_tenure"))
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("TENURE_URL")
        .env_remove("TENURE_TTL")
        .env_remove("TENURE_WAIT");
    command
}

pub(crate) fn output(url: &str, args: &[&str]) -> Output {
    tenure(url, args).output().expect("tenure runs")
}

/// A `tenure` process, SIGKILLed on drop if still running (a failed test leaks nothing:
/// the keeper then kills the command's group).
pub(crate) struct Tenure(Option<Child>);

impl Tenure {
    pub(crate) fn spawn(command: &mut Command) -> Tenure {
        Tenure(Some(command.spawn().expect("tenure starts")))
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.as_ref().map_or(0, |c| c.id() as i32))
    }

    fn wait(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `tenure run` whose command starts a grandchild and writes both pids to files.
struct Held {
    tenure: Tenure,
    dir: tempfile::TempDir,
}

/// Which of the command's processes ignore SIGTERM, so that only SIGKILL stops them.
#[derive(Clone, Copy, PartialEq)]
enum Deaf {
    None,
    /// The command (`sh`) and its child.
    Both,
    /// Only the child: the command dies of SIGTERM and leaves it behind.
    Child,
}

/// The command: `sleep 300` in the background (the grandchild), then wait for it; both
/// pids written to `dir`.
fn command_script(dir: &Path, deaf: Deaf) -> String {
    format!(
        "{trap} {child} & echo $! > {dir}/grandchild; echo $$ > {dir}/command; wait",
        trap = if deaf == Deaf::Both {
            "trap '' TERM;"
        } else {
            ""
        },
        child = if deaf == Deaf::Child {
            "(trap '' TERM; exec sleep 300)"
        } else {
            "sleep 300"
        },
        dir = dir.display()
    )
}

impl Held {
    /// Starts `tenure run ARGS -- sh -c COMMAND` and waits until the command and its
    /// child run.
    fn start(url: &str, args: &[&str], deaf: Deaf) -> Held {
        let dir = tempfile::tempdir().unwrap();
        let script = command_script(dir.path(), deaf);
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "sh", "-c", &script]);
        Held::spawned(Tenure::spawn(tenure(url, &all).stderr(Stdio::piped())), dir)
    }

    /// Waits until the command of `tenure` (writing its pids to `dir`) and its child run.
    fn spawned(tenure: Tenure, dir: tempfile::TempDir) -> Held {
        let held = Held { tenure, dir };
        let since = Instant::now();
        while held.pids().len() < 2 {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "the command never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        held
    }

    /// The command's and the grandchild's pids, once written.
    fn pids(&self) -> Vec<i32> {
        ["command", "grandchild"]
            .iter()
            .filter_map(|name| read_pid(&self.dir.path().join(name)))
            .collect()
    }

    fn signal(&self, signal: Signal) {
        kill(self.tenure.pid(), signal).unwrap();
    }

    /// Waits for tenure to exit, then up to `within` for the command and its child to
    /// stop; tenure's status and stderr, and the pids still running (SIGKILLed then, so
    /// that reading stderr, a pipe they share, cannot hang).
    fn finish(mut self, within: Duration) -> (Output, Vec<i32>) {
        use std::io::Read;
        let mut child = self.tenure.0.take().unwrap();
        let status = child.wait().unwrap();
        let left = wait_stopped(&self.pids(), within);
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let mut stderr = Vec::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_end(&mut stderr);
        }
        let stdout = Vec::new();
        (
            Output {
                status,
                stdout,
                stderr,
            },
            left,
        )
    }
}

fn read_pid(path: &PathBuf) -> Option<i32> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse().ok()
}

/// True while `pid` runs (a zombie has finished running).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `limit` for all of `pids` to stop running; the ones still running.
fn wait_stopped(pids: &[i32], limit: Duration) -> Vec<i32> {
    let since = Instant::now();
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| running(*p)).collect();
        if left.is_empty() || since.elapsed() > limit {
            return left;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// True once process `pid` has a handler for `signal` (it is ready to be stopped by it).
fn catches(pid: Pid, signal: Signal) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal as u32 - 1)) != 0)
}

/// When the server frees `key` at the earliest, read from `url` after the holder
/// stopped renewing.
fn server_expiry(url: &str, key: &str) -> SystemTime {
    let before = SystemTime::now();
    let shown = output(url, &["inspect", key]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let remaining = shown["remaining_ms"].as_u64().expect("held, with a TTL");
    before + Duration::from_millis(remaining)
}

/// Waits for `pids` to stop, and asserts that happened before `expires`.
fn assert_stopped_before(pids: &[i32], expires: SystemTime) {
    let left = wait_stopped(pids, Duration::from_secs(20));
    let stopped = SystemTime::now();
    assert_eq!(left, Vec::<i32>::new(), "the command outlived the lease");
    assert!(
        stopped < expires,
        "the group ran until {:?} after the lease expired",
        stopped.duration_since(expires).unwrap_or_default()
    );
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// The lock is free: another run takes it without waiting.
fn assert_free(url: &str, key: &str) {
    let out = output(url, &["run", "--key", key, "--wait", "0s", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "lock still held: {}",
        stderr(&out)
    );
}

/// SIGTERM, SIGINT or SIGHUP to tenure: the command and its child are gone, the lock is
/// free at once, and tenure exits 128+signal.
fn a_stop_signal_stops_the_group_and_frees_the_lock(url: &str, signal: Signal) {
    let key = format!("signalled-{}", signal as i32);
    let held = Held::start(url, &["--key", &key], Deaf::None);
    assert_eq!(held.pids().len(), 2);
    held.signal(signal);
    let (out, left) = held.finish(Duration::ZERO);
    assert_eq!(
        out.status.code(),
        Some(128 + signal as i32),
        "{}",
        stderr(&out)
    );
    assert_eq!(left, Vec::<i32>::new(), "running after tenure exited");
    assert!(stderr(&out).contains(&format!("received {signal}")));
    assert_free(url, &key);
}

/// SIGKILL to tenure: nobody renews the lease any more, so the command and its child
/// must not run on.
fn sigkill_to_tenure_stops_the_group(url: &str) {
    let held = Held::start(url, &["--key", "killed"], Deaf::None);
    assert_eq!(held.pids().len(), 2);
    held.signal(Signal::SIGKILL);
    let (out, left) = held.finish(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9)
    );
    assert_eq!(
        left,
        Vec::<i32>::new(),
        "the command or its child outlived tenure"
    );
}

/// `--hold-at-least`: a command that finishes at once keeps the lock for the period.
fn hold_at_least_keeps_the_lock(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let started = Instant::now();
    let first = Tenure::spawn(&mut tenure(
        url,
        &[
            "run",
            "--key",
            "period",
            "--hold-at-least",
            "4s",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ));
    while !marker.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The command has finished; the lock stays held.
    let second = output(
        url,
        &["run", "--key", "period", "--wait", "0s", "--", "true"],
    );
    assert_eq!(second.status.code(), Some(75), "{}", stderr(&second));
    assert_eq!(first.wait().status.code(), Some(0));
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "released after {:?}",
        started.elapsed()
    );
    assert_free(url, "period");
}

/// Runs the blocking `body` with the URL of a fresh Redis server (off the async workers,
/// which the harness needs).
async fn on_redis(body: impl FnOnce(String) + Send + 'static) {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    tokio::task::spawn_blocking(move || body(url))
        .await
        .unwrap();
}

/// As [`on_redis`], on a fresh ZooKeeper server.
async fn on_zookeeper(body: impl FnOnce(String) + Send + 'static) {
    let ensemble = ZkEnsemble::start(ZkOptions::default()).await.unwrap();
    let url = format!("zk://{}", ensemble.connect_string());
    tokio::task::spawn_blocking(move || body(url))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_signals_sigkill_and_hold_at_least() {
    on_redis(|url| {
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            a_stop_signal_stops_the_group_and_frees_the_lock(&url, signal);
        }
        sigkill_to_tenure_stops_the_group(&url);
        hold_at_least_keeps_the_lock(&url);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_signals_sigkill_and_hold_at_least() {
    on_zookeeper(|url| {
        a_stop_signal_stops_the_group_and_frees_the_lock(&url, Signal::SIGTERM);
        sigkill_to_tenure_stops_the_group(&url);
        hold_at_least_keeps_the_lock(&url);
    })
    .await;
}

/// Renewals stop getting through (a black-holed connection, not an error): tenure must
/// stop the whole group — here deaf to SIGTERM, so SIGKILL after the grace — before the
/// lease can expire on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_renewals_stop_the_group_before_the_lease_expires() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let direct = cluster.urls()[0].clone();
    let proxy = FaultProxy::start(cluster.nodes()[0].addr()).await.unwrap();
    let url = format!("redis://{}?command_timeout_ms=30000", proxy.addr());
    tokio::task::spawn_blocking(move || {
        let held = Held::start(
            &url,
            &["--key", "deaf", "--ttl", "10s", "--grace", "1s"],
            Deaf::Both,
        );
        let pids = held.pids();

        proxy.set_mode(ProxyMode::Blackhole);
        let expires = server_expiry(&direct, "deaf");
        assert_stopped_before(&pids, expires);
        assert!(
            proxy.stats().bytes_blackholed > 0,
            "a renewal was sent into the black hole"
        );
        proxy.set_mode(ProxyMode::Reset);
        let (out, _) = held.finish(Duration::ZERO);
        assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("stopping the command"),
            "{}",
            stderr(&out)
        );
    })
    .await
    .unwrap();
}

/// tenure itself stopped (SIGSTOP, a debugger, a starved process) while its command runs:
/// nobody renews the lease, so the command must not run past it. The keeper stops the
/// group on tenure's schedule — the command dies of SIGTERM, its child only of SIGKILL —
/// before a contender's command starts; tenure, resumed, reports 76.
fn a_stopped_tenure_does_not_leave_its_command_running(url: &str) {
    let held = Held::start(
        url,
        &["--key", "frozen", "--ttl", "6s", "--grace", "1s"],
        Deaf::Child,
    );
    let pids = held.pids();
    held.signal(Signal::SIGSTOP);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let stamp = format!("date +%s%N > {}", marker.display());
    let contender = Tenure::spawn(&mut tenure(
        url,
        &[
            "run", "--key", "frozen", "--wait", "60s", "--", "sh", "-c", &stamp,
        ],
    ));
    let left = wait_stopped(&pids, Duration::from_secs(30));
    let stopped = SystemTime::now();
    assert_eq!(left, Vec::<i32>::new(), "the command outlived the lease");
    assert_eq!(contender.wait().status.code(), Some(0));
    let started: u64 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let started = SystemTime::UNIX_EPOCH + Duration::from_nanos(started);
    assert!(
        stopped < started,
        "the contender's command started {:?} before the first group was gone",
        stopped.duration_since(started).unwrap_or_default()
    );
    held.signal(Signal::SIGCONT);
    let (out, _) = held.finish(Duration::ZERO);
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("has not renewed it"),
        "{}",
        stderr(&out)
    );
}

/// A healthy command that runs for several TTLs is not stopped.
fn a_long_command_runs_past_its_ttl(url: &str) {
    let out = output(
        url,
        &["run", "--key", "long", "--ttl", "2s", "--", "sleep", "5"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_stopped_tenure_and_a_long_command() {
    on_redis(|url| {
        a_long_command_runs_past_its_ttl(&url);
        a_stopped_tenure_does_not_leave_its_command_running(&url);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_a_stopped_tenure_and_a_long_command() {
    on_zookeeper(|url| {
        a_long_command_runs_past_its_ttl(&url);
        a_stopped_tenure_does_not_leave_its_command_running(&url);
    })
    .await;
}

/// A signal while tenure waits for the lock: it exits 128+signal at once, and the
/// command never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_exits_without_running_the_command() {
    on_redis(|url| {
        let holder = Held::start(&url, &["--key", "busy"], Deaf::None);
        let marker = holder.dir.path().join("ran");
        let touch = format!("touch {}", marker.display());
        let waiter = Tenure::spawn(&mut tenure(
            &url,
            &[
                "run", "--key", "busy", "--wait", "60s", "--", "sh", "-c", &touch,
            ],
        ));
        let since = Instant::now();
        while !catches(waiter.pid(), Signal::SIGTERM) {
            assert!(since.elapsed() < Duration::from_secs(30), "never waited");
            std::thread::sleep(Duration::from_millis(10));
        }
        kill(waiter.pid(), Signal::SIGTERM).unwrap();
        let out = waiter.wait();
        assert_eq!(out.status.code(), Some(143));
        assert!(!marker.exists(), "the command ran without the lock");
        holder.signal(Signal::SIGTERM);
        assert_eq!(holder.finish(Duration::ZERO).0.status.code(), Some(143));
    })
    .await;
}

/// `nohup tenure run …`: a SIGHUP ignored at start stays ignored (the command runs on);
/// SIGTERM still stops it.
#[test]
fn an_ignored_sighup_stays_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let script = command_script(dir.path(), Deaf::None);
    let mut nohup = Command::new("env");
    nohup
        .args(["--default-signal=INT,TERM", "--ignore-signal=HUP"])
        .arg(env!("CARGO_BIN_EXE_tenure"))
        .args([
            "--url",
            "memory://",
            "run",
            "--key",
            "k",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env_remove("TENURE_URL")
        .stderr(Stdio::piped());
    let held = Held::spawned(Tenure::spawn(&mut nohup), dir);
    held.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        wait_stopped(&held.pids(), Duration::ZERO).len(),
        2,
        "SIGHUP stopped the command"
    );
    held.signal(Signal::SIGTERM);
    let (out, left) = held.finish(Duration::ZERO);
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(left, Vec::<i32>::new());
}

#[test]
fn a_command_killed_by_a_signal_exits_128_plus_it() {
    let out = output(
        "memory://",
        &["run", "--key", "k", "--", "sh", "-c", "kill -USR1 $$"],
    );
    assert_eq!(out.status.code(), Some(128 + Signal::SIGUSR1 as i32));
}

#[test]
fn a_grace_that_does_not_fit_in_the_ttl_is_refused() {
    let out = output(
        "memory://",
        &[
            "run", "--key", "k", "--ttl", "2s", "--grace", "5s", "--", "true",
        ],
    );
    assert_eq!(out.status.code(), Some(78));
    let err = stderr(&out);
    assert!(err.contains("--grace 5s does not fit in --ttl 2s"), "{err}");
    assert!(err.contains("use --grace 800ms or less"), "{err}");
}

#[test]
fn a_missing_command_exits_127() {
    let out = output(
        "memory://",
        &["run", "--key", "k", "--", "/nonexistent/cmd"],
    );
    assert_eq!(out.status.code(), Some(127));
}

/// A command that writes `$VAR` to `file` (whole, by a rename) once it runs, then sleeps.
fn reporting(var: &str, file: &Path) -> String {
    format!(
        "echo \"${var}\" > {0}.tmp && mv {0}.tmp {0} && sleep 300",
        file.display()
    )
}

/// What a [`reporting`] command wrote to `file`, waiting up to 20 s for it to run.
fn reported(file: &Path) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            return text.trim().to_owned();
        }
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(20),
            "{} never ran",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `run --key pool --permits 2 --wait WAIT -- CMD…`
fn pool_run<'a>(wait: &'a str, cmd: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--key",
        "pool",
        "--permits",
        "2",
        "--wait",
        wait,
        "--",
    ];
    args.extend_from_slice(cmd);
    args
}

/// `--permits 2`: two runs of one key at once, each on its own permit (named by
/// TENURE_KEY), a third is busy, one giving `--permits 3` is refused (78); a finished
/// run's permit goes to the next.
fn permits_admit_that_many_runs(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let holder = |name: &str| {
        let file = dir.path().join(name);
        let script = reporting("TENURE_KEY", &file);
        let run = Tenure::spawn(&mut tenure(url, &pool_run("20s", &["sh", "-c", &script])));
        (run, file)
    };
    let (first, first_file) = holder("first");
    let (second, second_file) = holder("second");
    let (a, b) = (reported(&first_file), reported(&second_file));
    let named = a.starts_with("pool#permit-") && b.starts_with("pool#permit-");
    assert!(named, "TENURE_KEY: {a} {b}");
    assert_ne!(a, b, "two runs on one permit");

    let busy = output(url, &pool_run("0s", &["true"]));
    assert_eq!(
        busy.status.code(),
        Some(75),
        "a third run: {}",
        stderr(&busy)
    );
    // A run sized for three beside them is refused, not admitted on a third permit.
    let wider = [
        "run",
        "--key",
        "pool",
        "--permits",
        "3",
        "--wait",
        "1s",
        "--",
        "true",
    ];
    let wider = output(url, &wider);
    assert_eq!(
        wider.status.code(),
        Some(78),
        "a run of 3: {}",
        stderr(&wider)
    );
    let err = stderr(&wider);
    assert!(
        err.contains("held with 2 permits") && err.contains("gives 3"),
        "{err}"
    );

    kill(first.pid(), Signal::SIGTERM).unwrap();
    let stopped = first.wait().status.code();
    assert_eq!(stopped, Some(128 + Signal::SIGTERM as i32));
    let next = output(url, &pool_run("10s", &["sh", "-c", "echo \"$TENURE_KEY\""]));
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    assert_eq!(
        String::from_utf8_lossy(&next.stdout).trim(),
        a,
        "the freed permit"
    );
    drop(second);

    let refused = output(
        url,
        &["run", "--key", "pool", "--permits", "0", "--", "true"],
    );
    assert_eq!(refused.status.code(), Some(78));
    let err = stderr(&refused);
    assert!(err.contains("1 to 64 permits, not 0"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_permits_admit_that_many_runs() {
    on_redis(|url| permits_admit_that_many_runs(&url)).await;
}

/// `tenure elect`: the first candidate leads and runs its command with the term as
/// TENURE_FENCE, `inspect` shows its value; the second stands by without running its
/// command until the leader stops, then leads with a higher term.
fn elect_runs_only_the_leader(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let candidate = |value: &str| {
        let file = dir.path().join(value);
        let script = reporting("TENURE_FENCE", &file);
        let args = [
            "elect", "--name", "svc", "--value", value, "--ttl", "5s", "--", "sh", "-c", &script,
        ];
        (Tenure::spawn(&mut tenure(url, &args)), file)
    };
    let term = |file: &PathBuf| {
        reported(file)
            .parse::<u64>()
            .expect("TENURE_FENCE is a term")
    };
    let leader_value = || {
        let shown = output(url, &["inspect", "svc"]);
        let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
        shown["label"].as_str().map(str::to_owned)
    };
    let (a, a_file) = candidate("host-a");
    let a_term = term(&a_file);
    assert_eq!(leader_value().as_deref(), Some("host-a"));
    let (b, b_file) = candidate("host-b");
    // b is queued or polling: give it time to (wrongly) start its command.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !b_file.exists(),
        "the standby ran its command while host-a led"
    );
    assert_eq!(leader_value().as_deref(), Some("host-a"));

    kill(a.pid(), Signal::SIGTERM).unwrap();
    assert_eq!(a.wait().status.code(), Some(128 + Signal::SIGTERM as i32));
    let b_term = term(&b_file);
    assert!(b_term > a_term, "term {b_term} after {a_term}");
    assert_eq!(leader_value().as_deref(), Some("host-b"));
    drop(b);

    let refused = output(
        url,
        &["elect", "--name", "svc", "--value", "", "--", "true"],
    );
    assert_eq!(refused.status.code(), Some(78), "{}", stderr(&refused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_elect_runs_only_the_leader() {
    on_redis(|url| elect_runs_only_the_leader(&url)).await;
}

/// The lock keys on an etcd member, oldest first, read with `etcdctl` (the real client
/// from apt).
fn etcd_queue(endpoint: &str) -> Vec<String> {
    let out = Command::new("etcdctl")
        .args([
            "--endpoints",
            endpoint,
            "get",
            "--prefix",
            "",
            "--keys-only",
        ])
        .args(["--sort-by=CREATE", "--order=ASCEND"])
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl runs");
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Waits until `etcd_queue` holds `len` keys; returns them.
fn etcd_queued(endpoint: &str, len: usize) -> Vec<String> {
    let started = Instant::now();
    loop {
        let keys = etcd_queue(endpoint);
        if keys.len() == len {
            return keys;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "queue: {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Defect (issue 58, 9), as it was found: three `tenure run` on one etcd key — holder H,
/// waiter W, waiter C behind W. W's queue key deleted with `etcdctl del` (its lease kept
/// alive: what a client suspend does to a session lease, and what an operator's delete
/// does), then H ends: W and C both ran their commands. Now W queues again behind C, and
/// the commands run one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_waiter_whose_key_was_deleted_never_runs_beside_the_next() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let endpoint = cluster.members()[0].endpoint();
    let url = format!("etcd://{}/runs", cluster.members()[0].addr());
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        let run = |name: &str| {
            let file = dir.path().join(name);
            let script = reporting("TENURE_FENCE", &file);
            let args = [
                "run", "--key", "k", "--wait", "30s", "--", "sh", "-c", &script,
            ];
            (Tenure::spawn(&mut tenure(&url, &args)), file)
        };
        let (holder, holder_file) = run("holder");
        reported(&holder_file);
        let (waiter, waiter_file) = run("waiter");
        let queued = etcd_queued(&endpoint, 2);
        let deleted = Command::new("etcdctl")
            .args(["--endpoints", &endpoint, "del", &queued[1]])
            .env("ETCDCTL_API", "3")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&deleted.stdout).trim(),
            "1",
            "the fault fired: the waiter's key is deleted"
        );
        let (next, next_file) = run("next");
        etcd_queued(&endpoint, 2);
        kill(holder.pid(), Signal::SIGTERM).unwrap();
        holder.wait();
        let fence = reported(&next_file);
        // The waiter, had it been granted, would have run by now: it was first to wake.
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            !waiter_file.exists(),
            "the waiter ran beside the next holder (fence {fence})"
        );
        kill(next.pid(), Signal::SIGTERM).unwrap();
        next.wait();
        let later = reported(&waiter_file);
        assert!(
            later.parse::<u64>().unwrap() > fence.parse::<u64>().unwrap(),
            "the waiter ran after, with a later fence: {later} > {fence}"
        );
        kill(waiter.pid(), Signal::SIGTERM).unwrap();
        waiter.wait();
    })
    .await
    .unwrap();
}

/// The keeper's switch is a socket in a private directory under `TMPDIR`, removed once the
/// keeper connected: nothing is left after the run. (The command may start before tenure
/// accepted the keeper's connection, so it may still see the directory.)
#[test]
fn the_switch_leaves_no_file_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tenure("memory://", &["run", "--key", "k", "--", "true"])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("tenure runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A `TMPDIR` too long for a socket path is passed over for `/tmp`: the run works.
#[test]
fn a_tmpdir_too_long_for_a_socket_falls_back_to_tmp() {
    let tmp = tempfile::tempdir().unwrap();
    let long = tmp.path().join("d".repeat(120));
    std::fs::create_dir(&long).unwrap();
    let out = tenure("memory://", &["run", "--key", "k", "--", "true"])
        .env("TMPDIR", &long)
        .output()
        .expect("tenure runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(&long).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `--shared` runs the command as a reader where the backend has shared locks, and is
/// refused with the configuration exit code (78) where it has none (Redlock), before the
/// command runs; with `--permits` it is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runs_as_a_reader_or_is_refused() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.nodes()[0]
        .url()
        .replacen("redis://", "redlock://", 1);
    tokio::task::spawn_blocking(move || shared_runs_or_is_refused_on(&url))
        .await
        .unwrap();
}

fn shared_runs_or_is_refused_on(without_shared: &str) {
    let out = output(
        "memory://",
        &[
            "run",
            "--shared",
            "--key",
            "k",
            "--",
            "sh",
            "-c",
            "echo ran $TENURE_KEY",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran k");
    let out = output(
        without_shared,
        &["run", "--shared", "--key", "k", "--", "echo", "ran"],
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no shared (read) locks"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "the command ran: {:?}", out.stdout);
    let out = output(
        "memory://",
        &[
            "run",
            "--shared",
            "--permits",
            "2",
            "--key",
            "k",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// `tenure run --shared` on etcd: two readers' commands run at once, a writer's run is
/// refused while they do (exit 75 with no wait), and a writer waiting holds back a
/// reader that comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_shared_runs_read_together_and_writers_alone() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let endpoint = cluster.members()[0].endpoint();
    let url = format!("etcd://{}/runs", cluster.members()[0].addr());
    tokio::task::spawn_blocking(move || {
        readers_together_writers_alone(&url, &|| drop(etcd_queued(&endpoint, 3)))
    })
    .await
    .unwrap();
}

/// The same on files: the writer in line holds byte 0 of the key's gate file.
#[test]
fn on_files_shared_runs_read_together_and_writers_alone() {
    let locks = tempfile::tempdir().unwrap();
    let url = format!("file://{}", locks.path().display());
    let gate = locks.path().join("k.gate");
    readers_together_writers_alone(&url, &|| {
        let started = Instant::now();
        while !writer_waits_at(&gate) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no writer at {gate:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

/// Whether a process holds an exclusive lock on byte 0 of `gate` (a file backend's writer
/// in line), asked with `F_OFD_GETLK`, which takes nothing.
fn writer_waits_at(gate: &Path) -> bool {
    use nix::fcntl::{fcntl, FcntlArg};
    let Ok(file) = std::fs::File::open(gate) else {
        return false;
    };
    let mut probe = nix::libc::flock {
        l_type: nix::libc::F_RDLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 1,
        l_pid: 0,
    };
    fcntl(&file, FcntlArg::F_OFD_GETLK(&mut probe)).unwrap();
    probe.l_type == nix::libc::F_WRLCK as i16
}

/// Two readers' runs of `url`'s key `k` at once, a writer's refused beside them, a writer
/// in line (`writer_in_line` returns once it is) holding back a later reader and running
/// only once both readers stopped, with a larger fence.
fn readers_together_writers_alone(url: &str, writer_in_line: &dyn Fn()) {
    let url = url.to_owned();
    {
        let dir = tempfile::tempdir().unwrap();
        let stop = |run: Tenure| {
            kill(run.pid(), Signal::SIGTERM).unwrap();
            run.wait();
        };
        let run = |name: &str, extra: &[&str]| {
            let file = dir.path().join(name);
            let script = reporting("TENURE_FENCE", &file);
            let mut args = vec!["run", "--key", "k"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "sh", "-c", &script]);
            (Tenure::spawn(&mut tenure(&url, &args)), file)
        };
        let (first, first_file) = run("first", &["--shared"]);
        let first_fence: u64 = reported(&first_file).parse().unwrap();
        let (second, second_file) = run("second", &["--shared", "--wait", "0s"]);
        let second_fence: u64 = reported(&second_file).parse().unwrap();
        assert!(
            second_fence > first_fence,
            "{second_fence} after {first_fence}"
        );
        let refused = output(&url, &["run", "--key", "k", "--wait", "0s", "--", "true"]);
        assert_eq!(refused.status.code(), Some(75), "{}", stderr(&refused));
        // A writer in line, then a reader behind it: the reader waits for the writer.
        let (writer, writer_file) = run("writer", &["--wait", "60s"]);
        writer_in_line();
        let late = output(
            &url,
            &[
                "run", "--shared", "--key", "k", "--wait", "0s", "--", "true",
            ],
        );
        assert_eq!(late.status.code(), Some(75), "{}", stderr(&late));
        assert!(
            !writer_file.exists(),
            "the writer's command ran beside two readers"
        );
        stop(first);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !writer_file.exists(),
            "the writer's command ran beside a reader"
        );
        stop(second);
        let writer_fence: u64 = reported(&writer_file).parse().unwrap();
        assert!(
            writer_fence > second_fence,
            "{writer_fence} after {second_fence}"
        );
        stop(writer);
    }
}
