//! `tenure bench --floor` on every backend's local servers: each backend's protocol floor
//! (its testbed's, in its own crate) completes its cycles without an error, beside
//! tenure's, and the ratio between them is reported.

use std::process::Command;

use serde_json::Value;

#[test]
fn every_backend_has_a_working_floor() {
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
    // Every backend, and Postgres's advisory locking against its own floor.
    assert_eq!(floors.len(), 6, "{lines:?}");
    for backend in ["redis", "redlock", "etcd", "zk", "postgres"] {
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
    }
}
