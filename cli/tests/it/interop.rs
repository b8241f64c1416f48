//! The other way round from the backends' interop tests: `tenure run` killed while it
//! holds (SIGKILL: nothing renews its lease or session any more) keeps another recipe's
//! real client out until the server ends its lease, then lets it in — Curator on
//! ZooKeeper, `etcdctl lock` on etcd, redis-py on Redis, each the recipe its testbed
//! declares for the matrix's mixed-fleet row.

use std::time::{Duration, Instant};

use tenure_conformance::testbed::{Testbed, TestbedOptions};

use crate::run::{output, tenure, Tenure};

/// `tenure run --ttl 4s --key KEY -- sleep 300` on `url`, once `tenure inspect` shows it
/// holds.
fn holding(url: &str, key: &str) -> Tenure {
    let args = ["run", "--ttl", "4s", "--key", key, "--", "sleep", "300"];
    let holder = Tenure::spawn(&mut tenure(url, &args));
    let started = Instant::now();
    let held = || {
        String::from_utf8_lossy(&output(url, &["inspect", key]).stdout).contains("\"held\":true")
    };
    while !held() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "tenure run never held {key}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    holder
}

async fn a_killed_tenure_run_frees_the_lock_for_the_other_recipe(testbed: Testbed) {
    let lab = testbed.start(TestbedOptions::PLAIN).await.unwrap();
    let url = lab.harness.url();
    let foreign = testbed.foreign.expect("the testbed's other recipe");
    let (recipe, contender) = foreign(url.clone()).await.unwrap();
    let key = tenure_api::LockKey::new("interop/killed").unwrap();
    let mut theirs = contender(key.clone()).await.unwrap();
    let holder = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || holding(&url, "interop/killed"))
            .await
            .unwrap()
    };
    assert!(
        !theirs.acquire(Duration::from_secs(1)).await,
        "{recipe} granted beside tenure run"
    );
    drop(holder); // SIGKILL, then reaped
    let killed = Instant::now();
    assert!(
        theirs.acquire(Duration::from_secs(60)).await,
        "{recipe} never granted after tenure run was killed"
    );
    eprintln!("{recipe}: granted {:?} after the kill", killed.elapsed());
    theirs.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tenure_run_frees_a_zookeeper_lock_for_curator() {
    a_killed_tenure_run_frees_the_lock_for_the_other_recipe(tenure_zk::TESTBED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tenure_run_frees_an_etcd_lock_for_etcdctl() {
    a_killed_tenure_run_frees_the_lock_for_the_other_recipe(tenure_etcd::TESTBED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tenure_run_frees_a_redis_lock_for_redis_py() {
    a_killed_tenure_run_frees_the_lock_for_the_other_recipe(tenure_redis::TESTBED).await;
}
