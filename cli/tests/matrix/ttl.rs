//! `tenure matrix --clusters` asks the servers what they impose. A ZooKeeper with the
//! default `tickTime=2000` cannot grant a session (the lease) shorter than 4 s, etcd no
//! lease shorter than its minimum TTL: the trials must take that TTL, not the harness's
//! 500 ms, and the cells that depend on the lock expiring then read as the table
//! expects. An etcd URL naming one member is still judged as the cluster it reaches.

use std::process::Command;

use serde_json::Value;
use tenure_etcd::lab::EtcdCluster;
use tenure_zk::lab::{ZkEnsemble, ZkOptions};

/// Runs `tenure matrix --clusters` with `backends` (TOML lines), `trials` trials of each of
/// `faults` (the cells a lease of the probed TTL must pass) and, with `with_suite`, the
/// shared suite and the performance runs; returns the backend's report and the run's
/// stderr and success.
async fn matrix(
    backends: String,
    trials: &str,
    faults: &str,
    with_suite: bool,
) -> (Value, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let clusters = dir.path().join("clusters.toml");
    std::fs::write(&clusters, format!("[backends]\n{backends}\n")).unwrap();
    let out_dir = dir.path().join("out");
    let (trials, faults) = (trials.to_owned(), faults.to_owned());
    let (out, out_dir) = tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["matrix", "--trials", &trials, "--faults", &faults])
            .args(with_suite.then_some("--with-suite"))
            .arg("--out")
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
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("matrix.json"))
            .unwrap_or_else(|e| panic!("no matrix.json ({e}): {stderr}")),
    )
    .unwrap();
    (json["backends"][0].clone(), stderr, out.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_with_default_tick_gets_a_ttl_it_can_honour() {
    let _turn = crate::one_at_a_time_async().await;
    let zk = ZkEnsemble::start(ZkOptions::default().tick_time_ms(2000))
        .await
        .expect("zookeeper starts");
    // Asks for a 1 s session: the server clamps it to 2 ticks (4 s).
    let (zk, stderr, success) = matrix(
        format!(
            "zk = \"zk://{}?session_timeout_ms=1000\"",
            zk.connect_string()
        ),
        "2",
        "paused-holder,blackhole,connection-cut",
        false,
    )
    .await;
    assert!(zk["error"].is_null(), "{}", zk["error"]);
    // The server's floor, asked of the server: 2 × tickTime.
    assert_eq!(zk["ttl_ms"], 4000, "{zk}");
    let faults = zk["faults"].as_array().unwrap();
    for (fault, want) in [
        ("paused-holder", "F-SAFE"),
        ("blackhole", "SAFE"),
        ("connection-cut", "SAFE"),
    ] {
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
    assert!(success, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lease_floor_and_size_are_asked_of_the_servers() {
    let _turn = crate::one_at_a_time_async().await;
    let cluster = EtcdCluster::start(3).await.expect("etcd starts");
    // One member's endpoint only; the servers list three voting members.
    let endpoint = cluster.endpoints()[0].replace("http://", "");
    let (etcd, stderr, success) = matrix(
        format!("etcd = \"etcd://{endpoint}/t\""),
        "1",
        "paused-holder,blackhole,connection-cut",
        true,
    )
    .await;
    assert!(etcd["error"].is_null(), "{}", etcd["error"]);
    // 500 ms is asked as 1 s (leases count whole seconds); the members' minimum
    // (1.5 election timeouts of 500 ms) is 0.75 s, so the server grants 1 s.
    assert_eq!(etcd["ttl_ms"], 1000, "{etcd}");
    assert_eq!(
        etcd["capabilities"]["replication"], "Consensus { members: 3 }",
        "{etcd}"
    );
    // The shared suite on a user's cluster (the lab's own harness runs it in
    // backend-etcd), and the FIFO check it decides.
    let suite = etcd["suite"].as_array().unwrap();
    assert_eq!(suite.len(), tenure_conformance::scenarios().len(), "{etcd}");
    assert!(suite.iter().all(|s| s["result"] != "failed"), "{etcd}");
    let fifo = etcd["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["claim"] == "fairness Fifo");
    assert_eq!(
        fifo.map(|c| &c["consistent"]),
        Some(&Value::Bool(true)),
        "{etcd}"
    );
    for check in etcd["checks"].as_array().unwrap() {
        assert_ne!(check["consistent"], false, "{check}\n{etcd}");
    }
    let faults = etcd["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 3, "{etcd}");
    for f in faults {
        assert_eq!(f["cell"]["status"], "ran", "{f}");
        assert_eq!(f["mismatch"], false, "{f}");
    }
    assert!(success, "{stderr}");
}
