#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod error;
mod names;
mod session;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_api::{
    default_drift, validate_ttl, AcquireOptions, Backend, Capabilities, DistributedLock, Driver,
    ExpiryKind, Fairness, FencingKind, FencingToken, HolderInfo, Lease, LeaseHandle, LockError,
    LockKey, OwnerId, ReleaseOutcome, Replication, WaitKind,
};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

pub use config::{ZkConfig, DEFAULT_PORT};
use error::{bounded, from_zk, reply_lost, session_gone};
use names::{encode_key, node_prefix, owner_of_path, queue, LockNode};
use session::{Health, Session};

/// How often a directory that keeps vanishing under a create is re-made before giving up.
const MAX_DIR_RETRIES: u32 = 8;

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
    /// The node's name, `lock-<owner>-<sequence>`.
    pub name: String,
    /// The acquire call that created it.
    pub owner: OwnerId,
    /// Its queue position (the server's sequence number).
    pub sequence: i64,
}

/// A node we created in a key's directory.
#[derive(Clone, Debug)]
struct Created {
    name: String,
    czxid: i64,
    sequence: i64,
}

/// Where our node stands in its queue.
enum Position {
    /// First: we hold the lock.
    First,
    /// Behind the named node.
    Behind(String),
    /// Our node is not there (session ended, or someone deleted it).
    Gone,
}

/// Why waiting in the queue stopped.
enum Stop {
    /// The caller's wait bound passed.
    TimedOut,
    /// An error.
    Failed(LockError),
}

impl From<LockError> for Stop {
    fn from(error: LockError) -> Self {
        Self::Failed(error)
    }
}

impl ZkLock {
    /// This backend for URL dispatch ([`Driver`]): `zk://`.
    pub const DRIVER: Driver = Driver {
        name: "zk",
        schemes: &["zk"],
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

    /// The queue of `key`: the holder first, then the waiters in the order they will be
    /// served. Empty when the key is free.
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

    fn op_timeout(&self) -> Duration {
        self.inner.config.op_timeout
    }

    fn target(&self) -> String {
        self.inner.config.connect_string()
    }

    fn zk_error(&self, what: &str, error: ZkError) -> LockError {
        from_zk(what, &self.target(), error)
    }

    /// The lock nodes in `dir`, in queue order; empty if `dir` does not exist.
    async fn children(&self, client: &Client, dir: &str) -> Result<Vec<LockNode>, LockError> {
        match bounded(self.op_timeout(), client.list_children(dir)).await {
            Ok(children) => Ok(queue(&children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.zk_error("list", e)),
        }
    }

    /// Makes `dir` (a container) and, if needed, the persistent lock root above it.
    async fn make_dir(&self, client: &Client, dir: &str) -> Result<(), LockError> {
        let container = CreateMode::Container.with_acls(self.inner.acls);
        match bounded(self.op_timeout(), client.create(dir, &[], &container)).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.zk_error("create lock directory", e)),
        }
        let persistent = CreateMode::Persistent.with_acls(self.inner.acls);
        let root = self.inner.config.lock_root();
        let mut end = 0;
        while let Some(next) = root[end + 1..].find('/').map(|i| end + 1 + i) {
            self.create_parent(client, &root[..next], &persistent)
                .await?;
            end = next;
        }
        self.create_parent(client, &root, &persistent).await?;
        match bounded(self.op_timeout(), client.create(dir, &[], &container)).await {
            // NoNode: the root vanished again; the caller retries.
            Ok(_) | Err(ZkError::NodeExists) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.zk_error("create lock directory", e)),
        }
    }

    async fn create_parent(
        &self,
        client: &Client,
        path: &str,
        options: &zookeeper_client::CreateOptions<'_>,
    ) -> Result<(), LockError> {
        if path.is_empty() {
            return Ok(());
        }
        match bounded(self.op_timeout(), client.create(path, &[], options)).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.zk_error("create lock root", e)),
        }
    }

    /// Creates `owner`'s node in `dir` — or finds it, when an earlier create's reply was
    /// lost. Retries lost replies until `retry_until`. Also returns when the create that
    /// made the node was sent, if this call made it (see [`Self::position`]).
    async fn enqueue(
        &self,
        client: &Client,
        pending: &mut Pending,
        retry_until: Instant,
    ) -> Result<(Created, Option<Instant>), LockError> {
        let dir = pending.dir.clone();
        let owner = pending.owner;
        let path = format!("{dir}/{}", node_prefix(owner));
        let options = CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        let mut dir_retries = 0;
        loop {
            if pending.uncertain {
                // A create may have landed without our hearing of it: look before
                // creating another node.
                if let Some(found) = self
                    .find_own(client, &dir, owner, pending.session_id)
                    .await?
                {
                    return Ok((found, None));
                }
            }
            let sent = Instant::now();
            match bounded(self.op_timeout(), client.create(&path, &[], &options)).await {
                Ok((stat, sequence)) => {
                    let name = format!("{}{sequence}", node_prefix(owner));
                    if LockNode::parse(&name).is_none() {
                        // Never expected (every sequence ZooKeeper produces parses), but
                        // a node the queue cannot see would be re-created forever.
                        let _ = bounded(
                            self.op_timeout(),
                            client.delete(&format!("{dir}/{name}"), None),
                        )
                        .await;
                        return Err(LockError::backend(format!(
                            "ZooKeeper named the lock node {dir}/{name}: tenure cannot \
                             parse its sequence {sequence}"
                        )));
                    }
                    let created = Created {
                        name,
                        czxid: stat.czxid,
                        sequence: sequence.into_i64(),
                    };
                    return Ok((created, Some(sent)));
                }
                Err(ZkError::NoNode) => {
                    dir_retries += 1;
                    if dir_retries > MAX_DIR_RETRIES {
                        return Err(LockError::backend(format!(
                            "lock directory {dir} kept vanishing under create"
                        )));
                    }
                    self.make_dir(client, &dir).await?;
                }
                Err(e) if reply_lost(&e) && !session_gone(&e) => {
                    pending.uncertain = true;
                    if Instant::now() >= retry_until {
                        return Err(self.zk_error("create lock node", e));
                    }
                }
                Err(e) => return Err(self.zk_error("create lock node", e)),
            }
        }
    }

    /// Our node in `dir` (the first, if retries made several), with its `czxid`: a node
    /// named with `owner` *and* held by `session_id`. A node of this owner in another
    /// session (left by this call in a session it gave up) dies with that session, so it
    /// is never adopted; the caller creates a new one (and removes the stray as a
    /// duplicate).
    async fn find_own(
        &self,
        client: &Client,
        dir: &str,
        owner: OwnerId,
        session_id: i64,
    ) -> Result<Option<Created>, LockError> {
        for node in self
            .children(client, dir)
            .await?
            .into_iter()
            .filter(|n| n.owner == owner)
        {
            let path = format!("{dir}/{}", node.name);
            match bounded(self.op_timeout(), client.check_stat(&path)).await {
                Ok(Some(stat)) if stat.ephemeral_owner == session_id => {
                    return Ok(Some(Created {
                        name: node.name,
                        czxid: stat.czxid,
                        sequence: node.sequence,
                    }))
                }
                Ok(_) => {}
                Err(e) => return Err(self.zk_error("stat lock node", e)),
            }
        }
        Ok(None)
    }

    /// `node` (created earlier by this acquisition) if it still exists as created, held by
    /// `session_id`; `None` if it is gone or not that node any more.
    async fn still_ours(
        &self,
        client: &Client,
        dir: &str,
        node: Created,
        session_id: i64,
    ) -> Result<Option<Created>, LockError> {
        let path = format!("{dir}/{}", node.name);
        match bounded(self.op_timeout(), client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.czxid == node.czxid && stat.ephemeral_owner == session_id => {
                Ok(Some(node))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(self.zk_error("stat lock node", e)),
        }
    }

    /// Lists `dir` (after a `sync` or our node's create, so the listing is as recent as the
    /// leader's) and places `node` in it; removes any duplicate of ours. Also returns when
    /// that `sync` or create was sent.
    ///
    /// `created`: when the create that made `node` was sent, if it was just answered. That
    /// create already went through the leader — which checked the session was alive — and
    /// the server applied everything the leader had committed before it before answering,
    /// so it proves what a `sync` sent at that instant would: the listing needs no `sync`.
    async fn position(
        &self,
        client: &Client,
        session: &Session,
        dir: &str,
        (node, created): (&Created, Option<Instant>),
        owner: OwnerId,
    ) -> Result<(Position, Instant), LockError> {
        let sent = match created {
            Some(sent) => {
                session.record(sent);
                sent
            }
            // The server this client talks to then has caught up with the leader.
            None => session
                .sync_since(client, Instant::now(), self.op_timeout())
                .await
                .map_err(|e| self.zk_error("sync with the leader", e))?,
        };
        let mut nodes = self.children(client, dir).await?;
        for duplicate in nodes
            .iter()
            .filter(|n| n.owner == owner && n.name != node.name)
        {
            let path = format!("{dir}/{}", duplicate.name);
            let _ = bounded(self.op_timeout(), client.delete(&path, None)).await;
        }
        nodes.retain(|n| n.owner != owner || n.name == node.name);
        let position = match nodes.iter().position(|n| n.name == node.name) {
            None => Position::Gone,
            Some(0) => Position::First,
            Some(i) => Position::Behind(nodes[i - 1].name.clone()),
        };
        Ok((position, sent))
    }

    fn lease(
        &self,
        key: &LockKey,
        owner: OwnerId,
        node: &Created,
        session: &Session,
        sent: Instant,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        let token = u64::try_from(node.czxid)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| LockError::backend(format!("server reported czxid {}", node.czxid)))?;
        let effective = ttl.min(session.timeout());
        let mut lease = Lease::new(
            key.clone(),
            owner,
            FencingToken(token),
            sent,
            effective,
            default_drift(effective),
        )
        .with_handle(LeaseHandle {
            path: format!("{}/{}", self.lock_dir(key), node.name),
            id: session.id(),
            revision: node.sequence,
        });
        self.bound_by_leader(&mut lease, session, sent, effective);
        Ok(lease)
    }

    /// Caps a lease proven by a `sync` (or create) sent at `sent` (`effective` = its
    /// length from `sent`) at what the leader guarantees: the session's [anchor](Session::anchor) plus
    /// the session timeout, less the drift allowance.
    fn bound_by_leader(
        &self,
        lease: &mut Lease,
        session: &Session,
        sent: Instant,
        effective: Duration,
    ) {
        let limit = session.anchor(sent) + session.timeout();
        lease.tighten((sent + effective).saturating_duration_since(limit));
    }

    /// Deletes our node; true if it is gone.
    async fn delete_own(&self, client: &Client, dir: &str, node: &Created) -> bool {
        let path = format!("{dir}/{}", node.name);
        matches!(
            bounded(self.op_timeout(), client.delete(&path, None)).await,
            Ok(()) | Err(ZkError::NoNode)
        )
    }

    /// One session's worth of `acquire`: queue up (or find our node) and wait to be first.
    async fn wait_in_queue(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        deadline: Instant,
        pending: &mut Option<Pending>,
    ) -> Result<Lease, Stop> {
        let session = self.session().await?;
        let client = session.client()?;
        if pending
            .as_ref()
            .is_none_or(|p| p.session_id != session.id())
        {
            // A new session: the old one's nodes die with it.
            *pending = Some(Pending::new(
                &session,
                self.lock_dir(key),
                owner,
                self.op_timeout(),
            ));
        }
        let Some(pending) = pending.as_mut() else {
            return Err(Stop::Failed(LockError::backend("no pending acquisition")));
        };
        let dir = pending.dir.clone();
        let retry_until = deadline.max(Instant::now() + self.op_timeout());
        // A retry in the same session keeps the node it already has, and its place.
        let known = match pending.node.clone() {
            Some(known) => {
                self.still_ours(&client, &dir, known, pending.session_id)
                    .await?
            }
            None => None,
        };
        let (mut node, mut created) = match known {
            Some(node) => (node, None),
            None => self.enqueue(&client, pending, retry_until).await?,
        };
        pending.node = Some(node.clone());
        loop {
            let (position, sent) = self
                .position(&client, &session, &dir, (&node, created.take()), owner)
                .await?;
            let predecessor = match position {
                // A session declared lost is being closed, and our node with it.
                _ if session.is_lost() => return Err(Stop::Failed(lost_while_queued(&session))),
                Position::First => return Ok(self.lease(key, owner, &node, &session, sent, ttl)?),
                Position::Behind(predecessor) => predecessor,
                Position::Gone => {
                    if Instant::now() >= deadline {
                        return Err(Stop::TimedOut);
                    }
                    // Deleted by someone else while the session lives: queue again.
                    (node, created) = self.enqueue(&client, pending, retry_until).await?;
                    pending.node = Some(node.clone());
                    continue;
                }
            };
            if Instant::now() >= deadline {
                return Err(Stop::TimedOut);
            }
            let path = format!("{dir}/{predecessor}");
            match bounded(self.op_timeout(), client.check_and_watch_stat(&path)).await {
                Ok((None, _)) => continue,
                Ok((Some(_), watcher)) => {
                    tokio::select! {
                        _ = watcher.changed() => {}
                        _ = tokio::time::sleep_until(deadline.into()) => return Err(Stop::TimedOut),
                        _ = session.lost() => return Err(Stop::Failed(lost_while_queued(&session))),
                    }
                }
                Err(e) => return Err(Stop::Failed(self.zk_error("watch predecessor", e))),
            }
        }
    }
}

/// The session was declared lost (expired, closed, or disconnected too long) while an
/// acquisition waited in it: retryable, in a new session.
fn lost_while_queued(session: &Session) -> LockError {
    LockError::Unavailable {
        message: format!("session lost while queued: {}", session.lost_reason()),
        source: None,
    }
}

/// An acquisition in progress in one session. Unless finished, dropping it (error,
/// timeout, or a cancelled future) removes every node of its owner in the background.
struct Pending {
    session: Weak<Session>,
    session_id: i64,
    dir: String,
    owner: OwnerId,
    op_timeout: Duration,
    /// Our node, once known: a retry in this session checks it is still there and
    /// waits on it rather than queueing again.
    node: Option<Created>,
    /// A create's reply was lost: a stray node of ours may appear later.
    uncertain: bool,
    armed: bool,
}

impl Pending {
    fn new(session: &Arc<Session>, dir: String, owner: OwnerId, op_timeout: Duration) -> Self {
        Self {
            session: Arc::downgrade(session),
            session_id: session.id(),
            dir,
            owner,
            op_timeout,
            node: None,
            uncertain: false,
            armed: true,
        }
    }

    /// Done: keep `keep` (our held node), or nothing. A lost reply earlier may still leave
    /// a stray node of ours, so sweep for others in the background then.
    fn finish(&mut self, keep: Option<String>) {
        self.armed = false;
        if self.uncertain {
            self.sweep(keep);
        }
    }

    fn sweep(&self, keep: Option<String>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the session's end frees the node
        };
        runtime.spawn(sweep(
            self.session.clone(),
            self.dir.clone(),
            self.owner,
            keep,
            self.op_timeout,
        ));
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed {
            self.sweep(None);
        }
    }
}

/// Failed passes of [`sweep`] at the op-timeout pace, before it backs off and warns.
const QUICK_SWEEPS: u32 = 8;
/// The longest pause between two passes of [`sweep`] once it backs off.
const MAX_SWEEP_PAUSE: Duration = Duration::from_secs(5);

/// Deletes `owner`'s nodes in `dir` except `keep`: passes until two passes succeed (every
/// listing and deletion answered), one `op_timeout` apart (a create still in flight at
/// the first pass lands before the second). Stops when the session is gone — its nodes go
/// with it. While the server does not answer it keeps trying, backing off up to
/// [`MAX_SWEEP_PAUSE`]: a stray node would otherwise hold its place in the queue (or the
/// lock itself) for the session's whole life. After [`QUICK_SWEEPS`] failed passes it
/// logs a warning (target `tenure_zk`), and again once the strays are gone.
async fn sweep(
    session: Weak<Session>,
    dir: String,
    owner: OwnerId,
    keep: Option<String>,
    op_timeout: Duration,
) {
    let mut clean_passes = 0;
    let mut failed_passes = 0u32;
    loop {
        let Some(client) = session.upgrade().and_then(|s| s.client().ok()) else {
            return;
        };
        let pass = match bounded(op_timeout, client.list_children(&dir)).await {
            Ok(children) => {
                let mut clean = true;
                for node in queue(&children)
                    .into_iter()
                    .filter(|n| n.owner == owner && Some(&n.name) != keep.as_ref())
                {
                    let path = format!("{dir}/{}", node.name);
                    match bounded(op_timeout, client.delete(&path, None)).await {
                        Ok(()) | Err(ZkError::NoNode) => {}
                        Err(e) if session_gone(&e) => return,
                        Err(_) => clean = false,
                    }
                }
                Ok(clean)
            }
            Err(ZkError::NoNode) => Ok(true),
            Err(e) if session_gone(&e) => return,
            Err(e) if reply_lost(&e) => Ok(false),
            Err(e) => Err(e),
        };
        drop(client);
        match pass {
            Ok(true) => clean_passes += 1,
            Ok(false) => failed_passes += 1,
            Err(error) => {
                tracing::warn!(
                    %dir, %owner, %error,
                    "cannot remove stray lock nodes of an abandoned acquisition; they go \
                     when the session ends"
                );
                return;
            }
        }
        if clean_passes >= 2 {
            if failed_passes >= QUICK_SWEEPS {
                tracing::info!(%dir, %owner, failed_passes, "stray lock nodes removed");
            }
            return;
        }
        if failed_passes == QUICK_SWEEPS {
            tracing::warn!(
                %dir, %owner, failed_passes,
                "stray lock nodes of an abandoned acquisition may hold the key until the \
                 server answers again (or the session ends); still retrying"
            );
        }
        let backoff = failed_passes.saturating_sub(QUICK_SWEEPS).min(16);
        let pause = op_timeout
            .saturating_mul(1 << backoff)
            .min(MAX_SWEEP_PAUSE.max(op_timeout));
        tokio::time::sleep(pause).await;
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    /// Creates our node; if it is first we hold the lock, otherwise it is deleted again
    /// and the answer is `Ok(None)`. A lost create reply is retried within the op timeout,
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
        let mut pending = Pending::new(&session, dir.clone(), owner, self.op_timeout());
        let retry_until = Instant::now() + self.op_timeout();
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
    /// loses its place). Each request is bounded by the op timeout, so the call returns at
    /// most about one op timeout after `opts.wait`.
    ///
    /// # Cancel safety
    /// If dropped while waiting, our node is removed in the background, so no ghost
    /// waiter blocks the queue (and the session's end removes it at the latest).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut pending = None;
        let mut failures = 0u32;
        loop {
            match self
                .wait_in_queue(key, owner, opts.ttl, deadline, &mut pending)
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
                                    bounded(self.op_timeout(), client.delete(&path, None)).await,
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
        let op = self.op_timeout();
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
        let deleted = bounded(self.op_timeout(), client.delete(path, Some(0))).await;
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
    /// is `None`: the lock lasts as long as the holder's session.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let session = self.session().await?;
        let client = session.client()?;
        let dir = self.lock_dir(key);
        for _ in 0..8 {
            let Some(head) = self.children(&client, &dir).await?.into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{dir}/{}", head.name);
            match bounded(self.op_timeout(), client.check_stat(&path)).await {
                Ok(Some(stat)) => {
                    return Ok(Some(HolderInfo {
                        owner: head.owner,
                        token: u64::try_from(stat.czxid).ok().map(FencingToken),
                        remaining: None,
                    }))
                }
                Ok(None) => continue, // released between the two reads
                Err(e) => return Err(self.zk_error("inspect", e)),
            }
        }
        Err(LockError::backend(format!(
            "the holder of `{key}` kept changing while being inspected"
        )))
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
        }
    }
}
