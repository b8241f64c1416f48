//! The floors on etcd (feature `testbed`, for `tenure bench --floor`), with the plain
//! `etcd-client` crate and one lease granted up front. The protocol floor: a txn that puts
//! a fresh key on that lease, guarded by `create_revision == 0`, then a delete. The
//! same-work floor: the requests tenure's cycle on a fresh key sends with the default
//! (session) leases, and nothing else — its enqueue txn (the same guarded put, of a queue
//! key named as tenure names it, and a read of the queue's head), then a delete.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};
use tenure_api::backend::holder_text;
use tenure_api::{async_trait, LockError, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::queue::own_prefix;
use crate::EtcdConfig;

/// A plain client and the one etcd lease a floor puts its keys on: granted when it
/// connects, for the whole run, and revoked when it is dropped.
struct Leased {
    config: EtcdConfig,
    client: Client,
    lease: i64,
}

impl fmt::Debug for Leased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("config", &self.config)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Leased {
    /// Connects to `url`'s endpoints (its connect timeout and credentials), every request
    /// requiring a leader if `require_leader` (as tenure's client sends them), and grants
    /// the lease.
    async fn connect(url: &str, require_leader: bool) -> Result<Self, LockError> {
        let config = EtcdConfig::from_url(url)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_require_leader(require_leader);
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
        Ok(Self {
            config,
            client,
            lease,
        })
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        let (mut leases, id) = (self.client.lease_client(), self.lease);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = leases.revoke(id).await;
            });
        }
    }
}

/// Guarded put on one lease granted up front, then delete.
#[derive(Debug)]
pub(crate) struct EtcdFloor {
    leased: Leased,
}

impl EtcdFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        Ok(Self {
            leased: Leased::connect(url, false).await?,
        })
    }
}

#[async_trait]
impl Locker for EtcdFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let mut kv = self.leased.client.kv_client();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                "floor",
                Some(PutOptions::new().with_lease(self.leased.lease)),
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

/// The same-work floor: the server work of tenure's `try_acquire` + `release` of a fresh
/// key with the default URL options (`lease=session`), in the same two round trips:
///
/// 1. the enqueue txn (`EtcdLock::queue_ticket`): if `create_revision(q) == 0`, put `q`
///    (its value the 32-hex owner id) on the session lease and get the queue's head (the
///    `queue` prefix sorted by create revision ascending, limit 1); else get `q` and the
///    head. The queue is `<prefix>/<key, % and / escaped>/`, and `q` is
///    `<queue><owner>-<lease id, 16 hex>-<name number, hex>`;
/// 2. the release: a plain delete of `q`.
///
/// The session lease is granted once, when connecting (tenure grants it at a client's
/// first acquire for a TTL, and keeps it alive from a background task, on a timer rather
/// than per cycle; its grant trusts the task's last keep-alive while that is recent,
/// sending no request). Every request requires a leader, as tenure's do. Left out:
/// tenure's session registry, retries, deadlines and lease bookkeeping.
#[derive(Debug)]
pub(crate) struct EtcdSameWork {
    leased: Leased,
    /// Numbers each key name, as tenure's sessions do (never one name twice).
    names: AtomicU64,
}

impl EtcdSameWork {
    /// Refuses, with [`LockError::Config`], a URL configured for work it does not send
    /// (`lease=per-lock`: a grant and a revoke per lock) or over TLS (`etcds://`).
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        let config = EtcdConfig::from_url(url)?;
        if config.lease == crate::LeaseMode::PerLock || config.tls {
            return Err(LockError::Config(
                "the same-work floor sends session-lease work over plain TCP: not with \
                 lease=per-lock or etcds://"
                    .into(),
            ));
        }
        Ok(Self {
            leased: Leased::connect(url, true).await?,
            names: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl Locker for EtcdSameWork {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let owner = OwnerId::random();
        // `key`'s queue, as tenure names it (`EtcdLock::queue_prefix`).
        let queue = format!("{}/", self.leased.config.escaped_prefix(key));
        let unique = own_prefix(&queue, owner, false);
        let attempt = self.names.fetch_add(1, Ordering::Relaxed);
        let ours = format!("{unique}{:016x}-{attempt:x}", self.leased.lease as u64);
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(ours.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    ours.as_str(),
                    holder_text(owner, None),
                    Some(PutOptions::new().with_lease(self.leased.lease)),
                ),
                TxnOp::get(queue.as_str(), Some(head.clone())),
            ])
            .or_else([
                TxnOp::get(ours.as_str(), None),
                TxnOp::get(queue.as_str(), Some(head)),
            ]);
        let mut kv = self.leased.client.kv_client();
        let reply = kv
            .txn(txn)
            .await
            .map_err(|e| cycle_failed("enqueue txn", e))?;
        let first = reply.op_responses().into_iter().any(|op| match op {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .is_some_and(|found| found.key() == ours.as_bytes()),
            _ => false,
        });
        if !reply.succeeded() || !first {
            return Err("a fresh key's queue had another head".into());
        }
        held();
        kv.delete(ours.as_str(), None)
            .await
            .map_err(|e| cycle_failed("release delete", e))?;
        Ok(())
    }
}

/// The floor for an `etcd://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(EtcdFloor::connect(url))
}

/// The same-work floor for an `etcd://` URL.
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(EtcdSameWork::connect(url))
}
