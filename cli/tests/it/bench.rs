//! `tenure bench --floor` on every backend's local servers: each backend's two floors (its
//! testbed's, in its own crate) complete their cycles without an error, beside tenure's,
//! and the ratios between them and the client's CPU per cycle are reported.

use std::process::Command;

use serde_json::Value;
use tenure_redis::lab::{RedisCluster, RedisOptions};

#[test]
fn every_backend_has_working_floors() {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["bench", "--all-local", "--floor", "--mode", "seq"])
        .args(["--secs", "0.3", "--json"])
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect();
    let floors: Vec<&Value> = lines.iter().filter(|l| l["impl"] == "floor").collect();
    // Every backend, Postgres's advisory locking and leases and MySQL's row locks against
    // floors of their own, Redis with fence=none and Redlock with fencing=false.
    assert_eq!(floors.len(), 12, "{lines:?}");
    for backend in [
        "redis",
        "redis fence=none",
        "redlock",
        "redlock fencing=false",
        "etcd",
        "zk",
        "postgres",
        "postgres advisory",
        "postgres lease",
        "mysql",
        "mysql row",
        "file",
    ] {
        let floor = floors
            .iter()
            .find(|l| l["backend"] == backend)
            .unwrap_or_else(|| panic!("no floor line for {backend}: {lines:?}"));
        assert!(floor["cycles"].as_u64().unwrap() > 0, "{floor}");
        assert_eq!(floor["errors"], 0, "{floor}");
        let ours = lines
            .iter()
            .find(|l| l["backend"] == backend && l["impl"] == "tenure")
            .unwrap_or_else(|| panic!("no tenure line for {backend}: {lines:?}"));
        assert!(ours["ratio"].as_f64().unwrap() > 0.0, "{ours}");
        assert!(ours["same_work_ratio"].as_f64().unwrap() > 0.0, "{ours}");
        let same_work = lines
            .iter()
            .find(|l| l["backend"] == backend && l["impl"] == "same-work")
            .unwrap_or_else(|| panic!("no same-work line for {backend}: {lines:?}"));
        assert!(same_work["cycles"].as_u64().unwrap() > 0, "{same_work}");
        assert_eq!(same_work["errors"], 0, "{same_work}");
        assert!(same_work["ratio"].as_f64().unwrap() > 0.0, "{same_work}");
        for line in [ours, floor, same_work] {
            // A cycle takes CPU and blocks at least once (on a loopback socket, or on the
            // blocking thread that does a file lock's work).
            assert!(line["cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{line}");
            assert!(line["switches_per_cycle"].as_f64().unwrap() > 0.0, "{line}");
            // The binary counts its allocations: a cycle makes at least its key string.
            assert!(line["allocs_per_cycle"].as_f64().unwrap() >= 1.0, "{line}");
        }
    }
    let same_work = lines.iter().filter(|l| l["impl"] == "same-work").count();
    assert_eq!(same_work, 12, "{lines:?}");
}

/// `tenure bench --keys N` benches a multi-lock of N keys per cycle on a lock directory
/// (no server), against the same client taking the keys one by one (seq) and polling the
/// multi-lock (contended); every line names its keys.
#[test]
fn a_multi_lock_bench_runs_against_its_floors() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let lines = bench_lines(&[
        "--url",
        &url,
        "--keys",
        "3",
        "--floor",
        "--mode",
        "seq",
        "--mode",
        "contended",
        "--secs",
        "0.3",
    ]);
    let implementations: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["mode"].as_str().unwrap(), l["impl"].as_str().unwrap()))
        .collect();
    assert_eq!(
        implementations,
        [
            ("seq", "tenure"),
            ("seq", "one-by-one"),
            ("contended", "tenure"),
            ("contended", "poll10ms")
        ],
        "{lines:?}"
    );
    for line in &lines {
        assert_eq!(line["keys"], 3, "{line}");
        assert!(line["cycles"].as_u64().unwrap() > 0, "{line}");
        assert_eq!(line["errors"], 0, "{line}");
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["bench", "--url", &url, "--keys", "1", "--secs", "0.1"])
        .output()
        .expect("tenure runs");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--keys 1 must be in 2..=64"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `tenure bench --shared` benches a reader on a lock directory (no server), against the
/// same client's exclusive lock (seq) and readers polling every 10 ms (contended); it is
/// refused on a backend without shared locks, before anything runs.
#[test]
fn a_reader_bench_runs_against_its_floors_where_the_backend_has_readers() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let lines = bench_lines(&[
        "--url",
        &url,
        "--shared",
        "--floor",
        "--mode",
        "seq",
        "--mode",
        "contended",
        "--secs",
        "0.3",
    ]);
    let seen: Vec<(&str, &str, bool)> = lines
        .iter()
        .map(|l| {
            let shared = l["shared"].as_bool().unwrap_or(false);
            (
                l["mode"].as_str().unwrap(),
                l["impl"].as_str().unwrap(),
                shared,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("seq", "tenure", true),
            ("seq", "exclusive", false),
            ("contended", "tenure", true),
            ("contended", "poll10ms", true)
        ],
        "{lines:?}"
    );
    for line in &lines {
        assert!(line["cycles"].as_u64().unwrap() > 0, "{line}");
        assert_eq!(line["errors"], 0, "{line}");
        assert!(
            line["handoffs_per_s"].is_null(),
            "readers hand nothing off: {line}"
        );
    }
    // The library's cycles were readers': their keys have readers' directories.
    let readers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("%2Flib%2F") && name.ends_with(".readers"))
        .count();
    assert!(readers > 0, "no reader's directory for the library's keys");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cluster = runtime
        .block_on(RedisCluster::start(RedisOptions::default()))
        .unwrap();
    // Redlock has no readers.
    let redlock = cluster.nodes()[0]
        .url()
        .replacen("redis://", "redlock://", 1);
    let refused = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["bench", "--url", &redlock, "--shared"])
        .args(["--mode", "seq", "--secs", "0.1"])
        .output()
        .expect("tenure runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("no shared (read) locks to bench"),
        "{stderr}"
    );
}

/// Runs `tenure bench` with `args` (plus `--json`), which must succeed; its JSON lines.
fn bench_lines(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("tenure runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}
