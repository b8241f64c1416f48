//! What the conformance lab does to etcd beyond locking (feature `testbed`; not for
//! applications).

use etcd_client::{GetOptions, SortOrder, SortTarget};
use tenure_api::{async_trait, LockError, LockKey};
use tenure_conformance::faults::WaiterRecords;

use crate::EtcdLock;

#[async_trait]
impl WaiterRecords for EtcdLock {
    /// Deletes the newest key of `key`'s queue (its last waiter's), as an operator's
    /// `etcdctl del` does, its lease left alive; returns the key deleted, or `None` when
    /// the queue holds no waiter (fewer than two keys).
    ///
    async fn remove_newest_waiter(&self, key: &LockKey) -> Result<Option<String>, LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let reply = self
            .rpc
            .get("list the queue", &self.queue_prefix(key), options)
            .await?;
        let newest = match reply.kvs().first() {
            Some(kv) if reply.count() >= 2 => kv
                .key_str()
                .map_err(|e| LockError::backend(e.to_string()))?,
            _ => return Ok(None),
        };
        let newest = newest.to_owned();
        let deleted = self.rpc.delete("delete a waiter's key", &newest).await?;
        Ok((deleted == 1).then_some(newest))
    }
}
