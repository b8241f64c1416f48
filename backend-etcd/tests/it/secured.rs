//! An etcd cluster that serves clients over TLS only, requires client certificates and
//! has authentication enabled (`tenure_etcd::lab::start_secured`): user `tenure` holds a
//! role granting `readwrite` on [`EtcdConfig::key_prefix`](tenure_etcd::EtcdConfig::key_prefix) and
//! nothing else (the least privilege the README documents), user `stranger` one on
//! `stranger/` only.

use tenure_conformance::testbed::BoxError;
use tenure_etcd::lab::{EtcdCluster, EtcdSecrets, EtcdUser};

/// Starts `members` members with users `tenure` and `stranger`.
pub(crate) async fn start(members: usize) -> Result<(EtcdCluster, EtcdSecrets), BoxError> {
    tenure_etcd::lab::start_secured(members, |secrets| {
        vec![EtcdUser {
            name: "stranger",
            password: &secrets.stranger_password,
            prefix: "stranger/",
        }]
    })
    .await
}
