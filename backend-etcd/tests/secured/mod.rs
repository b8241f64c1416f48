//! An etcd cluster that serves clients over TLS only, requires client certificates and
//! has authentication enabled: user `tenure` holds a role granting `readwrite` on
//! [`EtcdConfig::key_prefix`] and nothing else (the least privilege the README
//! documents), user `stranger` one on `stranger/` only.

use std::error::Error;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, Permission, TlsOptions};
use tenure_conformance::servers::etcd::{EtcdCluster, EtcdSecrets};
use tenure_etcd::EtcdConfig;

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// Starts `members` members, then creates the users and roles and enables
/// authentication, as `root` (over TLS with the client certificate).
pub(crate) async fn start(members: usize) -> Result<(EtcdCluster, EtcdSecrets), BoxError> {
    let cluster = EtcdCluster::start_secured(members).await?;
    let secrets = cluster.secrets().ok_or("a secured cluster")?.clone();
    let pki = &secrets.pki;
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(pki.ca())?))
        .identity(Identity::from_pem(
            std::fs::read(pki.client_cert())?,
            std::fs::read(pki.client_key())?,
        ));
    let client = Client::connect(
        cluster.endpoints(),
        Some(ConnectOptions::new().with_tls(tls)),
    )
    .await?;
    let mut auth = client.auth_client();
    let hosts: Vec<String> = cluster
        .members()
        .iter()
        .map(|m| m.addr().to_string())
        .collect();
    let config = EtcdConfig::from_url(&secrets.url(&hosts.join(",")))?;
    for (user, password, prefix) in [
        ("tenure", &secrets.password, config.key_prefix()),
        (
            "stranger",
            &secrets.stranger_password,
            "stranger/".to_string(),
        ),
    ] {
        auth.role_add(user).await?;
        auth.role_grant_permission(user, Permission::read_write(prefix).with_prefix())
            .await?;
        auth.user_add(user, password.as_str(), None).await?;
        auth.user_grant_role(user, user).await?;
    }
    // A random password nobody needs again: the tests never act as root later.
    let root_password = tenure_api::OwnerId::random().to_string();
    auth.user_add("root", root_password, None).await?;
    auth.role_add("root").await?;
    auth.user_grant_role("root", "root").await?;
    auth.auth_enable().await?;
    Ok((cluster, secrets))
}
