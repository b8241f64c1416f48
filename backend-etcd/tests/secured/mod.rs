//! An etcd cluster that serves clients over TLS only, requires client certificates and
//! has authentication enabled: user `tenure` holds a role granting `readwrite` on
//! [`EtcdConfig::key_prefix`] and nothing else (the least privilege the README
//! documents), user `stranger` one on `stranger/` only.

use std::error::Error;

use tenure_conformance::servers::etcd::{EtcdCluster, EtcdSecrets, EtcdUser};
use tenure_etcd::EtcdConfig;

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// Starts `members` members, then creates the users and roles and enables
/// authentication.
pub(crate) async fn start(members: usize) -> Result<(EtcdCluster, EtcdSecrets), BoxError> {
    let cluster = EtcdCluster::start_secured(members).await?;
    let secrets = cluster.secrets().ok_or("a secured cluster")?.clone();
    let hosts: Vec<String> = cluster
        .members()
        .iter()
        .map(|m| m.addr().to_string())
        .collect();
    let prefix = EtcdConfig::from_url(&secrets.url(&hosts.join(",")))?.key_prefix();
    cluster
        .enable_auth(&[
            EtcdUser {
                name: "tenure",
                password: &secrets.password,
                prefix: &prefix,
            },
            EtcdUser {
                name: "stranger",
                password: &secrets.stranger_password,
                prefix: "stranger/",
            },
        ])
        .await?;
    Ok((cluster, secrets))
}
