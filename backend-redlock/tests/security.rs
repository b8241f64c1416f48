//! Redlock against three redis-servers that require TLS with client certificates and a
//! password: a refusal no retry can fix, on a majority of nodes, is that `Config` error
//! at connect, not a bare retryable `NoQuorum`.

use tenure_api::LockError;
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_conformance::servers::tls::TestPki;
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
