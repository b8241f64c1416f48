//! `tenure matrix --clusters` against a ZooKeeper with the default `tickTime=2000`: the
//! server cannot grant a session (the lease) shorter than 4 s, so the trials must take a
//! TTL of what the server negotiated, not the harness's 500 ms; the cells that depend on
//! the lock expiring then read as the table expects.

use std::process::Command;

use serde_json::Value;
use tenure_conformance::servers::zk::{ZkEnsemble, ZkOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_with_default_tick_gets_a_ttl_it_can_honour() {
    let zk = ZkEnsemble::start(ZkOptions::default().tick_time_ms(2000))
        .await
        .expect("zookeeper starts");
    let dir = tempfile::tempdir().unwrap();
    // Asks for a 1 s session: the server clamps it to 2 ticks (4 s).
    let clusters = dir.path().join("clusters.toml");
    std::fs::write(
        &clusters,
        format!(
            "[backends]\nzk = \"zk://{}?session_timeout_ms=1000\"\n",
            zk.connect_string()
        ),
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["matrix", "--trials", "2", "--perf-secs", "0.1", "--out"])
            .arg(&out_dir)
            .arg("--clusters")
            .arg(&clusters)
            .env_remove("TENURE_URL")
            .output()
            .expect("tenure runs");
        (out, out_dir)
    })
    .await
    .unwrap();
    let (out, out_dir) = out;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("matrix.json"))
            .unwrap_or_else(|e| panic!("no matrix.json ({e}): {stderr}")),
    )
    .unwrap();
    let zk = &json["backends"][0];
    assert!(zk["error"].is_null(), "{}", zk["error"]);
    // The server's floor, asked of the server: 2 × tickTime.
    assert_eq!(zk["ttl_ms"], 4000, "{zk}");
    let faults = zk["faults"].as_array().unwrap();
    for (fault, want) in [("paused-holder", "F-SAFE"), ("blackhole", "SAFE")] {
        let f = faults.iter().find(|f| f["fault"] == fault).unwrap();
        let cell = &f["cell"];
        assert_eq!(cell["status"], "ran", "{fault}: {cell}");
        assert_eq!(f["mismatch"], false, "{fault}: {f}");
        let counts = cell["counts"].as_object().unwrap();
        let keys: Vec<&str> = counts.keys().map(String::as_str).collect();
        assert_eq!(keys, [want], "{fault}: {cell}");
        // Every trial fired (the fault took effect), none was left out.
        assert_eq!(cell["not_fired"], 0, "{fault}: {cell}");
        assert_eq!(counts[want], 2, "{fault}: {cell}");
    }
    // No cell outside the table (before: "holder's connection cut: UNAVAIL 2 ⚠", the
    // contender gave up before the 4 s session expired).
    for f in faults {
        assert_eq!(f["mismatch"], false, "{f}");
    }
    assert!(out.status.success(), "{stderr}");
}
