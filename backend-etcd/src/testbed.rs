//! What the conformance lab does to etcd beyond locking, and to this client's requests
//! (feature `testbed`; not for applications).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget};
use tenure_api::{async_trait, LockError, LockKey};
use tenure_conformance::faults::WaiterRecords;
use tokio::sync::Semaphore;

use crate::rpc::{bounded, Rpc};
use crate::EtcdLock;

#[async_trait]
impl WaiterRecords for EtcdLock {
    /// Deletes the newest key of `key`'s queue (its last waiter's), as an operator's
    /// `etcdctl del` does, its lease left alive; returns the key deleted, or `None` when
    /// the queue holds no waiter (fewer than two keys; with readers holding together,
    /// the newest may be a holder: the fault trials that use it queue writers only).
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
#[derive(Clone, Debug)]
pub enum RequestFault {
    /// Sent once and applied (within the request timeout); its reply is lost, and the
    /// caller sees its timeout once the request has applied.
    ReplyLost,
    /// Held back until `gate` gives it a permit, then sent (a proposal that commits
    /// after its caller gave up); the caller sees a timeout at once. The test decides
    /// when it lands: `gate.add_permits(n)` lets `n` held requests go.
    Held(Arc<Semaphore>),
    /// Sent after this long, the caller waiting for its reply (a slow link): requests
    /// sent meanwhile on other paths land first.
    Slow(Duration),
}

/// Which fault, if any, befalls a request, by the name its errors carry (`"enqueue
/// txn"`, `"lease revoke"`, `"extend txn"`, …). Called once per request.
pub type RequestFaults = Arc<dyn Fn(&str) -> Option<RequestFault> + Send + Sync>;

impl EtcdLock {
    /// This handle (and its clones made after this call) with `faults` applied to its
    /// own requests. Its sessions' requests (session lease grants, their keep-alives,
    /// and the deletes and listings of their task) go out unfaulted: the sessions were
    /// made at connect.
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
        let (endpoint, limit) = (self.config.hosts.join(","), self.config.request_timeout);
        match fault {
            RequestFault::ReplyLost => {
                let _ = tokio::time::timeout(limit, request).await;
            }
            RequestFault::Held(gate) => {
                tokio::spawn(async move {
                    if let Ok(permit) = gate.acquire_owned().await {
                        permit.forget();
                        let _ = request.await;
                    }
                });
            }
            RequestFault::Slow(delay) => {
                tokio::time::sleep(delay).await;
                return bounded(&self.config, limit, what, request).await;
            }
        }
        Err(LockError::no_reply(what, &endpoint, limit))
    }
}
