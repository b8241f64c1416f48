//! `tenure matrix` fails when the matrix disagrees with the table of expected verdicts,
//! names what disagreed on stderr, and `--allow-mismatch` turns that into a warning.

use std::process::{Command, Output};

use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};

fn matrix(clusters: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["matrix", "--trials", "1", "--perf-secs", "0.1", "--out"])
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
    let redis = RedisCluster::start(RedisOptions::default())
        .await
        .expect("redis starts");
    let dir = tempfile::tempdir().unwrap();
    // A Redis server filed under "postgres": Redis declares a clock-floored counter, a
    // server TTL and clock dependence, none of which is the Postgres row's premise.
    let clusters = dir.path().join("clusters.toml");
    std::fs::write(
        &clusters,
        format!("[backends]\npostgres = \"{}\"\n", redis.urls()[0]),
    )
    .unwrap();
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
