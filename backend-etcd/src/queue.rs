//! The lock queue: a ticket (our key on an etcd lease) per acquisition, its place by
//! create revision, and the wait for the key before it to be deleted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use tenure_api::backend::{default_drift, holder_text};
use tenure_api::{
    Clock, FencingToken, Lease, LeaseHandle, LockError, LockKey, OwnerId, SystemClock,
};

use crate::rpc::{convert, delete_on_lease, is_lease_gone, Rpc};
use crate::session::Session;
use crate::{EtcdLock, LeaseMode};

/// The etcd leases this client granted for one lock each (`?lease=per-lock`): the only
/// leases it revokes once their key is released or moved. A lease from elsewhere (a
/// lease is plain data, and may come from a client on session leases, whose lease
/// carries its other locks) is never revoked here. Forgetting one only leaves it to its
/// TTL, so the set is simply emptied when it grows past [`OwnLeases::MAX`].
#[derive(Default)]
pub(crate) struct OwnLeases(Mutex<HashSet<i64>>);

impl OwnLeases {
    const MAX: usize = 1 << 16;

    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, id: i64) {
        let mut ids = self.ids();
        if ids.len() >= Self::MAX {
            ids.clear();
        }
        ids.insert(id);
    }

    /// Whether `id` is a lease this client granted for one lock.
    pub(crate) fn contains(&self, id: i64) -> bool {
        self.ids().contains(&id)
    }

    /// Whether `id` is a lease of this client's own (it is then forgotten).
    pub(crate) fn take(&self, id: i64) -> bool {
        self.ids().remove(&id)
    }
}

/// A queued lock key and the lease it lives on. Until disarmed, dropping it deletes the
/// key in the background (revoking a lease of its own, or through its session): a
/// cancelled acquire leaves no ghost.
pub(crate) struct Ticket {
    rpc: Rpc,
    pub(crate) lease_id: i64,
    /// The session whose lease the key is on; `None` for a lease of its own.
    session: Option<Arc<Session>>,
    /// The requested TTL (the granted one is at least this).
    pub(crate) ttl: Duration,
    /// The etcd key.
    key: String,
    /// Its create revision: queue position and fencing token.
    pub(crate) revision: i64,
    /// Whether it was first in the queue when last looked at; for a reader's, whether
    /// no writer's key was before it.
    pub(crate) first: bool,
    /// A reader's key (named with [`SHARED_MARK`]), which waits only for the writers'
    /// keys before it.
    pub(crate) shared: bool,
    /// When the grant or the last successful keep-alive was sent.
    pub(crate) refreshed_at: Instant,
    /// The machine's time suspended so far, as read when that was sent (`Instant` stands
    /// still during a suspend; the lease on the server does not).
    refreshed_suspended: Duration,
    pub(crate) armed: bool,
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
        if let Some(session) = &self.session {
            session.reap_now(&self.key);
            return;
        }
        // Never block in Drop: revoke in the background if there is a runtime; otherwise
        // the lease's TTL removes the key.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (rpc, id) = (self.rpc.clone(), self.lease_id);
            runtime.spawn(async move {
                let _ = rpc.revoke(id).await;
            });
        }
    }
}

/// Where a wait ended.
pub(crate) enum Turn {
    /// Our key is first in the queue.
    Ours,
    /// The wait bound passed first.
    Deadline,
}

impl EtcdLock {
    /// Keeps a queued ticket's key alive for another TTL, recording when its lease was
    /// last confirmed alive: a keep-alive of a lease of its own, or its session's
    /// deadline moved on (and the session's keep-alive, if that is late).
    async fn refresh(&self, ticket: &mut Ticket) -> Result<(), LockError> {
        let (sent, suspended) = (Instant::now(), SystemClock.suspended());
        match &ticket.session {
            None => {
                self.rpc.keep_alive(ticket.lease_id).await?;
                ticket.refreshed_at = sent;
            }
            Some(session) => {
                session.renew(&ticket.key, sent + ticket.ttl)?;
                ticket.refreshed_at = self.sessions.confirmed(session, sent, ticket.ttl).await?;
            }
        }
        ticket.refreshed_suspended = suspended;
        Ok(())
    }

    /// Deletes a ticket's key: revokes its own lease, or deletes it from its session's.
    /// If that fails, the ticket stays armed and its drop tries once more in the
    /// background; the TTL is the last resort.
    pub(crate) async fn abandon(&self, mut ticket: Ticket) {
        if !ticket.armed {
            return;
        }
        let done = match &ticket.session {
            None => {
                self.own_leases.take(ticket.lease_id);
                self.rpc.revoke(ticket.lease_id).await.is_ok()
            }
            Some(session) => {
                let txn = delete_on_lease(&ticket.key, ticket.lease_id);
                let deleted = self.rpc.txn("queue key delete", txn).await.is_ok();
                if deleted {
                    session.forget(&ticket.key);
                }
                deleted
            }
        };
        if done {
            ticket.armed = false;
        }
    }

    /// An etcd lease for a key named `key_of(lease id)`, and the ticket for that key (not
    /// yet written): a lease of its own, or this client's session lease for `ttl`, on
    /// which the key is registered before it is sent.
    pub(crate) async fn ticket(
        &self,
        ttl: Duration,
        key_of: &(dyn Fn(i64) -> String + Sync),
    ) -> Result<Ticket, LockError> {
        let (sent, suspended) = (Instant::now(), SystemClock.suspended());
        let (lease_id, believed, refreshed_at, session) = match self.rpc.config.lease {
            LeaseMode::PerLock => {
                let (lease_id, ttl) = self.rpc.grant_lease(ttl).await?;
                self.own_leases.add(lease_id);
                (lease_id, ttl, sent, None)
            }
            LeaseMode::Session => {
                let session = self.sessions.enter(ttl, key_of, sent + ttl).await?;
                let believed = ttl.min(session.granted);
                let confirmed = self.sessions.confirmed(&session, sent, believed).await;
                let refreshed_at = match confirmed {
                    Ok(at) => at,
                    Err(e) => {
                        session.forget(&key_of(session.lease_id));
                        return Err(e);
                    }
                };
                (session.lease_id, believed, refreshed_at, Some(session))
            }
        };
        Ok(Ticket {
            rpc: self.rpc.clone(),
            lease_id,
            session,
            ttl: believed,
            key: key_of(lease_id),
            revision: 0,
            first: false,
            shared: false,
            refreshed_at,
            refreshed_suspended: suspended,
            armed: true,
        })
    }

    /// Grants a lease and queues a key on it. The ticket says whether it is first. On an
    /// error the key is removed: its lease revoked (a put still in flight then fails on
    /// it; if the revoke gets no reply, the lease, unrenewed, ends within its TTL), or a
    /// session's key deleted (a late put is then deleted by the session, as a key it
    /// does not know).
    pub(crate) async fn enqueue(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<Ticket, LockError> {
        let mut ticket = self.new_ticket(key, owner, ttl, false).await?;
        match self.queue_ticket(key, owner, label, &mut ticket).await {
            Ok(()) => Ok(ticket),
            Err(e) => {
                self.abandon(ticket).await;
                Err(e)
            }
        }
    }

    /// A ticket for `key`'s queue under a key name never used before (the owner id is
    /// random per acquisition, and each ticket of one acquisition is numbered), on a lease
    /// of its own or its session's; not yet queued. A reader's (`shared`) is named with
    /// [`SHARED_MARK`].
    pub(crate) async fn new_ticket(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        shared: bool,
    ) -> Result<Ticket, LockError> {
        let unique = own_prefix(&self.queue_prefix(key), owner, shared);
        let attempt = self.sessions.fresh_name();
        let key_of = |id: i64| format!("{unique}{:016x}-{attempt:x}", id as u64);
        let mut ticket = self.ticket(ttl, &key_of).await?;
        ticket.shared = shared;
        Ok(ticket)
    }

    /// Puts the ticket's key in its queue unless it is there already, and reads in the
    /// same revision whether it is first. Sent again after a lost reply, it finds the key
    /// the first put wrote (its name is the ticket's alone): a retry never needs to undo
    /// a put whose fate is unknown. On a lease that is gone the ticket is disarmed (no
    /// key can be on it) and the answer is `LeaseLost`; other errors leave it as it was.
    ///
    /// # Cancel safety
    /// The ticket stays armed until the key is known queued: dropped, it removes the key.
    pub(crate) async fn queue_ticket(
        &self,
        key: &LockKey,
        owner: OwnerId,
        label: Option<&str>,
        ticket: &mut Ticket,
    ) -> Result<(), LockError> {
        if let Some(session) = &ticket.session {
            // Registered until then: the session never deletes it under a retry.
            session.renew(&ticket.key, Instant::now() + ticket.ttl)?;
        }
        let queue = self.queue_prefix(key);
        // What says whether the key is first: the queue's oldest key; for a reader's, the
        // writers' keys (any there, at the revision of its put, are older).
        let heads = match ticket.shared {
            false => {
                let head = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1);
                vec![TxnOp::get(queue.as_str(), Some(head))]
            }
            true => writer_ranges(&queue, GetOptions::new().with_limit(1).with_keys_only()),
        };
        let ours = ticket.key.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(ours, CompareOp::Equal, 0)])
            .and_then(
                [TxnOp::put(
                    ours,
                    holder_text(owner, label),
                    Some(PutOptions::new().with_lease(ticket.lease_id)),
                )]
                .into_iter()
                .chain(heads.iter().cloned())
                .collect::<Vec<_>>(),
            )
            .or_else(
                [TxnOp::get(ours, None)]
                    .into_iter()
                    .chain(heads)
                    .collect::<Vec<_>>(),
            );
        let reply = match self.rpc.txn("enqueue txn", txn).await {
            Ok(reply) => reply,
            Err(e) if is_lease_gone(&e) => {
                // The put was refused: nothing was written on a lease that is gone.
                ticket.armed = false;
                if let Some(session) = &ticket.session {
                    session.forget(&ticket.key);
                    session.close();
                }
                return Err(LockError::lost(format!(
                    "etcd lease {:x} ended before the key was queued",
                    ticket.lease_id
                )));
            }
            Err(e) => return Err(e),
        };
        let mut gets = reply.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        });
        let revision = if reply.succeeded() {
            reply.header().map_or(0, |h| h.revision())
        } else {
            // Put by an earlier send of this request whose reply was lost.
            match gets.next().flatten() {
                Some(kv) if kv.lease() == ticket.lease_id => kv.create_revision(),
                _ => return Err(LockError::backend("a fresh lock key is on another lease")),
            }
        };
        let heads: Vec<_> = gets.collect();
        if revision <= 0 || heads.is_empty() {
            return Err(LockError::backend("malformed enqueue reply from etcd"));
        }
        ticket.revision = revision;
        ticket.first = match ticket.shared {
            // No writer's key at all; after a lost reply, one may be younger than ours:
            // then `wait_turn` looks precisely.
            true => heads.iter().all(Option::is_none),
            false => heads[0]
                .as_ref()
                .is_some_and(|kv| kv.key() == ticket.key.as_bytes()),
        };
        Ok(())
    }

    /// The next older key in the ticket's queue (its predecessor; for a reader's, the
    /// next older writer's key), with the revision the answer was read at, read in one transaction with the proof that the ticket's
    /// own key still exists (same create revision): a key deleted while it waited (by an
    /// operator, or with a session lease that ended while this client was suspended)
    /// is `LeaseLost`, never a turn. A read-only transaction: no Raft write.
    async fn predecessor(
        &self,
        queue: &str,
        ticket: &Ticket,
    ) -> Result<(Option<Vec<u8>>, i64), LockError> {
        let options = GetOptions::new()
            .with_max_create_revision(ticket.revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let ours = Compare::create_revision(ticket.key.as_str(), CompareOp::Equal, ticket.revision);
        let reads = match ticket.shared {
            false => vec![TxnOp::get(queue, Some(options.with_prefix()))],
            true => writer_ranges(queue, options),
        };
        let txn = Txn::new().when([ours]).and_then(reads);
        let reply = self.rpc.txn("predecessor txn", txn).await?;
        if !reply.succeeded() {
            return Err(LockError::lost(format!(
                "the queue key `{}` is gone (deleted, or its etcd lease ended)",
                ticket.key
            )));
        }
        let revision = reply.header().map_or(0, |h| h.revision());
        let gets: Vec<_> = reply
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
                _ => None,
            })
            .collect();
        if gets.is_empty() {
            return Err(LockError::backend("malformed predecessor reply"));
        }
        // The youngest of the (one or two ranges') youngest older keys.
        let before = gets
            .into_iter()
            .flatten()
            .max_by_key(|kv| kv.create_revision())
            .map(|kv| kv.key().to_vec());
        Ok((before, revision))
    }

    /// Waits until the ticket is first in its queue or `deadline` passes, keeping its
    /// lease alive. Errors leave the ticket queued (the caller decides).
    pub(crate) async fn wait_turn(
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
                let (mut watches, before) = (self.rpc.client.watch_client(), before.clone());
                let options = options.clone();
                async move { watches.watch(before, Some(options)).await }
            };
            let mut watch = self.rpc.call("watch", watch).await?;
            loop {
                tokio::select! {
                    message = watch.message() => {
                        let message = message
                            .map_err(|e| convert(&self.rpc.config, "watch", e))?
                            .ok_or_else(|| self.rpc.unavailable("watch: the stream ended"))?;
                        if message.canceled() {
                            if message.compact_revision() > 0 {
                                break; // compacted past our start: just look again
                            }
                            return Err(self.rpc.unavailable(&format!(
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
    /// refreshing it if it was last refreshed more than a tenth of the TTL ago (or before
    /// a suspend), and turns it into a lease. `LeaseLost` if the lease expired. A
    /// session's lease is confirmed by its task every tenth of its TTL; a keep-alive is
    /// sent here only if that is late. On an error the ticket is no longer taken as first:
    /// a retry proves again that its key exists before it is granted.
    pub(crate) async fn grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ticket: &mut Ticket,
    ) -> Result<Lease, LockError> {
        let granted = self.confirm_grant(key, owner, ticket).await;
        if granted.is_err() {
            ticket.first = false;
        }
        granted
    }

    async fn confirm_grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ticket: &mut Ticket,
    ) -> Result<Lease, LockError> {
        let slept = SystemClock.suspended() > ticket.refreshed_suspended;
        if ticket.session.is_some() || slept || ticket.refreshed_at.elapsed() > ticket.ttl / 10 {
            self.refresh(ticket).await?;
        } else {
            if self.rpc.time_to_live(ticket.lease_id).await? < 0 {
                return Err(LockError::lost(format!(
                    "etcd lease {:x} expired before the grant was confirmed",
                    ticket.lease_id
                )));
            }
        }
        ticket.armed = false;
        let token = u64::try_from(ticket.revision)
            .map_err(|_| LockError::backend("negative create revision"))?;
        let lease = Lease::new(
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
        });
        Ok(match ticket.shared {
            true => lease.into_shared(),
            false => lease,
        })
    }
}

/// What starts the name of a reader's key in a queue (after the queue's prefix): a
/// writer waits for every key before it, a reader only for the writers' — every other
/// key, tenure's writers (named by their owner id, in hex) and other recipes' alike.
pub(crate) const SHARED_MARK: &str = "shared-";

/// The start of every queue key `owner` puts in `queue` (a reader's, `shared`): a retry
/// finds its own keys.
pub(crate) fn own_prefix(queue: &str, owner: OwnerId, shared: bool) -> String {
    match shared {
        false => format!("{queue}{owner}-"),
        true => format!("{queue}{SHARED_MARK}{owner}-"),
    }
}

/// Reads of every key of `queue` but the readers': the keys before [`SHARED_MARK`]'s
/// range and those after it, each with `options`.
fn writer_ranges(queue: &str, options: GetOptions) -> Vec<TxnOp> {
    let marked = format!("{queue}{SHARED_MARK}");
    vec![
        TxnOp::get(queue, Some(options.clone().with_range(marked.as_str()))),
        TxnOp::get(
            prefix_end(&marked),
            Some(options.with_range(prefix_end(queue))),
        ),
    ]
}

/// The first key after every key that starts with `prefix`, which ends in a character
/// below DEL (a queue prefix's `/`, the mark's `-`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}
