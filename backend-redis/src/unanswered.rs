//! Clean-ups go behind the requests they undo.
//!
//! A request that got no reply is not dead: it may sit behind a stalled connection and
//! reach the server later. A clean-up that undoes it — the release of a grant whose reply
//! was lost, the withdrawal of a failed Redlock round's grant — must therefore reach the
//! server after it. Over the request's own connection it does (Redis runs one
//! connection's commands in order, whatever the delay); over a fresh one it could land
//! first, and the late grant would hold the key for nobody until its TTL.
//!
//! So each request on behalf of an owner id notes the connection it is sent on until its
//! reply comes; a request that gets none (timed out, or dropped by its caller) leaves the
//! note, which keeps that connection open. A clean-up for that owner goes over the noted
//! connection. This is safe because an owner id is never granted again once its clean-up
//! is sent (each acquire attempt and each Redlock round has an owner id of its own): a
//! clean-up that lands late can only undo the attempt it names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tenure_api::OwnerId;

use crate::primary::Node;

/// At most this many owners' notes are kept (each holds a connection open). Past it the
/// oldest note goes: a clean-up for that owner then takes the current connection, and a
/// grant still stalled on the dropped one is freed by its TTL at the latest.
const MAX_NOTES: usize = 1024;

/// The connection (a [`Node`]) each owner's last unanswered request went over.
pub(crate) struct Unanswered<N = Node> {
    notes: Mutex<Notes<N>>,
}

impl<N> Default for Unanswered<N> {
    fn default() -> Self {
        Self {
            notes: Mutex::new(Notes {
                by_owner: HashMap::new(),
                next: 0,
            }),
        }
    }
}

struct Notes<N> {
    by_owner: HashMap<OwnerId, (u64, Arc<N>)>,
    /// Counts notes, to find the oldest.
    next: u64,
}

impl<N> Unanswered<N> {
    /// A request for `owner` is about to go over `node`: noted until its reply comes.
    pub(crate) fn sending(&self, owner: OwnerId, node: &Arc<N>) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if notes.by_owner.len() >= MAX_NOTES && !notes.by_owner.contains_key(&owner) {
            let oldest = notes
                .by_owner
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(owner, _)| *owner);
            if let Some(oldest) = oldest {
                notes.by_owner.remove(&oldest);
            }
        }
        let at = notes.next;
        notes.next += 1;
        notes.by_owner.insert(owner, (at, node.clone()));
    }

    /// A reply for `owner` came over `node`: every request sent before it on that
    /// connection has reached the server, so nothing of `owner`'s is left in flight
    /// there. Also for a clean-up that got no reply: it is the owner's last request.
    pub(crate) fn done(&self, owner: OwnerId, node: &Arc<N>) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, noted)) = notes.by_owner.get(&owner) {
            if Arc::ptr_eq(noted, node) {
                notes.by_owner.remove(&owner);
            }
        }
    }

    /// The connection a clean-up for `owner` must go over: the one its last unanswered
    /// request went over, if any.
    pub(crate) fn behind(&self, owner: OwnerId) -> Option<Arc<N>> {
        let notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes.by_owner.get(&owner).map(|(_, node)| node.clone())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_owner
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_lasts_until_a_reply_on_its_connection_and_is_bounded() {
        let notes = Unanswered::<u8>::default();
        let (a, b) = (Arc::new(1), Arc::new(2));
        let owner = OwnerId::random();
        notes.sending(owner, &a);
        notes.done(owner, &b);
        assert!(
            notes.behind(owner).is_some_and(|n| Arc::ptr_eq(&n, &a)),
            "a reply on another connection says nothing of this one"
        );
        notes.done(owner, &a);
        assert!(notes.behind(owner).is_none());

        let first = OwnerId::random();
        notes.sending(first, &a);
        for _ in 0..MAX_NOTES {
            notes.sending(OwnerId::random(), &b);
        }
        assert_eq!(notes.len(), MAX_NOTES);
        assert!(notes.behind(first).is_none(), "the oldest note went first");
    }
}
