//! What the conformance lab does to etcd beyond locking, and to this client's requests
//! (feature `testbed`; not for applications).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget};
use tenure_api::{async_trait, LockError, LockKey};
use tenure_conformance::faults::WaiterRecords;

use crate::rpc::Rpc;
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

/// What befalls one request of an [`EtcdLock`] in the lab: how a network and a Raft log
/// treat a request whose caller gives up on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestFault {
    /// Sent and applied; its reply is lost, and the caller sees its timeout once the
    /// request has applied.
    ReplyLost,
    /// Held back for this long and then sent (a proposal that commits after its caller
    /// gave up); the caller sees a timeout at once.
    Late(Duration),
}

/// Which fault, if any, befalls a request, by the name its errors carry (`"enqueue
/// txn"`, `"lease revoke"`, `"extend txn"`, …). Called once per request.
pub type RequestFaults = Arc<dyn Fn(&str) -> Option<RequestFault> + Send + Sync>;

impl EtcdLock {
    /// This handle (and its clones made after this call) with `faults` applied to its
    /// requests; the keep-alives of its session leases are left alone.
    pub fn with_request_faults(mut self, faults: RequestFaults) -> Self {
        self.rpc.faults = Some(faults);
        self
    }
}

impl Rpc {
    /// Applies `fault` to `request`: the caller always sees the timeout it would see.
    pub(crate) async fn faulted<T: Send + 'static>(
        &self,
        what: &str,
        fault: RequestFault,
        request: impl Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    ) -> Result<T, LockError> {
        match fault {
            RequestFault::ReplyLost => {
                let _ = request.await;
            }
            RequestFault::Late(delay) => {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = request.await;
                });
            }
        }
        let (endpoint, limit) = (self.config.hosts.join(","), self.config.request_timeout);
        Err(LockError::no_reply(what, &endpoint, limit))
    }
}
