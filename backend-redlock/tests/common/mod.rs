//! Helpers shared by the live Redlock tests.

use std::net::SocketAddr;

use tenure_conformance::proxy::FaultProxy;
use tenure_redis::lab::RedisCluster;
use tenure_redlock::Redlock;

/// A `redlock://` URL over `addrs`, with `options` (`?…`) appended.
pub(crate) fn url(addrs: impl IntoIterator<Item = SocketAddr>, options: &str) -> String {
    let hosts: Vec<String> = addrs.into_iter().map(|a| a.to_string()).collect();
    format!("redlock://{}{options}", hosts.join(","))
}

/// A client reaching every node of `cluster` directly.
pub(crate) async fn direct(cluster: &RedisCluster) -> Redlock {
    Redlock::connect(&url(cluster.nodes().iter().map(|n| n.addr()), ""))
        .await
        .unwrap()
}

/// A client with a private proxy per node (all passing; connections are up).
pub(crate) async fn proxied(cluster: &RedisCluster, options: &str) -> (Redlock, Vec<FaultProxy>) {
    let mut proxies = Vec::new();
    for node in cluster.nodes() {
        proxies.push(FaultProxy::start(node.addr()).await.unwrap());
    }
    let lock = Redlock::connect(&url(proxies.iter().map(|p| p.addr()), options))
        .await
        .unwrap();
    (lock, proxies)
}
