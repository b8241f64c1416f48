//! The protocol floor on etcd (feature `testbed`, for `tenure bench --floor`): a txn that
//! puts a fresh key on one lease granted up front, guarded by `create_revision == 0`,
//! then a delete, with the plain `etcd-client` crate.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use tenure_api::{async_trait, LockError};
use tenure_conformance::testbed::{cycle_failed, BoxFuture, Locker};

/// Guarded put on one lease granted up front, then delete.
pub(crate) struct EtcdFloor {
    client: Client,
    lease: i64,
}

impl EtcdFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        let config = crate::EtcdConfig::from_url(url)?;
        let mut options = ConnectOptions::new().with_connect_timeout(config.connect_timeout);
        if let Some((user, password)) = config.credentials() {
            options = options.with_user(user, password);
        }
        let client = Client::connect(config.endpoints(), Some(options))
            .await
            .map_err(|e| LockError::unavailable("floor connect", e))?;
        // Long enough for any run (`--secs` is at most an hour per implementation).
        let lease = client
            .lease_client()
            .grant(7200, None)
            .await
            .map_err(|e| LockError::unavailable("floor lease grant", e))?
            .id();
        Ok(Self { client, lease })
    }
}

impl Drop for EtcdFloor {
    fn drop(&mut self) {
        let (mut leases, id) = (self.client.lease_client(), self.lease);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = leases.revoke(id).await;
            });
        }
    }
}

#[async_trait]
impl Locker for EtcdFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let mut kv = self.client.kv_client();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                "floor",
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let reply = kv.txn(txn).await.map_err(|e| cycle_failed("txn put", e))?;
        if !reply.succeeded() {
            return Err("a fresh key existed".into());
        }
        held();
        kv.delete(key, None)
            .await
            .map_err(|e| cycle_failed("delete", e))?;
        Ok(())
    }
}

/// The floor for an `etcd://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let floor: Arc<dyn Locker> = Arc::new(EtcdFloor::connect(url).await?);
        Ok(floor)
    })
}
