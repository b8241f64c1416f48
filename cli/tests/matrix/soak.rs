//! `tenure matrix --soak`: faults drawn at random for a time per backend, on local servers
//! and on a user's cluster; no draw may end UNSAFE or outside the table of expected
//! verdicts.

use std::process::{Command, Output};

use serde_json::Value;
use tenure_cli::matrix::Fault;

use crate::clusters_file;

fn soak(out: &std::path::Path, extra: &[&str]) -> (Output, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["matrix", "--out"])
        .arg(out)
        .args(extra)
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs");
    let json = std::fs::read_to_string(out.join("matrix.json")).unwrap_or_default();
    let json = serde_json::from_str(&json).unwrap_or(Value::Null);
    (output, json)
}

/// The faults a backend's report says were drawn, checked against its cells: each drawn
/// fault's cell ran `trials` trials per draw, every other cell ran none, and no trial
/// ended UNSAFE.
fn drawn(backend: &Value, trials: u64) -> Vec<String> {
    let name = &backend["backend"];
    assert!(backend["error"].is_null(), "{name}: {}", backend["error"]);
    let schedule: Vec<String> = backend["schedule"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: no schedule: {backend}"))
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    assert!(!schedule.is_empty(), "{name}");
    for outcome in backend["faults"].as_array().unwrap() {
        let (fault, cell) = (outcome["fault"].as_str().unwrap(), &outcome["cell"]);
        let draws = schedule.iter().filter(|f| *f == fault).count() as u64;
        assert_eq!(outcome["mismatch"], false, "⚠ {name} / {fault}: {cell}");
        assert!(
            cell["counts"]["UNSAFE"].is_null(),
            "{name} / {fault}: {cell}"
        );
        match cell["status"].as_str().unwrap() {
            "ran" => assert_eq!(cell["trials"], draws * trials, "{name} / {fault}: {cell}"),
            // A fault these servers cannot take is never drawn.
            _ => assert_eq!(draws, 0, "{name} / {fault}: {cell}"),
        }
    }
    schedule
}

#[test]
fn a_soak_of_local_servers_draws_faults_and_none_is_unsafe() {
    let _turn = crate::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let (output, json) = soak(dir.path(), &["--soak", "20s", "--seed", "7"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(json["options"]["soak"]["seed"], 7);
    assert_eq!(json["options"]["soak"]["secs"], 20.0);
    let backends = json["backends"].as_array().unwrap();
    assert_eq!(backends.len(), tenure_cli::local::columns().len(), "{json}");
    let mut server_faults = 0;
    for backend in backends {
        // No suite and no performance runs in a soak: its time is the draws'.
        assert!(backend["suite"].as_array().unwrap().is_empty());
        assert!(backend["perf"].as_array().unwrap().is_empty());
        for fault in drawn(backend, 4) {
            let fault = Fault::ALL
                .into_iter()
                .find(|f| serde_json::to_value(f).unwrap() == fault.as_str())
                .unwrap();
            server_faults += usize::from(fault.is_server_fault());
        }
    }
    // Local servers take the faults that need process control too.
    assert!(server_faults > 0, "{json}");
    let report = std::fs::read_to_string(dir.path().join("matrix.md")).unwrap();
    assert!(report.contains("a soak — faults drawn at random for 20 s per backend (seed 7)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_a_users_cluster_draws_only_what_it_can_inject() {
    let _turn = crate::one_at_a_time_async().await;
    let dir = tempfile::tempdir().unwrap();
    let (_redis, clusters) = clusters_file::redis_as("redis", dir.path()).await;
    let clusters = clusters.to_str().unwrap().to_owned();
    let args = [
        "--soak",
        "5s",
        "--trials",
        "2",
        "--clusters",
        &clusters,
        "--seed",
        "7",
    ];
    let (output, json) = tokio::task::spawn_blocking({
        let (out, args) = (dir.path().join("out"), args.map(String::from));
        move || soak(&out, &args.each_ref().map(String::as_str))
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let backends = json["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 1, "{json}");
    // Without process control, only the faults on a client's own links are drawn.
    for fault in drawn(&backends[0], 2) {
        let fault = Fault::ALL
            .into_iter()
            .find(|f| serde_json::to_value(f).unwrap() == fault.as_str())
            .unwrap();
        assert!(!fault.is_server_fault(), "{fault:?}");
    }
}

#[test]
fn a_soak_refuses_options_it_would_ignore() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--soak", "0s"][..],
        &["--soak", "10s", "--rounds", "2"],
        &["--soak", "10s", "--quick"],
        &["--seed", "3"],
        &["--soak", "ten"],
    ] {
        let (output, _) = soak(dir.path(), args);
        assert_ne!(output.status.code(), Some(0), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--soak") || stderr.contains("--seed"),
            "{args:?}: {stderr}"
        );
    }
}
