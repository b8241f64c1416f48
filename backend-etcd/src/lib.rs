//! # tenure-etcd
//!
//! A [`DistributedLock`] on an etcd v3 cluster: a queue of keys ordered by the Raft log.
//!
//! **Acquire.** Each acquisition grants its own etcd lease (TTL rounded *up* to whole
//! seconds, the unit etcd leases are kept in) and puts `prefix/<key>/<owner>-<lease-hex>`
//! attached to it, in a transaction guarded by `create_revision == 0`, holding the owner id as its
//! value. The key with the smallest `create_revision` under `prefix/<key>/` holds the
//! lock. A waiter watches only its predecessor — the next older key — for deletion
//! (FIFO, no thundering herd), and keeps its lease alive while it waits. Before a grant
//! is reported, the lease is confirmed alive on the leader (Jepsen found locks granted
//! on expired leases, etcd#11456). `try_acquire` removes its key (revokes its lease) when
//! it is not first.
//!
//! **Fencing token:** the lock key's `create_revision` — the cluster-wide revision of
//! the write that queued it, so tokens of one key strictly increase across release,
//! expiry and crashes, and survive any minority failure.
//!
//! **Extend** checks the key is still ours (owner, revision, lease) and sends a lease
//! keep-alive; `LeaseLost` if the key or the lease is gone. **Release** deletes the key
//! in a transaction guarded by its `create_revision`, owner and lease (so a stale
//! release never deletes a newer lock, etcd#22082), then revokes the lease (in the background).
//!
//! **Why one lease per acquisition** rather than one per client: the trait takes a TTL
//! per call, and a per-acquisition lease gives each lock its own TTL, its own
//! extension and its own fate (an expired lease loses one lock, not all of the
//! client's), needs no background task, and makes the key name unique per grant. The
//! cost is a lease grant and a revoke (two Raft writes) per acquire/release cycle.
//!
//! **Guarantees** ([`EtcdLock::capabilities`]): consensus-replicated (Raft), tolerating
//! ⌊(members−1)/2⌋ member failures; every request carries `require_leader`, so a member
//! cut off from the leader refuses instead of answering stale. Mutual exclusion on the
//! server does not depend on clocks: queue order is the Raft log, and a lease ends only
//! when the leader's monotonic timer runs out (a new leader restarts every lease's timer,
//! so leases may outlive their TTL, never end early). The client's local deadline
//! ([`Lease::valid_until`]) assumes only that the client's clock and the leader's run at
//! rates within [`default_drift`]; a holder paused past its TTL is contained by the
//! fencing token.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_api::LockError> {
//! use std::time::Duration;
//! use tenure_api::{DistributedLock, LockKey};
//! let lock = tenure_etcd::EtcdLock::connect("etcd://10.0.0.1:2379,10.0.0.2:2379/app").await?;
//! let lease = lock.try_acquire(&LockKey::new("job")?, Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admin;
mod config;

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    LeaseClient, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use tenure_api::{
    default_drift, validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind,
    Fairness, FencingKind, FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey,
    OwnerId, ReleaseOutcome, Replication, WaitKind,
};

pub use config::{EtcdConfig, DEFAULT_PORT};

/// A lock service on one etcd cluster. Cheap to clone and share; all calls multiplex
/// over the client's gRPC channels (balanced over the configured endpoints).
#[derive(Clone)]
pub struct EtcdLock {
    config: EtcdConfig,
    client: Client,
    members: usize,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.config)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

/// A queued lock key and the lease it lives on. Until disarmed, dropping it revokes the
/// lease in the background, which deletes the key: a cancelled acquire leaves no ghost.
struct Ticket {
    leases: LeaseClient,
    timeout: Duration,
    lease_id: i64,
    /// The requested TTL (the granted one is at least this).
    ttl: Duration,
    /// The etcd key.
    key: String,
    /// Its create revision: queue position and fencing token.
    revision: i64,
    /// Whether it was first in the queue when last looked at.
    first: bool,
    /// When the grant or the last successful keep-alive was sent.
    refreshed_at: Instant,
    armed: bool,
}

impl Ticket {
    fn refresh_due(&self) -> Instant {
        self.refreshed_at + self.ttl / 3
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Never block in Drop: revoke in the background if there is a runtime; otherwise
        // the lease's TTL removes the key.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (mut leases, id, limit) = (self.leases.clone(), self.lease_id, self.timeout);
            runtime.spawn(async move {
                let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
            });
        }
    }
}

/// Where a wait ended.
enum Turn {
    /// Our key is first in the queue.
    Ours,
    /// The wait bound passed first.
    Deadline,
}

impl EtcdLock {
    /// Connects to the cluster named by an `etcd://` or `etcds://` URL (see
    /// [`EtcdConfig`]) and reads its member list.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(EtcdConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration. Every request carries `require_leader`.
    /// Reading `ca_file` is a short blocking file read.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn with_config(config: EtcdConfig) -> Result<Self, LockError> {
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(config.connect_timeout)
            // etcd refuses pings more often than every 5 s, and pings without streams.
            .with_keep_alive(Duration::from_secs(10), config.request_timeout)
            .with_keep_alive_while_idle(false)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = config.credentials() {
            options = options.with_user(user, password);
        }
        if config.tls {
            let mut tls = TlsOptions::new().with_native_roots();
            if let Some(path) = &config.ca_file {
                let pem = std::fs::read(path).map_err(|e| {
                    LockError::Config(format!("{config}: cannot read ca_file {path:?}: {e}"))
                })?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            if let Some(domain) = &config.tls_domain {
                tls = tls.domain_name(domain.clone());
            }
            options = options.with_tls(tls);
        }
        let limit = config.connect_timeout;
        let client = bounded(&config, limit, "connect", async {
            Client::connect(config.endpoints(), Some(options)).await
        })
        .await?;
        let mut cluster = client.cluster_client();
        let list = bounded(&config, limit, "member list", cluster.member_list()).await?;
        let members = list.members().iter().filter(|m| !m.is_learner()).count();
        Ok(Self {
            members: members.max(1),
            config,
            client,
        })
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Voting members of the cluster, as listed when connecting.
    pub fn members(&self) -> usize {
        self.members
    }

    /// The lease TTL the server grants when asked for `ttl` (whole seconds, rounded up):
    /// etcd raises TTLs below its minimum (1.5 election timeouts) to that minimum, so a
    /// silent holder's lock may outlive a shorter `ttl`. Grants one lease and revokes it.
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease whose revoke was dropped expires after its TTL.
    pub async fn granted_ttl(&self, ttl: Duration) -> Result<Duration, LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.grant(lease_seconds(ttl), None).await }
        };
        let reply = self.call("lease grant", request).await?;
        let _ = self.revoke(reply.id()).await;
        u64::try_from(reply.ttl())
            .ok()
            .filter(|&secs| secs > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| LockError::backend(format!("etcd granted a lease of {} s", reply.ttl())))
    }

    /// The etcd key prefix of `key`'s queue: `prefix/<escaped key>/`. In the key, `%` is
    /// written `%25` and `/` is written `%2F`, so no lock's queue contains another's.
    pub fn queue_prefix(&self, key: &LockKey) -> String {
        format!("{}/", self.escaped_prefix(key.as_str()))
    }

    /// Runs one request for at most the request timeout. A request that never left the
    /// client (its connection to one endpoint was refused, e.g. a dead member the
    /// balancer still tries) is sent again, with a short pause, within the same bound:
    /// that is safe for every request.
    async fn call<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let retried = async {
            let mut pause = Duration::from_millis(5);
            loop {
                match request().await {
                    Err(e) if never_sent(&e) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                    other => return other,
                }
            }
        };
        bounded(&self.config, self.config.request_timeout, what, retried).await
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse, LockError> {
        let request = || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        };
        self.call(what, request).await
    }

    async fn get(
        &self,
        what: &str,
        key: &str,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, LockError> {
        let request = || {
            let (mut kv, options) = (self.client.kv_client(), options.clone());
            let key = key.to_owned();
            async move { kv.get(key, Some(options)).await }
        };
        self.call(what, request).await
    }

    /// Grants a lease of `ttl` rounded up to whole seconds. Returns its id and the TTL to
    /// believe: the requested one, or the granted one if the server granted less.
    async fn grant_lease(&self, ttl: Duration) -> Result<(i64, Duration), LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.grant(lease_seconds(ttl), None).await }
        };
        let reply = self.call("lease grant", request).await?;
        Ok((reply.id(), believed_ttl(ttl, reply.ttl())?))
    }

    async fn revoke(&self, lease_id: i64) -> Result<(), LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.revoke(lease_id).await }
        };
        self.call("lease revoke", request).await.map(|_| ())
    }

    /// The lease's remaining whole seconds as the leader sees them, truncated (a live
    /// lease with less than a second left reads 0; a lease that is gone reads −1).
    async fn time_to_live(&self, lease_id: i64) -> Result<i64, LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.time_to_live(lease_id, None).await }
        };
        Ok(self.call("lease time-to-live", request).await?.ttl())
    }

    /// Sends one lease keep-alive. `LeaseLost` if the lease no longer exists.
    async fn keep_alive(&self, lease_id: i64) -> Result<(), LockError> {
        let keep_alive = || {
            let mut leases = self.client.lease_client();
            async move { leases.keep_alive(lease_id).await }
        };
        match self.call("lease keep-alive", keep_alive).await {
            Ok(_) => Ok(()),
            Err(e) if is_lease_gone(&e) => Err(LockError::lost(format!(
                "etcd lease {lease_id:x} has expired or was revoked"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Keeps a queued ticket's lease alive, recording when the keep-alive was sent.
    async fn refresh(&self, ticket: &mut Ticket) -> Result<(), LockError> {
        let sent = Instant::now();
        self.keep_alive(ticket.lease_id).await?;
        ticket.refreshed_at = sent;
        Ok(())
    }

    /// Revokes a ticket's lease (deleting its key). If that fails, the ticket stays armed
    /// and its drop tries once more in the background; the TTL is the last resort.
    async fn abandon(&self, mut ticket: Ticket) {
        if self.revoke(ticket.lease_id).await.is_ok() {
            ticket.armed = false;
        }
    }

    /// Grants a lease and queues a key on it. The ticket says whether it is first.
    async fn enqueue(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Ticket, LockError> {
        let queue = self.queue_prefix(key);
        let sent = Instant::now();
        let (lease_id, ttl) = self.grant_lease(ttl).await?;
        let mut ticket = Ticket {
            leases: self.client.lease_client(),
            timeout: self.config.request_timeout,
            lease_id,
            ttl,
            key: format!("{}{:016x}", own_prefix(&queue, owner), lease_id as u64),
            revision: 0,
            first: false,
            refreshed_at: sent,
            armed: true,
        };
        // Put our key if it does not exist; read the queue's head in the same revision.
        let txn = Txn::new()
            .when([Compare::create_revision(
                ticket.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    ticket.key.as_str(),
                    owner.to_string(),
                    Some(PutOptions::new().with_lease(lease_id)),
                ),
                TxnOp::get(
                    queue.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1),
                    ),
                ),
            ]);
        let reply = match self.txn("enqueue txn", txn).await {
            Ok(reply) => reply,
            Err(e) => {
                self.abandon(ticket).await;
                return Err(e);
            }
        };
        if !reply.succeeded() {
            self.abandon(ticket).await;
            return Err(LockError::backend(
                "a fresh lease's lock key already existed",
            ));
        }
        ticket.revision = reply.header().map_or(0, |h| h.revision());
        let head = reply.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.key().to_vec()),
            _ => None,
        });
        if ticket.revision <= 0 || head.is_none() {
            self.abandon(ticket).await;
            return Err(LockError::backend("malformed enqueue reply from etcd"));
        }
        ticket.first = head.as_deref() == Some(ticket.key.as_bytes());
        Ok(ticket)
    }

    /// Finds this owner's oldest key left in `queue` by an enqueue whose reply was lost,
    /// and takes it over if its lease is still alive. Younger keys of ours are removed.
    async fn adopt_orphan(
        &self,
        queue: &str,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Option<Ticket>, LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let reply = self
            .get("orphan get", &own_prefix(queue, owner), options)
            .await?;
        let mut orphans = reply.kvs().iter().map(|kv| Ticket {
            leases: self.client.lease_client(),
            timeout: self.config.request_timeout,
            lease_id: kv.lease(),
            ttl,
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            revision: kv.create_revision(),
            first: false,
            refreshed_at: Instant::now(),
            armed: true,
        });
        let Some(mut oldest) = orphans.next() else {
            return Ok(None);
        };
        for younger in orphans {
            self.abandon(younger).await;
        }
        match self.refresh(&mut oldest).await {
            Ok(()) => Ok(Some(oldest)),
            Err(LockError::LeaseLost { .. }) => {
                oldest.armed = false; // the key went with its lease
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The next older key in the ticket's queue (its predecessor), with the revision
    /// the answer was read at.
    async fn predecessor(
        &self,
        queue: &str,
        ticket: &Ticket,
    ) -> Result<(Option<Vec<u8>>, i64), LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(ticket.revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let reply = self.get("predecessor get", queue, options).await?;
        let revision = reply.header().map_or(0, |h| h.revision());
        Ok((reply.kvs().first().map(|kv| kv.key().to_vec()), revision))
    }

    /// Waits until the ticket is first in its queue or `deadline` passes, keeping its
    /// lease alive. Errors leave the ticket queued (the caller decides).
    async fn wait_turn(
        &self,
        queue: &str,
        ticket: &mut Ticket,
        deadline: Instant,
    ) -> Result<Turn, LockError> {
        loop {
            if ticket.first {
                return Ok(Turn::Ours);
            }
            if Instant::now() >= ticket.refresh_due() {
                self.refresh(ticket).await?;
            }
            let (before, revision) = self.predecessor(queue, ticket).await?;
            let Some(before) = before else {
                ticket.first = true;
                return Ok(Turn::Ours);
            };
            if Instant::now() >= deadline {
                return Ok(Turn::Deadline);
            }
            // Watch the predecessor's deletion from just after the read, so none is missed.
            let options = WatchOptions::new()
                .with_start_revision(revision + 1)
                .with_filters([WatchFilterType::NoPut]);
            let watch = || {
                let (mut watches, before) = (self.client.watch_client(), before.clone());
                let options = options.clone();
                async move { watches.watch(before, Some(options)).await }
            };
            let mut watch = self.call("watch", watch).await?;
            loop {
                tokio::select! {
                    message = watch.message() => {
                        let message = message
                            .map_err(|e| convert(&self.config, "watch", e))?
                            .ok_or_else(|| self.unavailable("watch: the stream ended"))?;
                        if message.canceled() {
                            if message.compact_revision() > 0 {
                                break; // compacted past our start: just look again
                            }
                            return Err(self.unavailable(&format!(
                                "watch cancelled: {}",
                                message.cancel_reason()
                            )));
                        }
                        if message
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            break;
                        }
                    }
                    _ = tokio::time::sleep_until(ticket.refresh_due().into()) => {
                        self.refresh(ticket).await?;
                    }
                    _ = tokio::time::sleep_until(deadline.into()) => return Ok(Turn::Deadline),
                }
            }
        }
    }

    /// Confirms the first-in-queue ticket's lease is alive on the leader (etcd#11456),
    /// refreshing it if it was last refreshed more than a tenth of the TTL ago, and turns
    /// it into a lease. `LeaseLost` if the lease expired.
    async fn grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ticket: &mut Ticket,
    ) -> Result<Lease, LockError> {
        if ticket.refreshed_at.elapsed() > ticket.ttl / 10 {
            self.refresh(ticket).await?;
        } else {
            if self.time_to_live(ticket.lease_id).await? < 0 {
                return Err(LockError::lost(format!(
                    "etcd lease {:x} expired before the grant was confirmed",
                    ticket.lease_id
                )));
            }
        }
        ticket.armed = false;
        let token = u64::try_from(ticket.revision)
            .map_err(|_| LockError::backend("negative create revision"))?;
        Ok(Lease::new(
            key.clone(),
            owner,
            FencingToken(token),
            ticket.refreshed_at,
            ticket.ttl,
            default_drift(ticket.ttl),
        )
        .with_handle(LeaseHandle {
            path: ticket.key.clone(),
            id: ticket.lease_id,
            revision: ticket.revision,
        }))
    }

    /// The current value of `lease`'s key if it is still ours (same create revision,
    /// owner and lease), else `LeaseLost`.
    async fn check_owned(&self, lease: &Lease) -> Result<KeyValue, LockError> {
        let handle = lease.handle();
        if handle.path.is_empty() || handle.id == 0 {
            return Err(LockError::lost("the lease carries no etcd key"));
        }
        let reply = self.get("get", &handle.path, GetOptions::new()).await?;
        let current = reply.kvs().first().cloned();
        match current {
            Some(current) if is_ours(&current, lease) => Ok(current),
            Some(_) => Err(LockError::lost(format!(
                "`{}` is held by another owner",
                lease.key()
            ))),
            None => Err(LockError::lost(format!(
                "the lock key of `{}` is gone (expired or released)",
                lease.key()
            ))),
        }
    }

    /// After a move of `lease`'s key to etcd lease `moved_to` whose outcome is unknown:
    /// `true` if the key is ours on `moved_to`, `false` if it is still ours on the old
    /// lease, `LeaseLost` if it is gone or another owner's.
    async fn check_owned_on(&self, lease: &Lease, moved_to: i64) -> Result<bool, LockError> {
        let reply = self
            .get("get", &lease.handle().path, GetOptions::new())
            .await?;
        match reply.kvs().first() {
            Some(current) if is_ours(current, lease) => Ok(false),
            Some(current) if is_ours_on(current, lease, moved_to) => Ok(true),
            _ => Err(LockError::lost(format!(
                "the lock key of `{}` is gone or another owner's",
                lease.key()
            ))),
        }
    }

    /// The compare clauses that make a write apply only to `lease`'s own key.
    fn ownership(lease: &Lease) -> Vec<Compare> {
        let path = lease.handle().path.as_str();
        vec![
            Compare::create_revision(path, CompareOp::Equal, lease.token().get() as i64),
            Compare::value(path, CompareOp::Equal, lease.owner().to_string()),
            Compare::lease(path, CompareOp::Equal, lease.handle().id),
        ]
    }

    fn unavailable(&self, what: &str) -> LockError {
        LockError::Unavailable {
            message: format!("{what} on {}", self.config.hosts.join(",")),
            source: None,
        }
    }
}

#[async_trait]
impl DistributedLock for EtcdLock {
    /// One lease grant and one transaction; if not first, the lease is revoked (removing
    /// the key) and the answer is `None`.
    ///
    /// # Cancel safety
    /// If dropped after the lease was granted, the lease is revoked in the background
    /// (removing any key put on it); without a runtime, its TTL removes it.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let owner = OwnerId::random();
        let mut ticket = self.enqueue(key, owner, ttl).await?;
        if !ticket.first {
            self.abandon(ticket).await;
            return Ok(None);
        }
        match self.grant(key, owner, &mut ticket).await {
            Ok(lease) => Ok(Some(lease)),
            Err(LockError::LeaseLost { reason }) => Err(self.unavailable(&reason)),
            Err(e) => Err(e),
        }
    }

    /// Queues a key and waits for the predecessor's deletion (a watch: push, FIFO),
    /// keeping the waiting lease alive, for at most `opts.wait`. Transient errors are
    /// retried within the bound without losing the queue position; if the wait ends on
    /// one, that error is returned rather than `Timeout`. All retries of one call use
    /// the same owner id.
    ///
    /// # Cancel safety
    /// If dropped, the waiting key's lease is revoked in the background: no ghost
    /// waiter or lock is left behind (without a runtime, the TTL removes it).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let queue = self.queue_prefix(key);
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut ticket: Option<Ticket> = None;
        let mut failures = 0u32;
        loop {
            let result = match ticket.as_mut() {
                None => {
                    // After a failure, a key of ours may be queued already (an enqueue
                    // whose reply was lost): wait on it rather than behind it.
                    let queued = match failures {
                        0 => self.enqueue(key, owner, opts.ttl).await,
                        _ => match self.adopt_orphan(&queue, owner, opts.ttl).await {
                            Ok(Some(orphan)) => Ok(orphan),
                            Ok(None) => self.enqueue(key, owner, opts.ttl).await,
                            Err(e) => Err(e),
                        },
                    };
                    match queued {
                        Ok(queued) => {
                            ticket = Some(queued);
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
                Some(queued) => match self.wait_turn(&queue, queued, deadline).await {
                    Ok(Turn::Ours) => self.grant(key, owner, queued).await.map(Some),
                    Ok(Turn::Deadline) => Ok(None),
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => {
                    if let Some(queued) = ticket.take() {
                        self.abandon(queued).await;
                    }
                    return Err(LockError::Timeout {
                        waited: started.elapsed(),
                    });
                }
                Err(e) => {
                    let lease_gone = matches!(e, LockError::LeaseLost { .. });
                    if lease_gone {
                        // Our waiting lease expired (e.g. keep-alives failed): queue anew.
                        if let Some(mut queued) = ticket.take() {
                            queued.armed = false;
                        }
                    }
                    let now = Instant::now();
                    if !(lease_gone || e.is_retryable()) || now >= deadline {
                        if let Some(queued) = ticket.take() {
                            self.abandon(queued).await;
                        }
                        return Err(if lease_gone {
                            self.unavailable("the waiting lease kept expiring")
                        } else {
                            e
                        });
                    }
                    failures += 1;
                    tokio::time::sleep(opts.backoff.delay(failures).min(deadline - now)).await;
                }
            }
        }
    }

    /// Checks the key is still ours, then sends a lease keep-alive. A TTL needing more
    /// whole seconds than the lease was granted with moves the key to a new lease (its
    /// create revision, hence the token, is kept) and revokes the old one.
    ///
    /// If the move's reply is lost, the key is read back and the call keeps whichever
    /// lease it lives on; a move never revokes the lease the key may be attached to.
    ///
    /// # Cancel safety
    /// `lease` is unchanged if dropped. A keep-alive may have been applied. A move dropped
    /// in flight may have re-attached the key to the new lease: the lock then stays held
    /// until that lease's TTL runs out (never freed early), and this `lease`'s next
    /// `extend` reports `LeaseLost`. The old lease is left to its TTL.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        self.check_owned(lease).await?;
        let old_id = lease.handle().id;
        if lease_seconds(ttl) <= lease_seconds(lease.ttl()) {
            self.keep_alive(old_id).await?;
            lease.renewed(sent, ttl, default_drift(ttl));
            return Ok(());
        }
        // A longer TTL than the lease holds: re-attach the key to a longer lease.
        let (new_id, ttl) = self.grant_lease(ttl).await?;
        // Once the move is sent the key may live on the new lease, so it is never revoked
        // on drop, only once the key is known not to be on it (a dropped call leaves it
        // to its TTL).
        let mut fresh = Ticket {
            leases: self.client.lease_client(),
            timeout: self.config.request_timeout,
            lease_id: new_id,
            ttl,
            key: lease.handle().path.clone(),
            revision: lease.handle().revision,
            first: true,
            refreshed_at: sent,
            armed: false,
        };
        let txn = Txn::new()
            .when(Self::ownership(lease))
            .and_then([TxnOp::put(
                lease.handle().path.as_str(),
                lease.owner().to_string(),
                Some(PutOptions::new().with_lease(new_id)),
            )]);
        let moved = match self.txn("extend txn", txn).await {
            Ok(reply) if reply.succeeded() => Ok(()),
            Ok(_) => Err(LockError::lost(format!(
                "`{}` is no longer held by {}",
                lease.key(),
                lease.owner()
            ))),
            // The reply was lost: the move may have applied. Read where the key lives.
            Err(e) => match self.check_owned_on(lease, new_id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(e),
                Err(lost @ LockError::LeaseLost { .. }) => Err(lost),
                // Still unknown: the new lease runs out its TTL on its own.
                Err(_) => return Err(e),
            },
        };
        if let Err(e) = moved {
            // The key is not on the new lease: it can go.
            fresh.armed = true;
            self.abandon(fresh).await;
            return Err(e);
        }
        let _ = self.revoke(old_id).await;
        let mut handle = lease.handle().clone();
        handle.id = new_id;
        *lease = lease.clone().with_handle(handle);
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    /// Deletes the key only if it is still this grant's (create revision, owner and
    /// lease compared in one transaction), then revokes the lease in the background.
    ///
    /// # Cancel safety
    /// If dropped, the lock may stay held until its lease's TTL runs out.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        if lease.handle().path.is_empty() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let txn = Txn::new()
            .when(Self::ownership(&lease))
            .and_then([TxnOp::delete(lease.handle().path.as_str(), None)]);
        if !self.txn("release txn", txn).await?.succeeded() {
            // Not ours (expired, or a forged lease): the lease id may not be ours either.
            return Ok(ReleaseOutcome::NotHeld);
        }
        // The key is gone and the lock free. Revoking the now empty lease is housekeeping:
        // it runs in the background, off the caller's latency (a failed or dropped revoke
        // only lets the lease run out its TTL).
        let (lock, id) = (self.clone(), lease.handle().id);
        tokio::spawn(async move {
            let _ = lock.revoke(id).await;
        });
        Ok(ReleaseOutcome::Released)
    }

    /// Reads the queue's head (owner from its value, token from its create revision) and
    /// its lease's remaining TTL (whole seconds, rounded down by etcd).
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let reply = self
            .get("inspect get", &self.queue_prefix(key), options)
            .await?;
        let Some(head) = reply.kvs().first() else {
            return Ok(None);
        };
        let owner = OwnerId::parse(head.value_str().unwrap_or_default())?;
        let token = u64::try_from(head.create_revision())
            .map_err(|_| LockError::backend("negative create revision"))?;
        let ttl = self.lease_left(head.lease()).await?;
        Ok(Some(HolderInfo {
            owner,
            token: Some(FencingToken(token)),
            remaining: Some(Duration::from_secs(u64::try_from(ttl).unwrap_or(0))),
        }))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "etcd",
            fencing: FencingKind::ConsensusOrdered,
            expiry: ExpiryKind::LeaderTimedLease,
            replication: Replication::Consensus {
                members: self.members,
            },
            wait: WaitKind::Push,
            fairness: Fairness::Fifo,
            failures_tolerated: (self.members - 1) / 2,
            clock_dependent: false,
        }
    }
}

/// The start of every queue key `owner` puts in `queue`: a retry finds its own keys.
fn own_prefix(queue: &str, owner: OwnerId) -> String {
    format!("{queue}{owner}-")
}

/// Whether `current` is the key `lease` was granted on.
fn is_ours(current: &KeyValue, lease: &Lease) -> bool {
    is_ours_on(current, lease, lease.handle().id)
}

/// Whether `current` is `lease`'s key, attached to etcd lease `lease_id`.
fn is_ours_on(current: &KeyValue, lease: &Lease, lease_id: i64) -> bool {
    current.create_revision() == lease.token().get() as i64
        && current.lease() == lease_id
        && current.value() == lease.owner().to_string().as_bytes()
}

/// etcd leases count whole seconds: a TTL rounded up (at least 1 s; the server may raise
/// it to its minimum, about 1.5 election timeouts).
fn lease_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The TTL a lease granted `granted_secs` for `requested` may be believed for: never more
/// than the server granted (etcd raises short TTLs to its minimum, never lowers them, but
/// the reply is what counts). A non-positive grant is a malformed reply.
fn believed_ttl(requested: Duration, granted_secs: i64) -> Result<Duration, LockError> {
    let granted = u64::try_from(granted_secs)
        .ok()
        .filter(|&secs| secs > 0)
        .ok_or_else(|| LockError::backend(format!("etcd granted a lease of {granted_secs} s")))?;
    Ok(requested.min(Duration::from_secs(granted)))
}

/// Runs `request` for at most `limit`; running out is `Unavailable`.
async fn bounded<T>(
    config: &EtcdConfig,
    limit: Duration,
    what: &str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result.map_err(|e| convert(config, what, e)),
        Err(_) => Err(LockError::Unavailable {
            message: format!(
                "{what} on {}: no reply within {limit:?}",
                config.hosts.join(",")
            ),
            source: None,
        }),
    }
}

/// gRPC status codes (see `tonic::Code`).
mod code {
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const NOT_FOUND: i32 = 5;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const UNAVAILABLE: i32 = 14;
}

/// Unreachable, no leader, timed out or cut off is `Unavailable`; anything else is
/// `Backend`. The client error is kept as the source; no secret is in the message.
fn convert(config: &EtcdConfig, what: &str, error: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let message = format!("{what} on {}: {error}", config.hosts.join(","));
    let transient = match &error {
        E::GRpcStatus(status) => matches!(
            i32::from(status.code()),
            code::CANCELLED
                | code::UNKNOWN
                | code::DEADLINE_EXCEEDED
                | code::RESOURCE_EXHAUSTED
                | code::ABORTED
                | code::UNAVAILABLE
        ),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::LeaseKeepAliveError(_) => !error.to_string().contains("not found"),
        _ => false,
    };
    if is_not_found(&error) {
        return LockError::Backend {
            message,
            source: Some(Box::new(error)),
        };
    }
    if transient {
        LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        }
    } else {
        LockError::Backend {
            message,
            source: Some(Box::new(error)),
        }
    }
}

/// Whether a request failed before it left the client: its connection was refused.
fn never_sent(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    let mut source: Option<&(dyn std::error::Error + 'static)> = match error {
        E::GRpcStatus(status) => Some(status),
        E::TransportError(e) => Some(e),
        E::IoError(e) => Some(e),
        _ => None,
    };
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

fn is_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => i32::from(status.code()) == code::NOT_FOUND,
        etcd_client::Error::LeaseKeepAliveError(e) => e.contains("not found"),
        _ => false,
    }
}

/// Whether a converted error says the lease does not exist (expired or revoked).
fn is_lease_gone(error: &LockError) -> bool {
    match error {
        LockError::Backend {
            source: Some(source),
            ..
        } => source
            .downcast_ref::<etcd_client::Error>()
            .is_some_and(is_not_found),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(10)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn a_lease_is_believed_for_no_longer_than_granted() {
        let asked = Duration::from_millis(2500);
        assert_eq!(believed_ttl(asked, 3).unwrap(), asked);
        assert_eq!(believed_ttl(asked, 60).unwrap(), asked);
        assert_eq!(believed_ttl(asked, 2).unwrap(), Duration::from_secs(2));
        for bad in [0, -1, i64::MIN] {
            let error = believed_ttl(asked, bad).unwrap_err();
            assert!(matches!(error, LockError::Backend { .. }), "{error}");
        }
    }

    #[test]
    fn lease_gone_is_recognised_only_for_not_found() {
        let config = EtcdConfig::from_url("etcd://h").unwrap();
        let gone = convert(
            &config,
            "x",
            etcd_client::Error::LeaseKeepAliveError("lease not found".into()),
        );
        assert!(is_lease_gone(&gone), "{gone}");
        let down = convert(&config, "x", etcd_client::Error::WatchError("eof".into()));
        assert!(matches!(down, LockError::Unavailable { .. }), "{down}");
        assert!(!is_lease_gone(&down));
    }

    #[test]
    fn only_refused_connections_count_as_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_sent(&etcd_client::Error::IoError(refused)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_sent(&etcd_client::Error::IoError(reset)));
        assert!(!never_sent(&etcd_client::Error::WatchError("x".into())));
    }
}
