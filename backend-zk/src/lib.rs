#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod error;
mod feed;
#[cfg(feature = "testbed")]
pub mod floor;
#[cfg(feature = "testbed")]
pub mod lab;
mod names;
mod pending;
mod queue;
mod session;
#[cfg(feature = "testbed")]
mod testbed;
#[cfg(feature = "testbed")]
mod verdicts;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_api::backend::{default_drift, foreign_label, Backend, Driver};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome, Replication,
    WaitKind,
};
use zookeeper_client::{Acls, Client, Error as ZkError};

pub use config::{ZkConfig, DEFAULT_PORT};
use error::{bounded, from_zk, session_gone};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;
pub use names::NodeNames;
use names::{encode_key, owner_of_path, LockNode};
use pending::Pending;
use queue::{lost_while_queued, Position, Stop};
use session::{Health, Session};

/// A lock service on a ZooKeeper ensemble, holding one ZooKeeper session.
///
/// Every lease granted through a `ZkLock` lives in its session: clones share the session;
/// create separate `ZkLock`s for independent holders (as separate processes would be).
/// Dropping the last clone closes the session, which frees every lock it still held.
/// If the session is lost, the next call opens a new one.
#[derive(Clone)]
pub struct ZkLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    acls: Acls<'static>,
    current: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("config", &self.inner.config)
            .field("session", &self.current_session())
            .finish()
    }
}

/// One node in a key's queue, as [`ZkLock::queue`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedNode {
    /// The node's name: tenure's in the URL's [`NodeNames`] layout (Curator's
    /// `_c_<owner as UUID>-lock-<sequence>` by default); another recipe's contender keeps
    /// the name its client gave it (see the crate docs).
    pub name: String,
    /// The acquire call that created it; for another recipe's node, the UUID its name
    /// carries, or one derived from its name.
    pub owner: OwnerId,
    /// Its queue position (the server's sequence number).
    pub sequence: i64,
    /// A reader's node (tenure's, Curator's `__READ__`, kazoo's `__rlock__`): it waits
    /// for the writers' nodes before it only.
    pub reader: bool,
}

impl ZkLock {
    /// This backend for URL dispatch ([`Driver`]): `zk://`.
    pub const DRIVER: Driver = Driver {
        name: "zk",
        schemes: &["zk", "zks"],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

    /// Connects to the ensemble named by a `zk://` URL (see [`ZkConfig`]) and opens a
    /// session.
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-made session is closed with the future.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(ZkConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-made session is closed with the future.
    pub async fn with_config(config: ZkConfig) -> Result<Self, LockError> {
        let acls = if config.user().is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        };
        let lock = Self {
            inner: Arc::new(Inner {
                config,
                acls,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        };
        lock.session().await?;
        Ok(lock)
    }

    /// The configuration (its `Display` and `Debug` hide the password).
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The id of the current session, if one is open and not lost.
    pub fn session_id(&self) -> Option<i64> {
        self.current_session()
            .filter(|s| !s.is_lost())
            .map(|s| s.id())
    }

    /// The negotiated timeout of the current session, if one is open and not lost.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.current_session()
            .filter(|s| !s.is_lost())
            .map(|s| s.timeout())
    }

    /// The znode directory holding `key`'s queue: `<chroot>/<prefix>/<encoded key>`.
    pub fn lock_dir(&self, key: &LockKey) -> String {
        format!(
            "{}/{}",
            self.inner.config.lock_root(),
            encode_key(key.as_str())
        )
    }

    /// The queue of `key`: the holder first (the oldest reader where readers hold: the
    /// readers before the first writer all hold), then the waiters in the order they
    /// will be served. Empty when the key is free.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub async fn queue(&self, key: &LockKey) -> Result<Vec<QueuedNode>, LockError> {
        let session = self.session().await?;
        let client = session.client()?;
        let dir = self.lock_dir(key);
        Ok(self
            .children(&client, &dir)
            .await?
            .into_iter()
            .map(|n| QueuedNode {
                name: n.name,
                owner: n.owner,
                sequence: n.sequence,
                reader: n.reader,
            })
            .collect())
    }

    fn current_session(&self) -> Option<Arc<Session>> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current session, or a new one if there is none or it is lost.
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.current_session().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(session) = self.current_session().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        let session = Session::connect(&self.inner.config).await?;
        *self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(session.clone());
        Ok(session)
    }

    fn request_timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    fn target(&self) -> String {
        self.inner.config.connect_string()
    }

    fn zk_error(&self, what: &str, error: ZkError) -> LockError {
        from_zk(what, &self.target(), error)
    }

    /// The holder the lock node `node` at `path` records: its owner, its label (the
    /// node's data) and its token (the node's `czxid`); `None` if the node is gone.
    async fn read_holder(
        &self,
        client: &Client,
        path: &str,
        node: &LockNode,
    ) -> Result<Option<HolderInfo>, LockError> {
        let (data, stat) = match bounded(self.request_timeout(), client.get_data(path)).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.zk_error("read lock node", e)),
        };
        // tenure's label, or what another recipe's client put there (kazoo: the
        // identifier; Curator: the client's address), as a label.
        let label = foreign_label(&data);
        Ok(Some(HolderInfo {
            owner: node.owner,
            token: u64::try_from(stat.czxid).ok().map(FencingToken),
            remaining: None,
            label,
            foreign: node.foreign,
        }))
    }

    /// [`DistributedLock::acquire`], of a reader's grant with `shared`.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`].
    async fn queue_for(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        shared: bool,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let label = opts.label.as_deref();
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut pending = None;
        let mut failures = 0u32;
        loop {
            match self
                .wait_in_queue(
                    key,
                    owner,
                    opts.ttl,
                    (label, shared),
                    deadline,
                    &mut pending,
                )
                .await
            {
                Ok(lease) => {
                    if let Some(p) = pending.as_mut() {
                        p.finish(Some(
                            lease
                                .handle()
                                .path
                                .rsplit('/')
                                .next()
                                .unwrap_or_default()
                                .to_string(),
                        ));
                    }
                    return Ok(lease);
                }
                Err(Stop::TimedOut) => {
                    if let Some(mut p) = pending.take() {
                        // Leave the queue now rather than from the background.
                        if let (Some(session), Some(name)) =
                            (p.session.upgrade(), p.node.as_ref().map(|n| n.name.clone()))
                        {
                            if let Ok(client) = session.client() {
                                let path = format!("{}/{name}", p.dir);
                                if matches!(
                                    bounded(self.request_timeout(), client.delete(&path, None))
                                        .await,
                                    Ok(()) | Err(ZkError::NoNode)
                                ) {
                                    p.finish(None);
                                }
                            }
                        }
                    }
                    return Err(LockError::Timeout {
                        waited: started.elapsed(),
                    });
                }
                Err(Stop::Failed(e)) if e.is_retryable() && Instant::now() < deadline => {
                    failures = failures.saturating_add(1);
                    let pause = opts
                        .backoff
                        .delay(failures)
                        .min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
                Err(Stop::Failed(e)) => return Err(e),
            }
        }
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    /// Creates our node; if it is first we hold the lock, otherwise it is deleted again
    /// and the answer is `Ok(None)`. A lost create reply is retried within the request timeout,
    /// recognising our node by the owner id in its name.
    ///
    /// # Cancel safety
    /// If dropped after the create was sent, our node is removed in the background (and
    /// at the latest when the session ends): no orphan keeps the lock.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let owner = OwnerId::random();
        let session = self.session().await?;
        let client = session.client()?;
        let dir = self.lock_dir(key);
        let grant = (None, false);
        let mut pending = Pending::new(&session, dir.clone(), owner, grant, self.request_timeout());
        let retry_until = Instant::now() + self.request_timeout();
        let (node, created) = self.enqueue(&client, &mut pending, retry_until).await?;
        pending.node = Some(node.clone());
        let (position, sent) = self
            .position(&client, &session, &dir, (&node, created), owner)
            .await?;
        match position {
            // A session declared lost is being closed, and our node with it.
            Position::First if session.is_lost() => Err(lost_while_queued(&session)),
            Position::First => {
                let lease = self.lease(key, owner, &node, &session, sent, ttl)?;
                pending.finish(Some(node.name));
                Ok(Some(lease))
            }
            Position::Behind(_) => {
                if self.delete_own(&client, &dir, &node).await {
                    pending.finish(None);
                }
                Ok(None)
            }
            Position::Gone => Err(LockError::Unavailable {
                message: format!(
                    "lock node {dir}/{} vanished right after its creation (session ended?)",
                    node.name
                ),
                source: None,
            }),
        }
    }

    /// Queues an ephemeral sequential node and waits, woken by a watch on the predecessor
    /// only, until it is first or `opts.wait` has passed. One owner id per call, reused by
    /// its retries, so a retry after a lost reply finds its node instead of queueing twice;
    /// a retry in the same session after any other failed request keeps its node (checked
    /// to still exist, same `czxid`, owned by the session), and so its place in the queue.
    /// If the session is lost while waiting, the call queues again in a new session (and
    /// loses its place). Each request is bounded by the request timeout, so the call returns at
    /// most about one request timeout after `opts.wait`.
    ///
    /// # Cancel safety
    /// If dropped while waiting, our node is removed in the background, so no ghost
    /// waiter blocks the queue (and the session's end removes it at the latest).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.queue_for(key, opts, false).await
    }

    /// A reader, queued as [`acquire`](DistributedLock::acquire) queues: its node is named
    /// as Curator's (`…-__READ__<sequence>`) or kazoo's (`…__rlock__…`) read lock names
    /// its own, and it holds once no writer's node is before it (readers' nodes beside
    /// it share the key; every other contender is a writer), woken by a watch on the
    /// last writer's node before it. A writer waits for every node before it, readers'
    /// too, so readers that queue after a waiting writer wait for it. [`LockError::Config`]
    /// with `node_names=legacy`, whose older clients would not wait for readers.
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire).
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let layout = self.inner.config.node_names;
        if !layout.has_readers() {
            return Err(queue::no_readers(layout));
        }
        self.queue_for(key, opts, true).await
    }

    /// Checks that the lease's session is this client's current one and alive, and —
    /// after a `sync` with the leader — that its node still exists with the lease's token,
    /// owned by that session; then moves the local deadline to
    /// `min(sent + ttl, anchor + session timeout) − drift` (see the crate docs). Never
    /// re-creates the node. [`LockError::LeaseLost`] if any check fails; [`LockError::Unavailable`] if the
    /// server could not be asked (the session may still be alive).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read-only check; `lease` is unchanged if the future is dropped.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let path = lease.handle().path.clone();
        let key = lease.key().clone();
        let lost = |why: String| LockError::lost(format!("`{key}`: {why}"));
        if owner_of_path(&path) != Some(lease.owner()) {
            return Err(lost(format!("not held by owner {}", lease.owner())));
        }
        let Some(session) = self.current_session() else {
            return Err(lost("this client has no session".into()));
        };
        if session.id() != lease.handle().id {
            return Err(lost(format!(
                "the session {:#x} that held it is no longer this client's",
                lease.handle().id
            )));
        }
        if let Health::Lost(reason) = session.health() {
            return Err(lost(reason));
        }
        let client = session.client().map_err(|e| lost(e.to_string()))?;
        let op = self.request_timeout();
        // Through the leader: a follower cut off from it answers reads from a stale
        // state, in which the session the leader has expired still holds the node. Once
        // a read has found the node to be the lease's, a watch on it stands in for the
        // read: the server reports the node's deletion before it answers a later `sync`,
        // so overlapping renewals of a session's leases cost one shared `sync`.
        let watched = session.unchanged_since(&path);
        let checked = match session
            .sync_since(&client, watched.unwrap_or_else(Instant::now), op)
            .await
        {
            // The same watch or an older one: set before the `sync` was sent.
            Ok(sent)
                if watched.is_some()
                    && session
                        .unchanged_since(&path)
                        .is_some_and(|since| since <= sent) =>
            {
                Ok((sent, None))
            }
            Ok(sent) => bounded(op, client.check_and_watch_stat(&path))
                .await
                .map(|(stat, watcher)| (sent, Some((stat, watcher, Instant::now())))),
            Err(e) => Err(e),
        };
        let (sent, read) = match checked {
            Ok(checked) => checked,
            Err(e) if session_gone(&e) || session.is_lost() => {
                return Err(lost(format!("session {:#x}: {e}", session.id())))
            }
            Err(e) => return Err(self.zk_error("extend", e)),
        };
        if let Some((stat, watcher, since)) = read {
            match stat {
                Some(stat)
                    if u64::try_from(stat.czxid).ok() == Some(lease.token().get())
                        && stat.ephemeral_owner == session.id() =>
                {
                    session.watch(path, watcher, since);
                }
                Some(_) => return Err(lost("its node was replaced".into())),
                None => {
                    return Err(lost(
                        "its node is gone (session expired or lock released)".into(),
                    ))
                }
            }
        }
        if let Health::Lost(reason) = session.health() {
            return Err(lost(reason));
        }
        let effective = ttl.min(session.timeout());
        lease.renewed(sent, effective, default_drift(effective));
        self.bound_by_leader(lease, &session, sent, effective);
        Ok(())
    }

    /// Deletes the lease's node (version-checked). `NotHeld` if it is already gone or is
    /// not this owner's. The node's path carries the owner id, unique per acquisition, so
    /// another owner's node is never deleted; any session may delete it (a lease survives
    /// its client reconnecting with a new session only until that deletion).
    ///
    /// # Cancel safety
    /// If dropped, the node may or may not have been deleted; the session's end deletes it
    /// at the latest.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let path = &lease.handle().path;
        let root = format!("{}/", self.inner.config.lock_root());
        if owner_of_path(path) != Some(lease.owner()) || !path.starts_with(&root) {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let session = self.session().await?;
        let client = session.client()?;
        // Ephemeral nodes are never written to: version 0 is the node as created.
        let deleted = bounded(self.request_timeout(), client.delete(path, Some(0))).await;
        // After the deletion, whose notification has then arrived: forgetting a watch
        // that already fired costs no request.
        session.unwatch(path);
        match deleted {
            Ok(()) => Ok(ReleaseOutcome::Released),
            Err(ZkError::NoNode | ZkError::BadVersion) => Ok(ReleaseOutcome::NotHeld),
            Err(e) => Err(self.zk_error("release", e)),
        }
    }

    /// The owner of the lowest node (parsed from its name) and its `czxid`; `remaining`
    /// is `None`: the lock lasts as long as the holder's session. The server read from is
    /// first synced with the leader, so every grant made before the call is seen (a
    /// follower's plain reads may lag: another client's lock could read as free).
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let session = self.session().await?;
        let client = session.client()?;
        let dir = self.lock_dir(key);
        bounded(self.request_timeout(), client.sync("/"))
            .await
            .map_err(|e| self.zk_error("inspect sync", e))?;
        for _ in 0..8 {
            let Some(head) = self.children(&client, &dir).await?.into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{dir}/{}", head.name);
            // `None`: released between the two reads.
            if let Some(holder) = self.read_holder(&client, &path, &head).await? {
                return Ok(Some(holder));
            }
        }
        Err(LockError::backend(format!(
            "the holder of `{key}` kept changing while being inspected"
        )))
    }

    /// A persistent recursive watch on the key's directory, set before it is listed, then
    /// followed event by event: every head of the queue — every writer that held as the
    /// server saw it, and of readers holding together the oldest — in order, each with its token and label, read as soon as its node's creation
    /// reaches the feed (`remaining` is `None`). Only a node created and deleted again
    /// before that read returned is skipped. A lost session or a broken watch is an `Err`
    /// item, and after it, as after a disconnection, the feed lists the directory afresh:
    /// a holder that came and went while it was disconnected is not seen (the server does
    /// not replay a persistent watch's events across a reconnection, ZOOKEEPER-4698). The
    /// feed opens a ZooKeeper session of its own. Needs ZooKeeper 3.6 or later (before
    /// that, each item is a [`LockError::Config`] saying so).
    fn holder_changes(&self, key: &LockKey) -> Option<tenure_api::HolderFeed> {
        Some(feed::holder_feed(self.clone(), self.lock_dir(key)))
    }

    fn capabilities(&self) -> Capabilities {
        let members = self.inner.config.hosts().len().max(1);
        Capabilities {
            backend: "zk",
            fencing: FencingKind::ConsensusOrdered,
            expiry: ExpiryKind::SessionHeartbeat,
            replication: Replication::Consensus { members },
            wait: WaitKind::Push,
            fairness: Fairness::Fifo,
            failures_tolerated: (members - 1) / 2,
            clock_dependent: false,
            labels: true,
            // Not in the legacy layout: older clients know no readers.
            shared: self.inner.config.node_names.has_readers(),
        }
    }
}
