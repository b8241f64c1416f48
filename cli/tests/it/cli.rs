//! The `tenure` CLI end to end: against `memory://` and live servers (Redis, etcd,
//! ZooKeeper, Postgres).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tenure_etcd::lab::EtcdCluster;
use tenure_postgres::lab::Postgres;
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};

fn tenure(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenure"));
    command
        .args(args)
        .env_remove("TENURE_URL")
        .env_remove("TENURE_TTL")
        .env_remove("TENURE_WAIT");
    command
}

fn output(args: &[&str]) -> Output {
    tenure(args).output().expect("tenure runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn run_passes_fence_and_key_and_exit_status() {
    let out = output(&[
        "--url",
        "memory://",
        "run",
        "--key",
        "job",
        "--",
        "sh",
        "-c",
        "echo $TENURE_FENCE $TENURE_KEY; exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command's status is passed through"
    );
    assert_eq!(stdout(&out), "1 job");
}

/// With nothing configured, `tenure run` locks with this host's lock directory and
/// says which; `inspect` reads the same one, and `acquire` refuses it (the lock would end
/// with the command).
#[test]
fn with_nothing_configured_run_locks_with_this_hosts_files() {
    let key = format!("tenure-test-default-{}", std::process::id());
    let out = output(&["run", "--key", &key, "--", "sh", "-c", "echo $TENURE_FENCE"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let said = "locking with the files in ";
    let dir = err
        .split_once(said)
        .and_then(|(_, rest)| rest.split_once(" (this host"))
        .map(|(dir, _)| dir.to_owned())
        .unwrap_or_else(|| panic!("no note naming the directory: {err}"));
    assert_eq!(
        dir,
        tenure::file::default_dir().unwrap().display().to_string()
    );
    assert!(
        stdout(&out).parse::<u64>().is_ok_and(|t| t > 0),
        "{}",
        stdout(&out)
    );
    assert!(std::path::Path::new(&format!("{dir}/{key}.state")).exists());
    let out = output(&["inspect", &key]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains(r#""held":false"#), "{}", stdout(&out));
    let out = output(&["acquire", "--key", &key]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use `tenure run`"));
    for file in ["lock", "state"] {
        let _ = std::fs::remove_file(format!("{dir}/{key}.{file}"));
    }
}

/// `tenure run` with several `--key`s holds them all or none: the command gets their
/// tokens and names joined by commas (in key order, whatever the order given), a run on
/// any one of them is busy meanwhile, and a key that is held keeps the whole run out.
#[test]
fn run_with_several_keys_holds_them_all_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let out = output(&[
        "--url",
        &url,
        "run",
        "--key",
        "b",
        "--key",
        "a",
        "--",
        "sh",
        "-c",
        "echo \"$TENURE_KEY $TENURE_FENCE\"",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = stdout(&out);
    let (keys, fences) = printed.split_once(' ').unwrap();
    assert_eq!(keys, "a,b");
    let fences: Vec<u64> = fences.split(',').map(|t| t.parse().unwrap()).collect();
    assert_eq!(fences.len(), 2, "{printed}");
    // While a run holds a and b, a run on b is busy; one on c and a gets neither.
    let mut holding = tenure(&[
        "--url", &url, "run", "--key", "a", "--key", "b", "--", "sleep", "30",
    ])
    .spawn()
    .unwrap();
    let mut busy = None;
    for _ in 0..100 {
        let out = output(&[
            "--url", &url, "run", "--key", "b", "--wait", "0s", "--", "true",
        ]);
        if out.status.code() == Some(75) {
            busy = Some(out);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        busy.is_some(),
        "a run on b was never busy while a and b were held"
    );
    // `0` sorts first: it is taken, then `b` is found held, and `0` is given back.
    let out = output(&[
        "--url", &url, "run", "--key", "b", "--key", "0", "--wait", "0s", "--", "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = output(&["--url", &url, "inspect", "0"]);
    assert!(
        stdout(&out).contains(r#""held":false"#),
        "0 was given back: {}",
        stdout(&out)
    );
    assert!(
        dir.path().join("0.state").exists(),
        "0 was taken before b was found held"
    );
    // Stopped as a user stops it: tenure stops the command and releases.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(holding.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopped = holding.wait().unwrap();
    assert_eq!(stopped.code(), Some(128 + 15), "{stopped:?}");
    for key in ["a", "b"] {
        let out = output(&["--url", &url, "inspect", key]);
        assert!(
            stdout(&out).contains(r#""held":false"#),
            "{key} released: {}",
            stdout(&out)
        );
    }
    // One key only where several make no sense.
    for args in [
        &[
            "run",
            "--permits",
            "2",
            "--key",
            "a",
            "--key",
            "b",
            "--",
            "true",
        ][..],
        &["acquire", "--key", "a", "--key", "b"][..],
        &["run", "--key", "a,b", "--key", "c", "--", "true"][..],
    ] {
        let out = output(&[&["--url", &url][..], args].concat());
        assert_eq!(out.status.code(), Some(78), "{args:?}");
    }
}

#[test]
fn config_errors_are_clear_and_redacted() {
    let out = output(&[
        "--url",
        "file://elsewhere/var/lock",
        "run",
        "--key",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("local to this host"));

    let out = output(&["--url", "redis://u:hunter2@127.0.0.1:1/0", "inspect", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    let out = output(&["--url", "nope://x", "inspect", "k"]);
    assert_eq!(out.status.code(), Some(78));

    let out = output(&["--url", "memory://", "run", "--key", "", "--", "true"]);
    assert_eq!(out.status.code(), Some(78), "empty key is invalid input");
}

/// Issue 18 item 7: an unknown URL option (or a misspelt key of the config file's backend
/// table) is exit 78 with a message naming it and the known options; Redis ignored it.
#[test]
fn unknown_url_options_exit_78_naming_them() {
    let out = output(&[
        "--url",
        "redis://u:hunter2@127.0.0.1:1/?bogus=1",
        "run",
        "--key",
        "k",
        "--",
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("\"bogus\"") && err.contains("command_timeout_ms"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.toml");
    std::fs::write(
        &path,
        "url = \"redis://127.0.0.1:1\"\n[redis]\ncomand_timeout_ms = 300\n",
    )
    .unwrap();
    let out = output(&[
        "--config",
        path.to_str().unwrap(),
        "run",
        "--key",
        "k",
        "--",
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("\"comand_timeout_ms\"") && err.contains("command_timeout_ms"),
        "{err}"
    );
}

/// The `ttl_ms` of the lease `tenure acquire` prints (memory://, or the config file's URL).
fn acquired_ttl_ms(config: Option<&std::path::Path>, env: &[(&str, &str)], flags: &[&str]) -> u64 {
    let mut args: Vec<&str> = match config {
        Some(path) => vec!["--config", path.to_str().unwrap()],
        None => vec!["--url", "memory://"],
    };
    args.extend(["acquire", "--key", "k"]);
    args.extend(flags);
    let out = tenure(&args).envs(env.iter().copied()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?} {env:?}: {out:?}");
    let lease: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    lease["ttl_ms"].as_u64().unwrap()
}

/// Issue 18 item 7: the TTL comes from `--ttl`, else `TENURE_TTL`, else the config file's
/// `ttl`, else 30 s. `TENURE_TTL` was ignored.
#[test]
fn ttl_precedence_flag_env_file_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenure.toml");
    std::fs::write(&file, "url = \"memory://\"\nttl = \"5s\"\n").unwrap();
    let file = Some(file.as_path());
    let env = [("TENURE_TTL", "7s")];
    assert_eq!(acquired_ttl_ms(None, &[], &[]), 30_000, "default");
    assert_eq!(acquired_ttl_ms(file, &[], &[]), 5_000, "file over default");
    assert_eq!(acquired_ttl_ms(None, &env, &[]), 7_000, "env over default");
    assert_eq!(acquired_ttl_ms(file, &env, &[]), 7_000, "env over file");
    assert_eq!(
        acquired_ttl_ms(file, &env, &["--ttl", "9s"]),
        9_000,
        "flag over env and file"
    );
}

/// Issue 18 item 7: a malformed `TENURE_TTL` / `TENURE_WAIT` (or a zero TTL from any
/// source) is exit 78 naming it, never ignored; `TENURE_TTL=abc` was ignored (exit 0).
#[test]
fn malformed_ttl_and_wait_exit_78_naming_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.toml");
    std::fs::write(&zero, "url = \"memory://\"\nttl = \"0s\"\n").unwrap();
    let zero = zero.to_str().unwrap();
    let run = ["run", "--key", "k", "--", "true"];
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 7] = [
        (
            &["--url", "memory://"],
            &[("TENURE_TTL", "abc")],
            "TENURE_TTL",
        ),
        (
            &["--url", "memory://"],
            &[("TENURE_TTL", "0s")],
            "TENURE_TTL",
        ),
        (&["--url", "memory://"], &[("TENURE_TTL", "")], "TENURE_TTL"),
        (
            &["--url", "memory://"],
            &[("TENURE_WAIT", "-1")],
            "TENURE_WAIT",
        ),
        (
            &["--url", "memory://"],
            &[("TENURE_WAIT", "soon")],
            "TENURE_WAIT",
        ),
        (&["--config", zero], &[], "ttl"),
        (&["--config", zero], &[("TENURE_TTL", "5s")], "ttl"),
    ];
    for (global, env, named) in cases {
        for command in [&run[..], &["acquire", "--key", "k"]] {
            let args = [global, command].concat();
            let out = tenure(&args).envs(env.iter().copied()).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{args:?} {env:?}: {err}");
            assert!(err.contains(named), "{args:?} {env:?}: {err}");
        }
    }
    let out = output(&[
        "--url",
        "memory://",
        "run",
        "--key",
        "k",
        "--ttl",
        "0s",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
}

#[test]
fn config_file_and_env_choose_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.toml");
    std::fs::write(&path, "url = \"memory://\"\nttl = \"5s\"\n").unwrap();
    let out = output(&[
        "--config",
        path.to_str().unwrap(),
        "run",
        "--key",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = tenure(&["inspect", "k"])
        .env("TENURE_URL", "memory://")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("\"held\":false"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_redis_second_run_is_busy_and_acquire_release_work() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();

    let mut first = tenure(&[
        "--url", &url, "run", "--key", "cron", "--ttl", "2s", "--", "sleep", "8",
    ])
    .spawn()
    .unwrap();
    // Wait until the first run holds the lock.
    let started = Instant::now();
    loop {
        let out = output(&["--url", &url, "inspect", "cron"]);
        if stdout(&out).contains("\"held\":true") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "first run never took the lock"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = output(&[
        "--url", &url, "run", "--key", "cron", "--wait", "200ms", "--", "true",
    ]);
    assert_eq!(
        second.status.code(),
        Some(75),
        "busy: {}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        first.wait().unwrap().code(),
        Some(0),
        "renewed past its 2 s ttl and finished"
    );

    scripted_acquire_extend_release(&url);
    wait_precedence_flag_env_file(&url);
}

/// How long a `tenure run` on a held key waited before it exited 75 ("timed out after …").
fn waited_when_busy(url_or_config: [&str; 2], env: &[(&str, &str)], flags: &[&str]) -> Duration {
    let mut args = url_or_config.to_vec();
    args.extend(["run", "--key", "held"]);
    args.extend(flags);
    args.extend(["--", "true"]);
    let out = tenure(&args).envs(env.iter().copied()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{args:?} {env:?}: {err}");
    let waited = err
        .split("timed out after ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{err}"));
    // `Duration`'s Debug: `2.0031s`, `412.5ms`, `80µs`, `5ns`.
    let split = waited
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(waited.len());
    let (number, unit) = waited.split_at(split);
    let number: f64 = number.parse().unwrap_or_else(|e| panic!("{waited}: {e}"));
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" => 1e-6,
        "ns" => 1e-9,
        other => panic!("{waited}: unit {other:?}"),
    };
    Duration::from_secs_f64(number * scale)
}

/// Issue 18 item 7: the wait comes from `--wait`, else `TENURE_WAIT`, else the config
/// file's `wait` (else 10 s). `TENURE_WAIT` was ignored. Each step's value is far from
/// the next one's, so a loaded machine cannot blur them.
fn wait_precedence_flag_env_file(url: &str) {
    let held = output(&["--url", url, "acquire", "--key", "held", "--ttl", "5m"]);
    assert_eq!(held.status.code(), Some(0), "{held:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenure.toml");
    std::fs::write(&file, format!("url = \"{url}\"\nwait = \"2s\"\n")).unwrap();
    let file = ["--config", file.to_str().unwrap()];
    let env = [("TENURE_WAIT", "0s")];

    let waited = waited_when_busy(file, &[], &[]);
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(10)).contains(&waited),
        "file: {waited:?}"
    );
    let waited = waited_when_busy(file, &env, &[]);
    assert!(waited < Duration::from_secs(2), "env over file: {waited:?}");
    let waited = waited_when_busy(["--url", url], &env, &[]);
    assert!(
        waited < Duration::from_secs(2),
        "env over default: {waited:?}"
    );
    let waited = waited_when_busy(file, &[("TENURE_WAIT", "30s")], &["--wait", "0s"]);
    assert!(waited < Duration::from_secs(2), "flag over env: {waited:?}");
}

/// `acquire` prints a lease; `inspect` sees it with its label; `extend` and `release`
/// take it on stdin; a second `release` says it is no longer held (exit 76).
fn scripted_acquire_extend_release(url: &str) {
    let acquire = ["--url", url, "acquire", "--key", "script", "--ttl", "30s"];
    let refused = output(&[&acquire[..], &["--label", "two\nlines"]].concat());
    assert_eq!(
        refused.status.code(),
        Some(78),
        "a control character in the label"
    );
    let acquired = output(&[&acquire[..], &["--label", "host-a:cron"]].concat());
    assert_eq!(
        acquired.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&acquired.stderr)
    );
    let lease = stdout(&acquired);
    assert!(lease.contains("\"token\":"), "{lease}");
    let inspected = stdout(&output(&["--url", url, "inspect", "script"]));
    assert!(inspected.contains("\"held\":true"), "{inspected}");
    assert!(
        inspected.contains("\"label\":\"host-a:cron\""),
        "{inspected}"
    );
    assert!(inspected.contains("\"foreign\":false"), "{inspected}");
    for (command, expected) in [("extend", 0), ("release", 0), ("release", 76)] {
        let mut child = tenure(&["--url", url, command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "{lease}").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let inspected = stdout(&output(&["--url", url, "inspect", "script"]));
    assert!(inspected.contains("\"held\":false"), "{inspected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_etcd_scripts_carry_the_lease_handle() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    scripted_acquire_extend_release(&format!("etcd://{}/cli", cluster.members()[0].addr()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_backends_refuse_acquire_but_run_works() {
    let server = Postgres::start().await.unwrap();
    let url = server.url();
    let out = output(&["--url", &url, "acquire", "--key", "k"]);
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use `tenure run`"), "{err}");
    let out = output(&[
        "--url",
        &url,
        "run",
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        "echo $TENURE_FENCE",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).parse::<u64>().is_ok(), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_lock_server_stops_the_command() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = format!("{}?command_timeout_ms=300", cluster.urls()[0]);
    let dir = tempfile::tempdir().unwrap();
    let (running, marker) = (dir.path().join("running"), dir.path().join("finished"));
    let script = format!(
        "touch {}; sleep 20; touch {}",
        running.display(),
        marker.display()
    );
    let child = tenure(&[
        "--url", &url, "run", "--key", "k", "--ttl", "1s", "--grace", "300ms", "--", "sh", "-c",
        &script,
    ])
    .spawn()
    .unwrap();
    // The command runs only once the lock is held: kill the server after that, not
    // after a guess at how long start-up takes.
    let by = Instant::now() + Duration::from_secs(20);
    while !running.exists() {
        assert!(Instant::now() < by, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.nodes()[0].kill().await.unwrap();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "lease lost");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped promptly"
    );
    assert!(!marker.exists(), "the command did not run to completion");
}

/// Issue 18 item 6 (ZooKeeper): with no `session_timeout_ms` in the URL, `tenure run`
/// asks for a session as long as `--ttl`, so a SIGKILLed holder's lock is free about a
/// TTL later. Before, the session was the default 10 s whatever `--ttl` said.
///
/// The ensemble's `tickTime` is 500 ms, so sessions may be 1–10 s: the default 10 s is
/// granted as asked, and `--ttl 3s` gets 3 s. The killed holder renewed (touching its
/// session) every second, so the server expires a 10 s session at least 9 s after the
/// kill, and a 3 s one at most 3.5 s after it; the bound of 8 s sits between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_session_follows_the_ttl_so_a_killed_holder_frees_the_lock_soon() {
    let ensemble = ZkEnsemble::start(ZkOptions::default().tick_time_ms(500))
        .await
        .unwrap();
    let url = format!("zk://{}/cli?tick_ms=500", ensemble.connect_string());
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("command.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder = tenure(&[
        "--url", &url, "run", "--key", "job", "--ttl", "3s", "--", "sh", "-c", &script,
    ])
    .spawn()
    .unwrap();
    let started = Instant::now();
    let command_pid = loop {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse::<i32>().ok()) {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the holder never ran its command"
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    holder.kill().unwrap();
    let killed = Instant::now();
    let status = holder.wait().unwrap();
    // The orphaned command is ours to stop (it may already be gone).
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(command_pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "SIGKILLed while holding: {status:?}"
    );

    let second = output(&[
        "--url", &url, "run", "--key", "job", "--wait", "60s", "--", "true",
    ]);
    let took = killed.elapsed();
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    eprintln!("the next holder got the lock {took:?} after the kill");
    assert!(
        took < Duration::from_secs(8),
        "the killed holder's session outlived its 3 s TTL: the lock was free after {took:?}"
    );
}

/// `tenure --url memory:// bench ARGS… --json`, which must succeed: its JSON lines.
fn memory_bench(args: &[&str]) -> Vec<serde_json::Value> {
    let out = output(&[&["--url", "memory://", "bench"], args, &["--json"]].concat());
    assert!(out.status.success(), "{out:?}");
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn bench_repeat_reports_medians_and_contended_fairness() {
    let lines = memory_bench(&["--mode", "seq,contended", "--secs", "0.2", "--repeat", "3"]);
    assert_eq!(
        lines.len(),
        2,
        "one line per mode, not per round: {lines:?}"
    );
    for line in &lines {
        assert_eq!(line["rounds"], 3, "{line}");
        assert!(line["cycles"].as_u64().unwrap() > 0, "{line}");
    }
    assert!(lines[0].get("fairness").is_none(), "seq has no fairness");
    let fairness = lines[1]["fairness"]
        .as_f64()
        .expect("contended reports fairness");
    // The 16 in-process clients share one memory:// table (16 tables would not contend)
    // and each gets its turn: none starved.
    assert!(fairness > 0.0 && fairness <= 1.0, "{fairness}");
    assert!(
        lines[1]["handoffs_per_s"].as_f64().unwrap() > 0.0,
        "{}",
        lines[1]
    );
    // Out of range: refused by the parser, nothing run.
    let out = output(&["--url", "memory://", "bench", "--repeat", "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `bench --election`: campaigns and resignations, marked as an election's lines; in
/// `contended` every one of 16 candidates leads in turn. With `--permits`: refused.
#[test]
fn bench_election_campaigns_and_hands_leadership_over() {
    let lines = memory_bench(&["--election", "--mode", "seq,contended", "--secs", "0.3"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["election"], true, "{line}");
        assert!(line["cycles"].as_u64().unwrap() > 0, "{line}");
        assert_eq!(line["errors"], 0, "{line}");
    }
    assert!(
        lines[1]["fairness"].as_f64().unwrap() > 0.0,
        "a candidate never led: {}",
        lines[1]
    );
    let out = output(&[
        "--url",
        "memory://",
        "bench",
        "--election",
        "--permits",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `bench --held` reports how many leases a backend allowed and its error past the limit
/// (Postgres: one connection per held lock, up to `max_held`), instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_held_reports_the_limit_and_the_error_past_it() {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?max_held=3", server.url());
    let out = output(&[
        "--url", &url, "bench", "--mode", "seq", "--secs", "0.2", "--ttl", "3s", "--held", "5",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let held: serde_json::Value = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|l| l["mode"] == "held")
        .expect("a held line");
    assert_eq!(held["leases"], 5, "{held}");
    assert_eq!(held["held"], 3, "{held}");
    assert_eq!(held["lost"], 0, "{held}");
    let refused = held["refused"].as_str().expect("the refusal");
    assert!(refused.contains("max_held=3"), "{refused}");
}

/// `bench --peers` runs zookeeper-client's lock recipe next to tenure on ZooKeeper, in
/// every mode (16 recipe clients contend in `contended`), and tenure's lines carry the
/// ratio to it; a backend without a peer prints no peer line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_peers_runs_the_zookeeper_recipe_beside_tenure() {
    let ensemble = ZkEnsemble::start(ZkOptions::default()).await.unwrap();
    let url = format!("zk://{}/bench", ensemble.connect_string());
    let out = output(&[
        "--url",
        &url,
        "bench",
        "--mode",
        "seq,contended",
        "--secs",
        "0.5",
        "--peers",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let find = |mode: &str, implementation: &str| {
        lines
            .iter()
            .find(|l| l["mode"] == mode && l["impl"] == implementation)
            .unwrap_or_else(|| panic!("no {mode} {implementation} line in {lines:?}"))
    };
    for mode in ["seq", "contended"] {
        let recipe = find(mode, "recipe");
        assert!(recipe["cycles"].as_u64().unwrap() > 0, "{recipe}");
        assert_eq!(recipe["errors"], 0, "{recipe}");
        let ours = find(mode, "tenure");
        assert!(ours["peer_ratio"].as_f64().unwrap() > 0.0, "{ours}");
        assert!(
            ours.get("ratio").is_none(),
            "no floor was asked for: {ours}"
        );
    }
    let handoffs = find("contended", "recipe")["handoffs_per_s"].as_f64();
    assert!(
        handoffs.unwrap() > 0.0,
        "the recipe's 16 clients hand the lock over"
    );

    let lines = memory_bench(&["--mode", "seq", "--secs", "0.2", "--peers"]);
    assert_eq!(lines.len(), 1, "memory:// has no peer: {lines:?}");
    assert!(lines[0].get("peer_ratio").is_none(), "{}", lines[0]);
    // A peer is a lock: a semaphore or an election bench has none to compare with.
    for other in [["--permits", "2"].as_slice(), ["--election"].as_slice()] {
        let out = output(&[&["--url", "memory://", "bench", "--peers"], other].concat());
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }
}
