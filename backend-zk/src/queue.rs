//! The lock queue: our sequential node in a key's directory, its position, and the wait
//! for the predecessor to go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::backend::default_drift;
use tenure_api::{FencingToken, Lease, LeaseHandle, LockError, LockKey, OwnerId};
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::error::{bounded, reply_lost, session_gone};
use crate::names::{listing, Listing, LockNode};
use crate::pending::Pending;
use crate::session::Session;
use crate::ZkLock;

/// How often a directory that keeps vanishing under a create is re-made before giving up.
const MAX_DIR_RETRIES: u32 = 8;

/// A node we created in a key's directory.
#[derive(Clone, Debug)]
pub(crate) struct Created {
    pub(crate) name: String,
    czxid: i64,
    sequence: i64,
    /// A reader's node: first once no writer's node is before it.
    reader: bool,
    /// Set once a listing showed a node that had lived through 2^31 or more changes of
    /// the directory: from then on the 32-bit order may be wrong for this node (a node
    /// that was that old when ours was created may look young once its sequence wraps),
    /// so its place is read from the nodes' creation zxids instead.
    uncertain: Arc<AtomicBool>,
}

/// Where our node stands in its queue.
pub(crate) enum Position {
    /// First (a reader: no writer before it): we hold the lock.
    First,
    /// Behind the named node (a reader: the last writer's before it).
    Behind(String),
    /// Our node is not there (session ended, or someone deleted it).
    Gone,
}

/// Why waiting in the queue stopped.
pub(crate) enum Stop {
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
    /// The lock nodes in `dir`, in queue order (counted back from the directory's
    /// `cversion`); empty if `dir` does not exist.
    pub(crate) async fn listing(&self, client: &Client, dir: &str) -> Result<Listing, LockError> {
        match bounded(self.request_timeout(), client.get_children(dir)).await {
            #[cfg(feature = "testbed")]
            Ok((children, stat)) if self.inner.config.blind_to_other_recipes => {
                let mut listed = listing(&children, stat.cversion);
                listed
                    .nodes
                    .retain(|n| n.name.starts_with("lock-") && !n.foreign);
                Ok(listed)
            }
            Ok((children, stat)) => Ok(listing(&children, stat.cversion)),
            Err(ZkError::NoNode) => Ok(Listing {
                nodes: Vec::new(),
                ambiguous: false,
            }),
            Err(e) => Err(self.zk_error("list", e)),
        }
    }

    /// The lock nodes in `dir`, in queue order; empty if `dir` does not exist.
    pub(crate) async fn children(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Vec<LockNode>, LockError> {
        Ok(self.listing(client, dir).await?.nodes)
    }

    /// Makes `dir` (a container, or persistent: see [`crate::NodeNames::persistent_dirs`]) and,
    /// if needed, the persistent lock root above it.
    async fn make_dir(&self, client: &Client, dir: &str) -> Result<(), LockError> {
        let container = match self.inner.config.node_names.persistent_dirs() {
            true => CreateMode::Persistent,
            false => CreateMode::Container,
        }
        .with_acls(self.inner.acls);
        match bounded(self.request_timeout(), client.create(dir, &[], &container)).await {
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
        match bounded(self.request_timeout(), client.create(dir, &[], &container)).await {
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
        match bounded(self.request_timeout(), client.create(path, &[], options)).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.zk_error("create lock root", e)),
        }
    }

    /// Creates `owner`'s node in `dir` — or finds it, when an earlier create's reply was
    /// lost. Retries lost replies until `retry_until`. Also returns when the create that
    /// made the node was sent, if this call made it (see [`Self::position`]).
    pub(crate) async fn enqueue(
        &self,
        client: &Client,
        pending: &mut Pending,
        retry_until: Instant,
    ) -> Result<(Created, Option<Instant>), LockError> {
        let dir = pending.dir.clone();
        let owner = pending.owner;
        let layout = self.inner.config.node_names;
        let prefix = match pending.shared {
            false => layout.prefix(owner),
            true => layout
                .reader_prefix(owner)
                .ok_or_else(|| no_readers(layout))?,
        };
        let path = format!("{dir}/{prefix}");
        let options = CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        let data = pending.label.as_deref().unwrap_or_default().as_bytes();
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
            match bounded(self.request_timeout(), client.create(&path, data, &options)).await {
                Ok((stat, sequence)) => {
                    let name = format!("{prefix}{sequence}");
                    if LockNode::parse_own(&name).is_none() {
                        // Never expected (every sequence ZooKeeper produces parses), but
                        // a node the queue cannot see would be re-created forever.
                        let _ = bounded(
                            self.request_timeout(),
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
                        reader: pending.shared,
                        uncertain: Arc::default(),
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
            .filter(|n| n.is_of(owner))
        {
            let path = format!("{dir}/{}", node.name);
            match bounded(self.request_timeout(), client.check_stat(&path)).await {
                Ok(Some(stat)) if stat.ephemeral_owner == session_id => {
                    return Ok(Some(Created {
                        name: node.name,
                        czxid: stat.czxid,
                        sequence: node.sequence,
                        reader: node.reader,
                        uncertain: Arc::default(),
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
        match bounded(self.request_timeout(), client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.czxid == node.czxid && stat.ephemeral_owner == session_id => {
                Ok(Some(node))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(self.zk_error("stat lock node", e)),
        }
    }

    /// Lists `dir` and places `node` in it; removes any duplicate of ours. Also returns
    /// when the request that proves the listing (see below) was sent.
    ///
    /// `proven`: when a request of this acquisition that went through the leader was
    /// sent, if it stands for a new `sync` — our node's create, just answered, or (for a
    /// woken waiter) that create or a `sync` sent [recently enough](Session::stands_for_sync);
    /// otherwise the listing goes out behind a new `sync`. The create went through the
    /// leader, which checked the session was alive; a completed `sync` proves the same as
    /// of when it was sent: the leader cannot expire the session before that proof's
    /// [anchor](Session::anchor) plus the session timeout, and the lease is bounded by it
    /// (see [`Self::lease`]). Whether the listing shows our node first needs no fresher
    /// state than our create: a node ahead of ours was created before it (the sequence
    /// follows the leader's order), so it is in any listing served after our create
    /// unless it was deleted, and a deleted node never returns. So a listing that shows
    /// our node first, served by a server that may lag the leader (or have lost it),
    /// proves we hold the lock for as long as our node lives, which the proof's bound
    /// covers.
    pub(crate) async fn position(
        &self,
        client: &Client,
        session: &Session,
        dir: &str,
        (node, proven): (&Created, Option<Instant>),
        owner: OwnerId,
    ) -> Result<(Position, Instant), LockError> {
        let (sent, listed) = match proven {
            Some(sent) => {
                session.record(sent);
                (sent, self.listing(client, dir).await)
            }
            // The listing goes out right behind the `sync`, not after its reply: the
            // server serves it only once the `sync` is done (a session's requests are
            // served in order), so it proves the same, one round trip sooner. It is used
            // only if the `sync` succeeded.
            None => {
                let synced = session.sync_since(client, Instant::now(), self.request_timeout());
                let (synced, listed) = futures::join!(synced, self.listing(client, dir));
                let sent = synced.map_err(|e| self.zk_error("sync with the leader", e))?;
                (sent, listed)
            }
        };
        let Listing {
            mut nodes,
            ambiguous,
        } = listed?;
        if ambiguous {
            node.uncertain.store(true, Ordering::Relaxed);
        }
        for duplicate in nodes
            .iter()
            .filter(|n| n.is_of(owner) && n.name != node.name)
        {
            let path = format!("{dir}/{}", duplicate.name);
            let _ = bounded(self.request_timeout(), client.delete(&path, None)).await;
        }
        nodes.retain(|n| !n.is_of(owner) || n.name == node.name);
        // A reader waits for the writers before it only (readers beside it share).
        nodes.retain(|n| !node.reader || !n.reader || n.name == node.name);
        let position = match nodes.iter().position(|n| n.name == node.name) {
            None => Position::Gone,
            Some(_) if node.uncertain.load(Ordering::Relaxed) => {
                self.place_by_czxid(client, dir, node, &nodes).await?
            }
            Some(0) => Position::First,
            Some(i) => Position::Behind(nodes[i - 1].name.clone()),
        };
        Ok((position, sent))
    }

    /// Our node's place among `nodes` by creation zxid (64 bits, in creation order:
    /// exact however the 32-bit sequences wrapped), read node by node: first, or behind
    /// the node created last before ours. One request per other node, only for a queue
    /// whose sequence order is [uncertain](Created::uncertain).
    async fn place_by_czxid(
        &self,
        client: &Client,
        dir: &str,
        node: &Created,
        nodes: &[LockNode],
    ) -> Result<Position, LockError> {
        let mut before: Option<(i64, &str)> = None;
        for other in nodes.iter().filter(|n| n.name != node.name) {
            let path = format!("{dir}/{}", other.name);
            match bounded(self.request_timeout(), client.check_stat(&path)).await {
                Ok(Some(stat)) if stat.czxid < node.czxid => {
                    if before.is_none_or(|(czxid, _)| stat.czxid > czxid) {
                        before = Some((stat.czxid, other.name.as_str()));
                    }
                }
                Ok(_) => {} // created after ours, or gone
                Err(e) => return Err(self.zk_error("read a lock node's creation zxid", e)),
            }
        }
        Ok(match before {
            None => Position::First,
            Some((_, name)) => Position::Behind(name.to_owned()),
        })
    }

    pub(crate) fn lease(
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
        if node.reader {
            lease = lease.into_shared();
        }
        self.bound_by_leader(&mut lease, session, sent, effective);
        Ok(lease)
    }

    /// Caps a lease proven by a `sync` (or create) sent at `sent` (`effective` = its
    /// length from `sent`) at what the leader guarantees: the session's [anchor](Session::anchor) plus
    /// the session timeout, less the drift allowance.
    pub(crate) fn bound_by_leader(
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
    pub(crate) async fn delete_own(&self, client: &Client, dir: &str, node: &Created) -> bool {
        let path = format!("{dir}/{}", node.name);
        matches!(
            bounded(self.request_timeout(), client.delete(&path, None)).await,
            Ok(()) | Err(ZkError::NoNode)
        )
    }

    /// One session's worth of `acquire` (of a reader's grant, with `shared`): queue up
    /// (or find our node) and wait to be first.
    pub(crate) async fn wait_in_queue(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        grant: (Option<&str>, bool),
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
                grant,
                self.request_timeout(),
            ));
        }
        let Some(pending) = pending.as_mut() else {
            return Err(Stop::Failed(LockError::backend("no pending acquisition")));
        };
        let dir = pending.dir.clone();
        let retry_until = deadline.max(Instant::now() + self.request_timeout());
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
        // When this acquisition's latest proof through the leader was sent (its create,
        // then each `sync`): a waiter woken soon after it lists without a new `sync`.
        let mut proven = None;
        loop {
            let proof = created
                .take()
                .or(proven.filter(|sent| session.stands_for_sync(*sent, ttl)));
            let (position, sent) = self
                .position(&client, &session, &dir, (&node, proof), owner)
                .await?;
            proven = Some(sent);
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
            match bounded(self.request_timeout(), client.check_and_watch_stat(&path)).await {
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

/// A reader asked for in a layout without readers' nodes.
pub(crate) fn no_readers(layout: crate::NodeNames) -> LockError {
    LockError::Config(format!(
        "the zk backend has no shared (read) locks with node_names={}: older tenure \
         clients know no readers' nodes and would not wait for them",
        layout.as_str()
    ))
}

/// The session was declared lost (expired, closed, or disconnected too long) while an
/// acquisition waited in it: retryable, in a new session.
pub(crate) fn lost_while_queued(session: &Session) -> LockError {
    LockError::Unavailable {
        message: format!("session lost while queued: {}", session.lost_reason()),
        source: None,
    }
}
