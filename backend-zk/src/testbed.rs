//! What the conformance lab does to ZooKeeper beyond locking (feature `testbed`; not for
//! applications).

use tenure_api::{async_trait, LockError, LockKey};
use tenure_conformance::faults::WaiterRecords;

use crate::error::bounded;
use crate::ZkLock;

#[async_trait]
impl WaiterRecords for ZkLock {
    /// Deletes the newest node of `key`'s queue (its last waiter's), as an operator's
    /// `deleteall` or a session's end does, while its session lives on; returns the
    /// node's path, or `None` when the queue holds no waiter (fewer than two nodes).
    ///
    async fn remove_newest_waiter(&self, key: &LockKey) -> Result<Option<String>, LockError> {
        let session = self.session().await?;
        let client = session.client()?;
        let dir = self.lock_dir(key);
        let listing = self.listing(&client, &dir).await?;
        let newest = match listing.nodes.last() {
            Some(node) if listing.nodes.len() >= 2 => format!("{dir}/{}", node.name),
            _ => return Ok(None),
        };
        match bounded(self.request_timeout(), client.delete(&newest, None)).await {
            Ok(()) => Ok(Some(newest)),
            Err(zookeeper_client::Error::NoNode) => Ok(None),
            Err(e) => Err(self.zk_error("delete a waiter's node", e)),
        }
    }
}
