//! The raw protocol floor, each backend's (its testbed's `floor`, in its crate's
//! `src/floor.rs`): the cheapest acquire + release of a fresh key each backend's
//! plain client crate can do, with none of tenure's work (fencing, deadlines, owner
//! checks beyond compare-and-delete, retries).
//!
//! | backend | one floor cycle |
//! |---|---|
//! | redis | `SET k v NX PX ttl`; `EVALSHA` compare-and-delete |
//! | redlock | the same to every node concurrently |
//! | etcd | txn put `k` on a lease granted once, guarded by `create_revision == 0`; delete |
//! | zk | create an ephemeral sequential node under one parent; delete it |
//! | postgres | `INSERT … ON CONFLICT DO NOTHING` (the fresh key's row); `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT` |
//! | postgres, `locking=advisory` | `BEGIN; SELECT pg_try_advisory_xact_lock(hashtextextended(k, 0)); COMMIT` |

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;

use super::Locker;
use crate::local;

/// Floor lockers for `url`, able to serve `tasks` concurrent cycles.
pub(super) async fn lockers(
    url: &str,
    tasks: usize,
    ttl: Duration,
) -> Result<Vec<Arc<dyn Locker>>, LockError> {
    let backend = tenure::driver_for(url)?.name;
    let Some(connect) = local::testbed(backend).and_then(|testbed| testbed.floor) else {
        return Err(LockError::InvalidInput(format!(
            "no protocol floor for {}",
            tenure::redact_url(url)
        )));
    };
    Ok(vec![connect(url, tasks, ttl).await?])
}
