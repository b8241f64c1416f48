//! The local servers behind `tenure matrix` come back from a restart even when their port
//! was taken meanwhile, and the matrix's clients follow them to their new port.

use std::time::Duration;

use tenure_api::LockKey;
use tenure_cli::local::{self, TestbedOptions};
use tenure_conformance::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_harness_follows_a_server_moved_by_a_restart() {
    let local = local::start("postgres", TestbedOptions::default())
        .await
        .expect("postgres starts");
    let node = &local.nodes[0];
    let old = node.addr();
    node.kill().await.unwrap();
    // Another process binds the port while the server is down.
    let squatter = std::net::TcpListener::bind(old).unwrap();
    node.restart().await.expect("restarted on another port");
    assert_ne!(node.addr(), old);
    assert_eq!(squatter.local_addr().unwrap(), old);
    assert!(local.harness.url().contains(&node.addr().to_string()));
    assert_eq!(local.harness.targets(), vec![node.addr()]);

    let key = LockKey::new("tenure-test/local-restart").unwrap();
    let ttl = Duration::from_secs(10);
    let client = local.harness.client().await.expect("direct client");
    let lease = client.try_acquire(&key, ttl).await.unwrap().expect("free");
    let (proxied, _links) = local
        .harness
        .proxied_client(local.harness.cut_options())
        .await
        .expect("proxied client");
    assert!(
        proxied.try_acquire(&key, ttl).await.unwrap().is_none(),
        "held"
    );
    client.release(lease).await.unwrap();
}
