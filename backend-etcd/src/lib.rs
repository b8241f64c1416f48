#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod entry;
mod feed;
#[cfg(feature = "testbed")]
mod floor;
#[cfg(feature = "testbed")]
pub mod lab;
mod queue;
mod rpc;
mod session;
#[cfg(feature = "testbed")]
mod testbed;
#[cfg(feature = "testbed")]
mod verdicts;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp,
};
use tenure_api::backend::{default_drift, parse_holder_text, Backend, Driver};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome, Replication,
    WaitKind,
};

pub use config::{EtcdConfig, LeaseMode, DEFAULT_PORT};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;
use queue::{own_prefix, OwnLeases, Ticket, Turn};
use rpc::{bounded, lease_seconds, Rpc};
use session::Sessions;
#[cfg(feature = "testbed")]
pub use testbed::{RequestFault, RequestFaults};

/// A lock service on one etcd cluster. Cheap to clone and share; all calls multiplex
/// over the client's gRPC channels (balanced over the configured endpoints).
#[derive(Clone)]
pub struct EtcdLock {
    rpc: Rpc,
    members: usize,
    /// Session leases ([`LeaseMode::Session`]), shared by clones.
    sessions: Arc<Sessions>,
    /// Leases granted per lock ([`LeaseMode::PerLock`]), shared by clones.
    own_leases: Arc<OwnLeases>,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.rpc.config)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

/// A connection the server closed at once is the likely sign of a TLS mismatch the
/// client cannot see (the server's alert is lost on the way up): say what to check. The
/// error stays `Unavailable`, since a network fault looks the same.
fn connect_hint(config: &EtcdConfig, error: LockError) -> LockError {
    let hint = if !config.tls {
        "if the cluster serves TLS, use etcds://"
    } else if config.cert_file.is_none() {
        "if the cluster requires client certificates (--client-cert-auth), set cert_file \
         and key_file"
    } else {
        return error;
    };
    match error {
        LockError::Unavailable { message, source } => LockError::Unavailable {
            message: format!("{message} ({hint})"),
            source,
        },
        other => other,
    }
}

impl EtcdLock {
    /// This backend for URL dispatch ([`Driver`]): `etcd://`, `etcds://`.
    pub const DRIVER: Driver = Driver {
        name: "etcd",
        schemes: &["etcd", "etcds"],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

    /// Connects to the cluster named by an `etcd://` or `etcds://` URL (see
    /// [`EtcdConfig`]) and reads its member list.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(EtcdConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration. Every request carries `require_leader`.
    /// Reading the TLS files (`ca_file`, `cert_file`, `key_file`) is a short blocking read.
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
            tenure_api::tls::install_crypto_provider();
            let pem = tenure_api::tls::read_pem_files(
                &config.hosts.join(","),
                config.ca_file.as_deref(),
                config.cert_file.as_deref(),
                config.key_file.as_deref(),
            )?;
            let mut tls = TlsOptions::new().with_native_roots();
            if let Some(ca) = pem.ca {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = pem.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
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
        .await
        .map_err(|error| connect_hint(&config, error))?;
        let mut cluster = client.cluster_client();
        let list = bounded(&config, limit, "member list", cluster.member_list()).await?;
        let members = list.members().iter().filter(|m| !m.is_learner()).count();
        let rpc = Rpc {
            config: Arc::new(config),
            client,
            #[cfg(feature = "testbed")]
            faults: None,
        };
        Ok(Self {
            members: members.max(1),
            sessions: Arc::new(Sessions::new(rpc.clone())),
            own_leases: Arc::default(),
            rpc,
        })
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.rpc.config
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
            let mut leases = self.rpc.client.lease_client();
            async move { leases.grant(lease_seconds(ttl), None).await }
        };
        let reply = self.rpc.call("lease grant", request).await?;
        let _ = self.rpc.revoke(reply.id()).await;
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

    /// How many clients — the holders (a writer, or every reader) and the waiters — are
    /// queued for `key`: the keys
    /// under its [`queue_prefix`](Self::queue_prefix), counted by the server.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn queued(&self, key: &LockKey) -> Result<usize, LockError> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let prefix = self.queue_prefix(key);
        let reply = self.rpc.get("queue count", &prefix, options).await?;
        usize::try_from(reply.count())
            .map_err(|_| LockError::backend(format!("etcd counted {} keys", reply.count())))
    }

    /// The current value of `lease`'s key if it is still ours (same create revision,
    /// owner and lease), else `LeaseLost`.
    async fn check_owned(&self, lease: &Lease) -> Result<KeyValue, LockError> {
        let handle = lease.handle();
        if handle.path.is_empty() || handle.id == 0 {
            return Err(LockError::lost("the lease carries no etcd key"));
        }
        let reply = self.rpc.get("get", &handle.path, GetOptions::new()).await?;
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
            .rpc
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

    /// Whether `lease` names a key its owner queued for its lock: the owner id is part of
    /// every key name, so a lease naming another owner's key is refused without a request.
    fn names_its_own_key(&self, lease: &Lease) -> bool {
        let queue = self.queue_prefix(lease.key());
        lease
            .handle()
            .path
            .starts_with(&own_prefix(&queue, lease.owner(), lease.is_shared()))
    }

    /// What [`DistributedLock::acquire`] and [`DistributedLock::acquire_shared`] do: queue
    /// a writer's or (`shared`) a reader's key and wait for its turn.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`].
    async fn wait_for(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        shared: bool,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let label = opts.label.as_deref();
        let queue = self.queue_prefix(key);
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut ticket: Option<Ticket> = None;
        let mut failures = 0u32;
        loop {
            let result = match ticket.as_mut() {
                None => match self.new_ticket(key, owner, opts.ttl, shared).await {
                    Ok(fresh) => {
                        ticket = Some(fresh);
                        continue;
                    }
                    Err(e) => Err(e),
                },
                // Not queued yet, or the reply to queueing it was lost: the same put again
                // (it finds the key if the first one applied; nothing is undone meanwhile).
                Some(queued) if queued.revision == 0 => {
                    match self.queue_ticket(key, owner, label, queued).await {
                        Ok(()) => continue,
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
                        // Our waiting lease expired (e.g. keep-alives failed), or our key
                        // was deleted under it: queue anew, on a new key. A lease of its
                        // own that still lives is revoked (it carries nothing of ours).
                        if let Some(queued) = ticket.take() {
                            self.abandon(queued).await;
                        }
                    }
                    let now = Instant::now();
                    if !(lease_gone || e.is_retryable()) || now >= deadline {
                        if let Some(queued) = ticket.take() {
                            self.abandon(queued).await;
                        }
                        return Err(if lease_gone {
                            self.rpc.unavailable("the waiting lease kept expiring")
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

    /// The compare that makes a write apply only to the key `lease` was granted on (with
    /// [`names_its_own_key`](Self::names_its_own_key)), and only while it exists: a put
    /// without it would create a released or expired key again. Key names are never
    /// reused, so the key's create revision, the token, identifies the grant. One read
    /// per compare on every member: the owner is checked in the name, not in the value.
    fn created_by(lease: &Lease) -> Compare {
        let path = lease.handle().path.as_str();
        Compare::create_revision(path, CompareOp::Equal, lease.token().get() as i64)
    }
}

#[async_trait]
impl DistributedLock for EtcdLock {
    /// One transaction (and, with `?lease=per-lock`, a lease grant first); if not first,
    /// the key is removed and the answer is `None`.
    ///
    /// # Cancel safety
    /// If dropped once the key may have been sent, the key is removed in the background
    /// (a lease of its own is revoked; a session deletes it); failing that, or without a
    /// runtime, the TTL removes it.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let owner = OwnerId::random();
        let mut ticket = match self.enqueue(key, owner, ttl, None).await {
            // The session's lease ended unnoticed: once more, on a new session.
            Err(LockError::LeaseLost { .. }) => self.enqueue(key, owner, ttl, None).await?,
            other => other?,
        };
        if !ticket.first {
            self.abandon(ticket).await;
            return Ok(None);
        }
        match self.grant(key, owner, &mut ticket).await {
            Ok(lease) => Ok(Some(lease)),
            Err(LockError::LeaseLost { reason }) => Err(self.rpc.unavailable(&reason)),
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
    /// If dropped, the waiting key is removed in the background (its own lease revoked,
    /// or deleted by its session): no ghost waiter or lock is left behind (without a
    /// runtime, the TTL removes it).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.wait_for(key, opts, false).await
    }

    /// As [`acquire`](Self::acquire), with a reader's key (named with a mark of its own),
    /// which waits only for the writers' keys before it: readers hold the lock together,
    /// writers — tenure's plain locks and other recipes' keys alike — alone, in one FIFO
    /// queue, so a writer waiting holds back the readers queued after it. The token is the
    /// key's create revision, as a writer's.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        self.wait_for(key, opts, true).await
    }

    /// Checks the key is still ours and keeps it for another `ttl`: a keep-alive of its
    /// own lease, or (on a session lease) its deadline moved on before the check, so the
    /// session never deletes it under a renewal. A TTL longer than the lease holds, or a
    /// lease granted by another client (whose session would delete the key at the
    /// deadline it last set), moves the key to a lease of this client's (its create
    /// revision, hence the token, is kept); an old lease of its own is then revoked.
    ///
    /// If the move's reply is lost, the key is read back and the call keeps whichever
    /// lease it lives on; a lease the key is on, or that a move still in flight may
    /// attach it to, is never revoked (if such a move lands, the lock stays held until
    /// that lease's TTL, and this `lease`'s next `extend` reports `LeaseLost`).
    ///
    /// # Cancel safety
    /// `lease` is unchanged if dropped. A keep-alive may have been applied. A move dropped
    /// in flight may have re-attached the key to the new lease: the lock then stays held
    /// until that lease's TTL (or its session deadline) runs out, never freed early, and
    /// this `lease`'s next `extend` reports `LeaseLost`. The old lease is left to its TTL.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        let (old_id, path) = (lease.handle().id, lease.handle().path.clone());
        // Only a lease of this client's own is kept where it is: one taken by another
        // client (e.g. another `tenure` process) may be on that client's session, which
        // deletes the key at the deadline that client last set, so it is moved onto a
        // lease of this client's (same key, so same token).
        let session = match self.rpc.config.lease {
            LeaseMode::PerLock => None,
            LeaseMode::Session => self.sessions.find(old_id),
        };
        let fits = match &session {
            Some(session) => ttl <= session.granted,
            None if self.own_leases.contains(old_id) => {
                lease_seconds(ttl) <= lease_seconds(lease.ttl())
            }
            None => false,
        };
        if fits {
            if let Some(session) = &session {
                session.renew(&path, sent + ttl)?;
            }
            self.check_owned(lease).await?;
            let at = match &session {
                Some(session) => self.sessions.confirmed(session, sent, ttl).await?,
                None => {
                    self.rpc.keep_alive(old_id).await?;
                    sent
                }
            };
            lease.renewed(at, ttl, default_drift(ttl));
            return Ok(());
        }
        let current = self.check_owned(lease).await?;
        // A longer TTL than the lease holds: re-attach the key to a longer lease. Once the
        // move is sent the key may live on it, so the new lease is never revoked on drop,
        // only once the key is known not to be on it (a dropped call leaves it to its TTL,
        // or to its session deadline).
        let mut fresh = self.ticket(ttl, &|_| path.clone()).await?;
        fresh.armed = false;
        fresh.revision = lease.handle().revision;
        let new_id = fresh.lease_id;
        let txn = Txn::new()
            .when([
                Self::created_by(lease),
                Compare::lease(path.as_str(), CompareOp::Equal, old_id),
            ])
            .and_then([TxnOp::put(
                path.as_str(),
                // The value as it is: the owner and the grant's label.
                current.value(),
                Some(PutOptions::new().with_lease(new_id)),
            )])
            .or_else([TxnOp::get(path.as_str(), None)]);
        let moved = match self.rpc.txn("extend txn", txn).await {
            Ok(reply) if reply.succeeded() => Ok(()),
            // Already on the new lease: moved by an earlier call whose reply was lost (a
            // session's lease is the same for every call with this TTL).
            Ok(reply) if moved_by_earlier(&reply, lease, new_id) => Ok(()),
            Ok(_) => Err(LockError::lost(format!(
                "`{}` is no longer held by {}",
                lease.key(),
                lease.owner()
            ))),
            // The reply was lost: the move may have applied. Read where the key lives.
            Err(e) => match self.check_owned_on(lease, new_id).await {
                Ok(true) => Ok(()),
                // Gone: no move can apply to it any more.
                Err(lost @ LockError::LeaseLost { .. }) => Err(lost),
                // Not moved, or still unknown: the move may yet land (a proposal that
                // commits late), so the new lease is never revoked; unrenewed, it (or its
                // session deadline) ends on its own.
                Ok(false) | Err(_) => return Err(e),
            },
        };
        if let Err(e) = moved {
            // The key is known not to be on the new lease: it can go.
            fresh.armed = true;
            self.abandon(fresh).await;
            return Err(e);
        }
        match &session {
            Some(old) => old.forget(&path),
            None if self.own_leases.take(old_id) => {
                let _ = self.rpc.revoke(old_id).await;
            }
            // Another client's lease, possibly shared by its other keys: left alone.
            None => {}
        }
        let mut handle = lease.handle().clone();
        handle.id = new_id;
        *lease = lease.clone().with_handle(handle);
        lease.renewed(
            fresh.refreshed_at.min(sent),
            fresh.ttl,
            default_drift(fresh.ttl),
        );
        Ok(())
    }

    /// Deletes the key if it is still there, with a plain delete: its name carries the
    /// owner id and an attempt number and is never reused, so a key of that name is this
    /// grant's (a stale or replayed release finds it gone, etcd#22082). A lease this
    /// client granted for the lock is then revoked in the background; any other lease
    /// (a session's, or one from another client) stays, for its other keys.
    ///
    /// # Cancel safety
    /// If dropped, the lock may stay held until its lease's TTL (or, on a session lease,
    /// its deadline) runs out.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        if !self.names_its_own_key(&lease) {
            return Ok(ReleaseOutcome::NotHeld);
        }
        if self.rpc.delete("release", &lease.handle().path).await? == 0 {
            // Gone: expired, reaped by its session, or released before. A session still
            // deletes the key at its deadline, which then finds nothing.
            return Ok(ReleaseOutcome::NotHeld);
        }
        let id = lease.handle().id;
        match self.rpc.config.lease {
            LeaseMode::Session => {
                if let Some(session) = self.sessions.find(id) {
                    session.forget(&lease.handle().path);
                }
            }
            // The key is gone and the lock free. Revoking the now empty lease is
            // housekeeping, off the caller's latency (a failed or dropped revoke only lets
            // the lease run out its TTL); a lease this client did not grant per lock may
            // carry other keys (a session's) and is left alone.
            LeaseMode::PerLock if self.own_leases.take(id) => {
                let rpc = self.rpc.clone();
                tokio::spawn(async move {
                    let _ = rpc.revoke(id).await;
                });
            }
            LeaseMode::PerLock => {}
        }
        Ok(ReleaseOutcome::Released)
    }

    /// Reads the queue's head (owner from its value, token from its create revision) and
    /// its lease's remaining TTL (whole seconds, rounded down by etcd). On a session
    /// lease that is how long the lock outlives its client if that stops now; while the
    /// client runs, the lock also ends once its holder stops renewing it.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let reply = self
            .rpc
            .get("inspect get", &self.queue_prefix(key), options)
            .await?;
        let Some(head) = reply.kvs().first() else {
            return Ok(None);
        };
        let holder = entry::recorded(head.key(), head.value())?;
        let token = u64::try_from(head.create_revision())
            .map_err(|_| LockError::backend("negative create revision"))?;
        let ttl = self.lease_left(head.lease()).await?;
        Ok(Some(HolderInfo {
            owner: holder.owner,
            token: Some(FencingToken(token)),
            remaining: Some(Duration::from_secs(u64::try_from(ttl).unwrap_or(0))),
            label: holder.label,
            foreign: holder.foreign,
        }))
    }

    /// The key's queue read once, then followed by a watch from that revision: every head
    /// of the queue — every holder as the server saw it — in order, however briefly it
    /// held (of readers holding together, the oldest), each with its token and label (`remaining` is not read). A broken watch is an
    /// `Err` item, and the feed watches again from the last revision it saw (kept recent
    /// by progress reports while the queue is quiet), so nothing is missed unless the
    /// cluster compacted past it meanwhile (the feed then reads the queue afresh).
    fn holder_changes(&self, key: &LockKey) -> Option<tenure_api::HolderFeed> {
        Some(feed::holder_feed(self.rpc.clone(), self.queue_prefix(key)))
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
            labels: true,
            shared: true,
        }
    }
}

/// Whether `current` is the key `lease` was granted on.
fn is_ours(current: &KeyValue, lease: &Lease) -> bool {
    is_ours_on(current, lease, lease.handle().id)
}

/// Whether a move's transaction that did not apply found `lease`'s key on `new_id`
/// already (its `or_else` read).
fn moved_by_earlier(reply: &etcd_client::TxnResponse, lease: &Lease, new_id: i64) -> bool {
    reply.op_responses().into_iter().any(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .is_some_and(|kv| is_ours_on(kv, lease, new_id)),
        _ => false,
    })
}

/// Whether `current` is `lease`'s key, attached to etcd lease `lease_id`.
fn is_ours_on(current: &KeyValue, lease: &Lease, lease_id: i64) -> bool {
    current.create_revision() == lease.token().get() as i64
        && current.lease() == lease_id
        && current
            .value_str()
            .ok()
            .and_then(|text| parse_holder_text(text).ok())
            .is_some_and(|(owner, _)| owner == lease.owner())
}
