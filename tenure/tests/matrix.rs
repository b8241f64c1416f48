//! `tenure matrix --quick` end to end on local servers: every backend × every scenario
//! and fault has a verdict, and the verdicts that do not depend on timing are the ones
//! the backends' designs dictate.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_matrix_covers_every_backend_and_scenario() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["matrix", "--quick", "--out"])
        .arg(out_dir.path())
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs");
    let report = std::fs::read_to_string(out_dir.path().join("matrix.md")).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("matrix.json")).unwrap())
            .unwrap();
    let backends = json["backends"].as_array().unwrap();
    let names: Vec<&str> = backends
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["redis", "redlock", "etcd", "zk", "postgres"]);
    let scenarios = tenure_conformance::scenarios().len();
    for backend in backends {
        let name = backend["backend"].as_str().unwrap();
        assert!(backend["error"].is_null(), "{name}: {}", backend["error"]);
        let suite = backend["suite"].as_array().unwrap();
        assert_eq!(suite.len(), scenarios, "{name}");
        for scenario in suite {
            assert_ne!(scenario["result"], "failed", "{name}: {scenario}");
        }
        let faults = backend["faults"].as_array().unwrap();
        assert_eq!(faults.len(), tenure::matrix::Fault::ALL.len(), "{name}");
        for fault in faults {
            let cell = &fault["cell"];
            match cell["status"].as_str().unwrap() {
                "ran" => {
                    let counted: u64 = cell["counts"]
                        .as_object()
                        .unwrap()
                        .values()
                        .map(|n| n.as_u64().unwrap())
                        .sum();
                    let trials = cell["trials"].as_u64().unwrap();
                    assert_eq!(trials, 3, "{name}: {fault}");
                    assert_eq!(counted + cell["not_fired"].as_u64().unwrap(), trials);
                }
                "not-injectable" | "not-applicable" => {
                    assert!(!cell["reason"].as_str().unwrap().is_empty())
                }
                other => panic!("{name}: status {other}"),
            }
        }
        let verdicts = |fault: &str| -> Vec<String> {
            let cell = &faults.iter().find(|f| f["fault"] == fault).unwrap()["cell"];
            cell["counts"]
                .as_object()
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default()
        };
        // Every lease lock is violated by a holder paused past its TTL; fencing contains it.
        assert_eq!(verdicts("paused-holder"), ["F-SAFE"], "{name}");
        // A late grant is never believed: deadlines count from when the request was sent.
        assert_eq!(verdicts("delayed-reply"), ["SAFE"], "{name}");
        assert_eq!(verdicts("blackhole"), ["SAFE"], "{name}");
        // Grants and renewals are proven through the leader, not a cut-off follower.
        if name == "zk" {
            assert_eq!(verdicts("follower-partition"), ["SAFE"], "{name}");
        }
        assert_eq!(verdicts("connection-cut"), ["SAFE"], "{name}");
        if matches!(name, "etcd" | "zk" | "postgres") {
            for fault in faults {
                assert!(!verdicts(fault["fault"].as_str().unwrap()).contains(&"UNSAFE".into()));
            }
        }
        assert_eq!(backend["perf"].as_array().unwrap().len(), 3, "{name}");
    }
    // Seeds 001/004: a Redis failover or a restart without persistence loses the grant;
    // the clock-floored fence counter keeps either from going uncontained. (Each double
    // grant itself is asserted deterministically in backend-redis/tests/faults.rs.)
    let redis = backends[0]["faults"].as_array().unwrap();
    for fault in ["replica-failover", "restart"] {
        let cell = &redis.iter().find(|f| f["fault"] == fault).unwrap()["cell"];
        assert_eq!(cell["status"], "ran", "{fault}: {cell}");
        assert!(cell["counts"]["UNSAFE"].is_null(), "{fault}: {cell}");
    }
    assert!(json["seed_claims"].as_array().unwrap().len() >= 5);
    for file in ["matrix.md", "matrix.html"] {
        let text = std::fs::read_to_string(out_dir.path().join(file)).unwrap();
        for name in &names {
            assert!(text.contains(name), "{file} lacks {name}");
        }
    }
}
