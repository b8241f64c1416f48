//! The floors, each backend's (its testbed's `floor` and `same_work_floor`, in its crate's
//! `src/floor.rs`), both with the backend's plain client crate:
//!
//! - the *protocol floor*: the cheapest acquire + release of a fresh key, with none of
//!   tenure's work (fencing, deadlines, owner checks beyond compare-and-delete, retries);
//! - the *same-work floor*: exactly the server work of tenure's cycle, in the same round
//!   trips, with none of tenure's client. tenure / same-work is what tenure's client
//!   costs; same-work / protocol what the guarantee costs the servers.
//!
//! | backend | protocol floor cycle | same-work floor cycle |
//! |---|---|---|
//! | redis | `SET k v NX PX ttl`; `EVALSHA` compare-and-delete | tenure's acquire script (fence counter; `fence=none`: its `SET NX PX`); its release script (announcing) |
//! | redlock | the same to every node concurrently | the same to every node, proposing one count; the fence round if the counts disagree, else the raise to the nodes that counted another |
//! | etcd | txn put `k` on a lease granted once, guarded by `create_revision == 0`; delete | tenure's enqueue txn (guarded put on one session lease, the queue's head); its delete |
//! | zk | create an ephemeral sequential node under one parent; delete it | tenure's requests for a fresh key: its contender node (no key node yet), the key's container, the contender again, the children, the delete |
//! | postgres | `INSERT … ON CONFLICT DO NOTHING` (the fresh key's row); `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT` | tenure's begin batch, fence statement and commit |
//! | postgres, `locking=advisory` | `BEGIN; SELECT pg_try_advisory_xact_lock(hashtextextended(k, 0)); COMMIT` | tenure's advisory begin batch, fence statement and commit |

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;

use super::Locker;
use crate::local;

/// Which floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Floor {
    /// The least a lock needs.
    Protocol,
    /// tenure's server work.
    SameWork,
}

impl Floor {
    /// Its `impl` name in the bench's lines.
    pub(super) fn name(self) -> &'static str {
        match self {
            Floor::Protocol => "floor",
            Floor::SameWork => "same-work",
        }
    }
}

/// `floor`'s lockers for `url`, able to serve `tasks` concurrent cycles; `None` for a
/// backend without a same-work floor, or one that does not send the work `url`
/// configures (it says why on stderr). A backend without a protocol floor is an error.
pub(super) async fn lockers(
    url: &str,
    tasks: usize,
    ttl: Duration,
    floor: Floor,
) -> Result<Option<Vec<Arc<dyn Locker>>>, LockError> {
    let backend = tenure::driver_for(url)?.name;
    let testbed = local::testbed(backend);
    let connect = match floor {
        Floor::Protocol => testbed.and_then(|testbed| testbed.floor),
        Floor::SameWork => match testbed.and_then(|testbed| testbed.same_work_floor) {
            Some(connect) => Some(connect),
            None => return Ok(None),
        },
    };
    let Some(connect) = connect else {
        return Err(LockError::InvalidInput(format!(
            "no protocol floor for {}",
            tenure::redact_url(url)
        )));
    };
    match connect(url, tasks, ttl).await {
        // The floors' refusals of work they do not send, not any configuration error.
        Err(LockError::Config(why))
            if floor == Floor::SameWork && why.starts_with("the same-work floor") =>
        {
            eprintln!(
                "tenure bench: no same-work floor for {}: {why}",
                tenure::redact_url(url)
            );
            Ok(None)
        }
        connected => Ok(Some(vec![connected?])),
    }
}
