//! `tenure matrix` fails when the matrix disagrees with the table of expected verdicts,
//! names what disagreed on stderr, and `--allow-mismatch` turns that into a warning.

use std::process::{Command, Output};

use crate::clusters_file;

fn matrix(clusters: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenure"))
        // The mismatch is in the declared capabilities, which need no cell: one that
        // cannot be injected into a user's servers, so none runs.
        .args(["matrix", "--faults", "minority-loss", "--out"])
        .arg(out)
        .arg("--clusters")
        .arg(clusters)
        .args(extra)
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_fails_the_run_unless_allowed() {
    let _turn = crate::one_at_a_time_async().await;
    let dir = tempfile::tempdir().unwrap();
    // A Redis server filed under "postgres": Redis declares a clock-floored counter and a
    // server TTL, neither of which is the Postgres row's premise.
    let (_redis, clusters) = clusters_file::redis_as("postgres", dir.path()).await;
    let (strict, allowed) = tokio::task::spawn_blocking({
        let (clusters, out) = (clusters.clone(), dir.path().to_owned());
        move || {
            (
                matrix(&clusters, &out.join("strict"), &[]),
                matrix(&clusters, &out.join("allowed"), &["--allow-mismatch"]),
            )
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(!strict.status.success(), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.contains("outside the expected verdicts"))
        .unwrap_or_else(|| panic!("no ⚠ line: {stderr}"));
    assert!(
        warning.contains("postgres / declared fencing ClockFlooredCounter"),
        "{warning}"
    );
    assert!(warning.contains("--allow-mismatch"), "{warning}");
    // The report itself shows the ⚠ check.
    let report = std::fs::read_to_string(dir.path().join("strict/matrix.md")).unwrap();
    assert!(report.contains("⚠ mismatch"), "{report}");

    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(allowed.status.success(), "{stderr}");
    assert!(
        stderr.contains("outside the expected verdicts (allowed by --allow-mismatch)"),
        "{stderr}"
    );
}

/// The pids of `parent`'s children named `name`.
fn children_named(parent: u32, name: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some((comm, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            continue;
        };
        let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
        if comm == name && ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// True while `pid` runs (not a zombie, not gone).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Ctrl-C (SIGINT) or SIGTERM to `tenure matrix` stops the servers it started — they run
/// in process groups of their own, so the terminal's signal does not reach them — and
/// it exits 128+signal.
#[test]
fn an_interrupted_matrix_stops_its_servers() {
    let _turn = crate::one_at_a_time();
    use nix::sys::signal::{kill, Signal};
    let dir = tempfile::tempdir().unwrap();
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // Default dispositions, whatever this process inherited (a background job of a
        // script ignores SIGINT, and tenure keeps ignored signals ignored).
        let mut tenure = Command::new("env")
            .arg("--default-signal=INT,HUP,TERM")
            .arg(env!("CARGO_BIN_EXE_tenure"))
            .args(["matrix", "--quick", "--backends", "redis", "--out"])
            .arg(dir.path())
            .env_remove("TENURE_URL")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let servers = loop {
            let servers = children_named(tenure.id(), "redis-server");
            if !servers.is_empty() {
                break servers;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(120),
                "no server started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        kill(nix::unistd::Pid::from_raw(tenure.id() as i32), signal).unwrap();
        let status = tenure.wait().unwrap();
        let left: Vec<i32> = servers.iter().copied().filter(|p| running(*p)).collect();
        for pid in &left {
            let _ = kill(nix::unistd::Pid::from_raw(*pid), Signal::SIGKILL);
        }
        assert_eq!(
            left,
            Vec::<i32>::new(),
            "servers left running after {signal}"
        );
        assert_eq!(status.code(), Some(128 + signal as i32));
    }
}
