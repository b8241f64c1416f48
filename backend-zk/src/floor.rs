//! The protocol floor on ZooKeeper (feature `testbed`, for `tenure bench --floor`): an
//! ephemeral sequential node created under one parent, then deleted, with the plain
//! `zookeeper-client` crate.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError};
use tenure_conformance::testbed::{cycle_failed, BoxFuture, Locker};
use zookeeper_client::{Acls, Client, CreateMode};

/// Ephemeral sequential create under one parent, then delete.
pub(crate) struct ZkFloor {
    client: Client,
    parent: String,
}

impl ZkFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        let (client, parent) = zk_connect(url, "tenure-floor").await?;
        Ok(Self { client, parent })
    }
}

/// A plain client session for the server of a `zk://` URL, and the persistent node
/// `name` under its chroot (created if missing).
pub async fn zk_connect(url: &str, name: &str) -> Result<(Client, String), LockError> {
    let config = crate::ZkConfig::from_url(url)?;
    let mut connector = Client::connector();
    if let Some(digest) = config.digest() {
        connector = connector.with_auth("digest", &digest);
    }
    let client = connector
        .connect(&config.connect_string())
        .await
        .map_err(|e| LockError::unavailable("bench connect", e))?;
    let parent = format!("{}/{name}", config.chroot());
    let mut path = String::new();
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        path = format!("{path}/{part}");
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        match client.create(&path, &[], &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => return Err(LockError::unavailable("bench parent node", e)),
        }
    }
    Ok((client, parent))
}

#[async_trait]
impl Locker for ZkFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let prefix = format!("{}/{}-", self.parent, key.replace('/', "_"));
        let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (_, sequence) = self
            .client
            .create(&prefix, &[], &mode)
            .await
            .map_err(|e| cycle_failed("create", e))?;
        held();
        self.client
            .delete(&format!("{prefix}{sequence}"), None)
            .await
            .map_err(|e| cycle_failed("delete", e))
    }
}

/// The floor for a `zk://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let floor: Arc<dyn Locker> = Arc::new(ZkFloor::connect(url).await?);
        Ok(floor)
    })
}
