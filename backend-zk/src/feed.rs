//! The holders of a key as they change ([`DistributedLock::holder_changes`]): a persistent
//! recursive watch on the key's directory, set before the directory is listed, then
//! followed event by event, so every head of the queue — every writer that held, as the
//! server saw it, and of readers holding together the oldest — is given in order.
//!
//! Which events the listing already shows: a node's sequence number is its directory's
//! `cversion` when it was created, so a node created after the listing has a sequence at
//! or past the listing's `cversion`, and the creations of older ones are skipped. A
//! deletion is applied whenever it names a node the feed knows.
//!
//! Each new lock node's record (owner, label, and its `czxid`, the token) is read as soon
//! as its creation is seen — its creator learns it holds only after listing the queue —
//! so a holder is missed only if its node was created and deleted again before that read
//! came back (events are applied one at a time, so that read waits for the events before
//! it). After a disconnection, the watch's events from the gap may be lost
//! (ZOOKEEPER-4698), so the feed watches and lists the directory afresh and goes on from
//! there, as it does in a new session after the old one was lost: a holder that came and
//! went in the gap is not seen.
//!
//! The feed has a session of its own, holding no lease: a request it leaves suspended
//! (a consumer that stops polling mid-step) can keep only that session open, never one
//! whose leases the lock has declared lost.
//!
//! [`DistributedLock::holder_changes`]: tenure_api::DistributedLock::holder_changes

use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tenure_api::backend::FeedSource;
use tenure_api::{async_trait, HolderFeed, HolderInfo, LockError};
use zookeeper_client::{
    AddWatchMode, Client, Error as ZkError, EventType, PersistentWatcher, SessionState,
    WatchedEvent,
};

use crate::error::bounded;
use crate::names::{queue, LockNode};
use crate::session::Session;
use crate::ZkLock;

/// The holders of the key whose queue is the directory `dir`, as a stream (see the module
/// docs).
pub(crate) fn holder_feed(lock: ZkLock, dir: String) -> HolderFeed {
    let feed = Feed {
        lock,
        dir,
        session: None,
        watching: None,
        nodes: BTreeMap::new(),
        horizon: None,
        shown: None,
        ready: VecDeque::new(),
    };
    tenure_api::backend::holder_feed(feed)
}

/// What the feed knows of a lock node.
enum Record {
    /// Listed, not read yet: read when it comes first.
    Unread,
    /// Read: the holder it records.
    Read(HolderInfo),
    /// Gone before its read came back: it is skipped when it comes first.
    Gone,
}

struct Feed {
    lock: ZkLock,
    /// The key's directory.
    dir: String,
    /// The feed's own session (`None`: open one).
    session: Option<Arc<Session>>,
    /// The session the watch lives in, and the watch (`None`: list afresh).
    watching: Option<(Arc<Session>, PersistentWatcher)>,
    /// The directory's lock nodes by name.
    nodes: BTreeMap<String, (LockNode, Record)>,
    /// The directory's `cversion` at the last listing: creations of nodes with a lower
    /// sequence are older than the listing. `None` while the directory does not exist
    /// (the nodes of its next incarnation are listed when its creation is seen).
    horizon: Option<i32>,
    /// The head last given (`None` before the first; `Some(None)`: vacant).
    shown: Option<Option<String>>,
    /// Readings not yet given.
    ready: VecDeque<Result<Option<HolderInfo>, LockError>>,
}

#[async_trait]
impl FeedSource for Feed {
    fn pop_ready(&mut self) -> Option<Result<Option<HolderInfo>, LockError>> {
        self.ready.pop_front()
    }

    fn restart(&mut self) {
        self.watching = None;
    }

    /// Lists the directory (watching it first), or applies the watch's next event, and
    /// queues any change of holder.
    async fn step(&mut self) -> Result<(), LockError> {
        let Some((session, watcher)) = self.watching.as_mut() else {
            return self.start().await;
        };
        // The client library panics on a watch read after the session's last event; that
        // must not unwind through the caller's stream.
        let event = tokio::select! {
            event = AssertUnwindSafe(watcher.changed()).catch_unwind() => event.ok(),
            reason = session.lost() => {
                (self.watching, self.session) = (None, None);
                return Err(self.broken(&reason));
            }
        };
        let Some(event) = event else {
            (self.watching, self.session) = (None, None);
            return Err(self.broken("the session ended"));
        };
        self.apply(event).await
    }
}

impl Feed {
    /// Watches the directory, then lists it: the holder now, and the horizon past which
    /// the watch's creations are new.
    async fn start(&mut self) -> Result<(), LockError> {
        let session = match self.session.clone().filter(|s| !s.is_lost()) {
            Some(session) => session,
            None => {
                let session = Session::connect(&self.lock.inner.config).await?;
                self.session = Some(session.clone());
                session
            }
        };
        let client = session.client()?;
        let limit = self.lock.request_timeout();
        let watcher = match bounded(
            limit,
            client.watch(&self.dir, AddWatchMode::PersistentRecursive),
        )
        .await
        {
            Ok(watcher) => watcher,
            Err(ZkError::Unimplemented) => {
                return Err(LockError::Config(format!(
                    "holder watch on {}: the server has no persistent watches (ZooKeeper \
                     3.6 or later has them)",
                    self.lock.target()
                )))
            }
            Err(e) => return Err(self.lock.zk_error("holder watch", e)),
        };
        // The listing then shows what the leader had committed when the feed started.
        bounded(limit, client.sync(&self.dir))
            .await
            .map_err(|e| self.lock.zk_error("holder watch sync", e))?;
        self.watching = Some((session, watcher));
        self.relist(&client).await
    }

    /// Takes a listing as the directory's state.
    fn list(&mut self, children: Vec<String>, horizon: Option<i32>) {
        let mut known = std::mem::take(&mut self.nodes);
        for node in queue(&children) {
            let record = known.remove(&node.name).map_or(Record::Unread, |(_, r)| r);
            self.nodes.insert(node.name.clone(), (node, record));
        }
        self.horizon = horizon;
    }

    /// Applies one event of the watch.
    async fn apply(&mut self, event: WatchedEvent) -> Result<(), LockError> {
        let client = match &self.watching {
            Some((session, _)) => session.client()?,
            None => return Ok(()),
        };
        if event.event_type == EventType::Session {
            return match event.session_state {
                // Reconnected: events from the gap are lost, and zookeeper-client 0.11
                // does not set a persistent watch again on the new connection (its
                // `resend_watches` sends only the one-shot kinds). So: watch and list
                // afresh, in the same session.
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                    self.watching = None;
                    Ok(())
                }
                SessionState::Disconnected => Ok(()),
                state => {
                    (self.watching, self.session) = (None, None);
                    Err(self.broken(&format!("the session is {state:?}")))
                }
            };
        }
        if event.path == self.dir {
            return match event.event_type {
                // A new incarnation of the directory (its nodes start from sequence 0), or
                // the end of one: what is there now. (Not simply "empty" on a deletion:
                // the listing may already show a later incarnation.)
                EventType::NodeCreated | EventType::NodeDeleted => self.relist(&client).await,
                _ => Ok(()),
            };
        }
        let Some(name) = event
            .path
            .strip_prefix(&self.dir)
            .and_then(|rest| rest.strip_prefix('/'))
        else {
            return Ok(());
        };
        let Some(node) = LockNode::parse(name) else {
            return Ok(());
        };
        match event.event_type {
            EventType::NodeCreated if self.is_new(&node) => {
                let record = self.read(&client, &node).await?;
                self.nodes.insert(node.name.clone(), (node, record));
            }
            EventType::NodeDeleted => {
                self.nodes.remove(name);
            }
            _ => return Ok(()),
        }
        self.give_head(&client).await
    }

    /// Whether `node`'s creation is later than the last listing.
    fn is_new(&self, node: &LockNode) -> bool {
        let Some(horizon) = self.horizon else {
            // Created in an incarnation of the directory before the one listed.
            return false;
        };
        match i32::try_from(node.sequence) {
            Ok(sequence) => sequence.wrapping_sub(horizon) >= 0,
            Err(_) => node.sequence >= i64::from(horizon),
        }
    }

    /// Lists the directory afresh, keeping what was read of nodes still there.
    async fn relist(&mut self, client: &Client) -> Result<(), LockError> {
        let limit = self.lock.request_timeout();
        let (children, horizon) = match bounded(limit, client.get_children(&self.dir)).await {
            Ok((children, stat)) => (children, Some(stat.cversion)),
            Err(ZkError::NoNode) => (Vec::new(), None),
            Err(e) => return Err(self.lock.zk_error("holder listing", e)),
        };
        self.list(children, horizon);
        self.give_head(client).await
    }

    /// The watch ended with its session (`why`): the feed starts afresh.
    fn broken(&self, why: &str) -> LockError {
        LockError::Unavailable {
            message: format!("holder watch on {}: {why}", self.lock.target()),
            source: None,
        }
    }

    /// Reads what `node` records.
    async fn read(&self, client: &Client, node: &LockNode) -> Result<Record, LockError> {
        let path = format!("{}/{}", self.dir, node.name);
        Ok(match self.lock.read_holder(client, &path, node).await? {
            Some(holder) => Record::Read(holder),
            None => Record::Gone,
        })
    }

    /// Queues the queue's head if it changed since the last one given; a head gone before
    /// it could be read is skipped (its deletion follows in the watch).
    async fn give_head(&mut self, client: &Client) -> Result<(), LockError> {
        let head = queue(&self.nodes.keys().cloned().collect::<Vec<_>>())
            .into_iter()
            .next();
        let Some(head) = head else {
            if self.shown != Some(None) {
                self.shown = Some(None);
                self.ready.push_back(Ok(None));
            }
            return Ok(());
        };
        if self
            .shown
            .as_ref()
            .is_some_and(|s| s.as_ref() == Some(&head.name))
        {
            return Ok(());
        }
        if matches!(self.nodes.get(&head.name), Some((_, Record::Unread))) {
            let read = self.read(client, &head).await?;
            if let Some(entry) = self.nodes.get_mut(&head.name) {
                entry.1 = read;
            }
        }
        if let Some((_, Record::Read(holder))) = self.nodes.get(&head.name) {
            self.shown = Some(Some(head.name.clone()));
            self.ready.push_back(Ok(Some(holder.clone())));
        }
        Ok(())
    }
}
