//! The same example binary, two backends, chosen only by configuration.

use std::process::Command;

use tenure_etcd::lab::EtcdCluster;
use tenure_redis::lab::{RedisCluster, RedisOptions};

/// Runs the `app` example with `TENURE_URL=url` and returns its output. `cargo run`
/// (re)builds it first: a stale copy from an earlier build would test old code.
fn run_app(url: &str) -> String {
    let mut command = Command::new(env!("CARGO"));
    command.args(["run", "--quiet", "-p", "tenure", "--example", "app"]);
    let out = command
        .env("TENURE_URL", url)
        .output()
        .expect("cargo runs the example");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_binary_redlock_then_etcd_then_redis() {
    let (redis, etcd) = tokio::join!(
        RedisCluster::start(RedisOptions::default().nodes(3)),
        EtcdCluster::start(1)
    );
    let (redis, etcd) = (redis.unwrap(), etcd.unwrap());
    let hosts: Vec<String> = redis.nodes().iter().map(|n| n.addr().to_string()).collect();
    let redlock = run_app(&format!("redlock://{}", hosts.join(",")));
    assert!(redlock.starts_with("backend=redlock token="), "{redlock}");
    let etcd = run_app(&format!("etcd://{}/app", etcd.members()[0].addr()));
    assert!(etcd.starts_with("backend=etcd token="), "{etcd}");
    let redis = run_app(&redis.urls()[0]);
    assert!(redis.starts_with("backend=redis token="), "{redis}");
}
