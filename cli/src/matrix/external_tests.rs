//! On servers given by URL (`tenure matrix --clusters`), the FIFO scenario counts a key's
//! queue as on the matrix's own servers, instead of pausing between waiters.

use std::time::Duration;

use tenure_api::LockKey;
use tenure_conformance::Harness;

use super::{target, Source};
use crate::local::{self, TestbedOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_the_queue_on_servers_given_by_url() {
    for (run_id, backend) in (41..).zip(["postgres", "etcd", "zk", "redis"]) {
        let local = local::start(backend, TestbedOptions::default())
            .await
            .unwrap();
        let url = local.harness.url();
        let external = target(backend, &Source::External(url), run_id)
            .await
            .unwrap();
        let harness = external.harness();
        let key = LockKey::new(format!("counted/{backend}")).unwrap();
        let client = harness.client().await.unwrap();
        let lease = client
            .try_acquire(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("a free key");
        let queued = harness.queued(&key).await.transpose().unwrap();
        // Redis keeps no queue: its waiters retry when woken.
        let expected = (backend != "redis").then_some(1);
        assert_eq!(queued, expected, "{backend}: the holder alone");
        client.release(lease).await.unwrap();
        let queued = harness.queued(&key).await.transpose().unwrap();
        assert_eq!(queued, expected.map(|_| 0), "{backend}: released");
    }
}

/// Servers filed under a configuration's column (`postgres lease`) are judged by that
/// configuration's row only if their URL sets it: otherwise the run refuses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_of_a_configuration_needs_a_url_that_sets_it() {
    let local = local::start("postgres", TestbedOptions::default())
        .await
        .unwrap();
    let url = local.harness.url();
    let refused = target("postgres lease", &Source::External(url.clone()), 45)
        .await
        .unwrap_err();
    assert!(refused.contains("does not set locking=lease"), "{refused}");
    let lease = format!("{url}?locking=lease");
    let accepted = target("postgres lease", &Source::External(lease), 46).await;
    assert!(accepted.is_ok(), "{:?}", accepted.err());
}
