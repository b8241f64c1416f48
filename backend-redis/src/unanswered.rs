//! Clean-ups go behind the grants they undo.
//!
//! A request that got no reply is not dead: it may sit behind a stalled connection and
//! reach the server later. A clean-up that undoes a grant request — the release of a
//! grant whose reply was lost, the withdrawal of a failed Redlock round's grant — must
//! therefore reach the server after it. Over the request's own connection it does
//! (Redis runs one connection's commands in order, whatever the delay); over a fresh one
//! it could land first, and the late grant would hold the key for nobody until its TTL.
//!
//! So each grant request notes the connection it is sent on until a reply arrives on
//! that connection; one that gets none (timed out, or dropped by its caller) leaves the
//! note, which keeps the connection open. (A connection that dropped is replaced by a
//! fresh one: a clean-up sent over the dropped one fails, and goes over the current one
//! too. A request lost with the old socket reaches a server only through a middlebox
//! that kept it — then the late grant is freed by its TTL.) A clean-up for that owner is
//! sent behind every noted connection, and over the current one as well (a noted one may
//! be dead, or no longer the primary). This is safe because an owner id is never
//! granted again once its clean-up is sent (each acquire attempt and each Redlock round
//! has an owner id of its own): however late a clean-up lands, it can only undo the
//! attempt it names. Extensions and fence raises are not noted: both check the owner and
//! never create a key, so nothing needs to follow them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tenure_api::OwnerId;

use crate::primary::Node;

/// At most this many owners' notes are kept (each holds connections open). Past it the
/// oldest owner's notes go: a clean-up for that owner then takes the current connection
/// only, and a grant still stalled on a dropped one is freed by its TTL at the latest.
const MAX_OWNERS: usize = 1024;

/// The connections (each a [`Node`]) each owner's unanswered grant requests went over.
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
    /// Per owner: when it was first noted (a count), and its connections.
    by_owner: HashMap<OwnerId, (u64, Vec<Arc<N>>)>,
    next: u64,
}

impl<N> Unanswered<N> {
    /// A grant request for `owner` is about to go over `node`: noted until a reply
    /// arrives on that connection.
    pub(crate) fn sending(&self, owner: OwnerId, node: &Arc<N>) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if notes.by_owner.len() >= MAX_OWNERS && !notes.by_owner.contains_key(&owner) {
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
        let (_, nodes) = notes.by_owner.entry(owner).or_insert((at, Vec::new()));
        if !nodes.iter().any(|noted| Arc::ptr_eq(noted, node)) {
            nodes.push(node.clone());
        }
    }

    /// A reply for `owner` arrived over `node`: every request sent before it on that
    /// connection has reached the server, so nothing of `owner`'s is left in flight
    /// there (its other connections keep their notes).
    pub(crate) fn answered(&self, owner: OwnerId, node: &Arc<N>) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, nodes)) = notes.by_owner.get_mut(&owner) {
            nodes.retain(|noted| !Arc::ptr_eq(noted, node));
            if nodes.is_empty() {
                notes.by_owner.remove(&owner);
            }
        }
    }

    /// The connections a clean-up for `owner` must go behind.
    pub(crate) fn behind(&self, owner: OwnerId) -> Vec<Arc<N>> {
        let notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes
            .by_owner
            .get(&owner)
            .map(|(_, nodes)| nodes.clone())
            .unwrap_or_default()
    }

    /// `owner`'s clean-up is done: it is never granted again, nothing need follow.
    pub(crate) fn forget(&self, owner: OwnerId) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes.by_owner.remove(&owner);
    }

    #[cfg(test)]
    fn owners(&self) -> usize {
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
    fn notes_last_until_a_reply_on_their_connection_and_are_bounded() {
        let notes = Unanswered::<u8>::default();
        let (a, b) = (Arc::new(1), Arc::new(2));
        let owner = OwnerId::random();
        notes.sending(owner, &a);
        notes.sending(owner, &b);
        notes.answered(owner, &b);
        let behind = notes.behind(owner);
        assert!(
            behind.len() == 1 && Arc::ptr_eq(&behind[0], &a),
            "a reply on another connection says nothing of this one"
        );
        notes.answered(owner, &a);
        assert!(notes.behind(owner).is_empty());
        notes.sending(owner, &a);
        notes.forget(owner);
        assert!(
            notes.behind(owner).is_empty(),
            "forgotten after its clean-up"
        );

        let first = OwnerId::random();
        notes.sending(first, &a);
        for _ in 0..MAX_OWNERS {
            notes.sending(OwnerId::random(), &b);
        }
        assert_eq!(notes.owners(), MAX_OWNERS);
        assert!(
            notes.behind(first).is_empty(),
            "the oldest owner went first"
        );
    }
}
