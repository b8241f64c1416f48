//! Redlock against three redis-servers that require TLS with client certificates and a
//! password: a refusal no retry can fix, on a majority of nodes, is that `Config` error
//! at connect, not a bare retryable `NoQuorum`.

use tenure_api::LockError;
use tenure_conformance::servers::tls::TestPki;
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redlock::Redlock;

#[tokio::test]
async fn refusals_by_every_node_are_config_errors() {
    let options = RedisOptions::default()
        .nodes(3)
        .secured(tenure_redis::ACL_COMMANDS);
    let cluster = RedisCluster::start(options).await.unwrap();
    let secrets = cluster.secrets().unwrap();
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    let url = |password: &str, tls: &str| {
        format!(
            "redlocks://tenure:{password}@{}?prefix=tenure/&{tls}",
            hosts.join(",")
        )
    };
    let good = Redlock::connect(&secrets.url("redlocks", &hosts.join(","))).await;
    assert!(good.is_ok(), "{:?}", good.err());

    let (_dir, other) = TestPki::unrelated().unwrap();
    let wrong_ca = secrets.tls_options_trusting(&other.ca());
    for (url, says) in [
        (
            url("wrong-password-7c1e", &secrets.tls_options()),
            "authentication failed",
        ),
        (
            url(&secrets.password, &wrong_ca),
            "certificate is not trusted",
        ),
    ] {
        match Redlock::connect(&url).await {
            Err(LockError::Config(message)) => {
                assert!(message.contains(says), "{message}");
                assert!(!message.contains("wrong-password-7c1e"), "{message}");
            }
            other => panic!("expected a Config error saying {says:?}, got {other:?}"),
        }
    }
}

/// Issue 57, defect 6: a node that could not be reached at start-up was connected to
/// lazily, inside a call's node timeout, and the attempt was dropped when that ran out:
/// a node whose TCP, TLS handshake and `AUTH` take longer than the node timeout (while
/// its requests do not) never joined. Node 2 is black-holed at start-up, then slowed
/// (each chunk 120 ms late: a request takes one round trip, a connection at least two)
/// with the node timeout at 200 ms, and node 1 is black-holed: only a majority with
/// node 2 can grant. Failed before the fix with "no grant within 10 s: NoQuorum".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_at_start_up_joins_once_it_answers() {
    use std::time::{Duration, Instant};
    use tenure_api::{DistributedLock, LockKey};
    use tenure_conformance::proxy::{FaultProxy, ProxyMode};

    let options = RedisOptions::default()
        .nodes(3)
        .secured(tenure_redis::ACL_COMMANDS);
    let cluster = RedisCluster::start(options).await.unwrap();
    let secrets = cluster.secrets().unwrap();
    let nodes = cluster.nodes();
    let (one, two) = (
        FaultProxy::start(nodes[1].addr()).await.unwrap(),
        FaultProxy::start(nodes[2].addr()).await.unwrap(),
    );
    two.set_mode(ProxyMode::Blackhole);
    let hosts = format!("{},{},{}", nodes[0].addr(), one.addr(), two.addr());
    let url = format!("{}&node_timeout_ms=200", secrets.url("redlocks", &hosts));
    let lock = Redlock::connect(&url)
        .await
        .expect("a majority at start-up");
    assert!(
        two.stats().bytes_blackholed > 0,
        "the fault fired: node 2 was unreachable"
    );

    two.set_mode(ProxyMode::Delay {
        up: Duration::from_millis(120),
        down: Duration::ZERO,
    });
    one.set_mode(ProxyMode::Blackhole);
    let ttl = Duration::from_secs(10);
    let started = Instant::now();
    for attempt in 0.. {
        let key = LockKey::new(format!("tenure/joins-{attempt}")).unwrap();
        match lock.try_acquire(&key, ttl).await {
            Ok(Some(_)) => break,
            outcome => assert!(
                started.elapsed() < Duration::from_secs(10),
                "no grant within 10 s: {outcome:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
