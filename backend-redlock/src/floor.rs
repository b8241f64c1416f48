//! The floors on Redlock's nodes (feature `testbed`, for `tenure bench --floor`): Redis's
//! (`tenure_redis::floor`) sent to every node at once — the protocol floor, and the
//! same-work floor: tenure's acquire script with the round's proposed count (or, with
//! `fencing=false`, its `SET NX PX`), the fence round where the granted counts disagree,
//! and the release script. Where tenure decides a round on a majority's replies, the floor
//! waits for every node's.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;
use tenure_conformance::testbed::{boxed_locker, BoxFuture, Locker};
use tenure_redis::floor::{RedisFloor, Work};
use tenure_redis::FenceMode;

/// A floor doing `work(config)` on every node of a `redlock://` URL.
fn connect(
    url: &str,
    ttl: Duration,
    work: fn(&crate::RedlockConfig, Duration) -> Work,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(async move {
        let config = crate::RedlockConfig::from_url(url)?;
        let work = work(&config, ttl);
        RedisFloor::connect(config.nodes, ttl, work).await
    })
}

/// The protocol floor for a `redlock://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, ttl, |_, _| Work::Protocol)
}

/// The same-work floor for a `redlock://` URL: fenced as its nodes are, proposing within
/// the round's request bound.
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, ttl, |config, ttl| match config.fencing {
        true => Work::SameWork {
            fence: config
                .nodes
                .first()
                .map_or_else(FenceMode::default, |n| n.fence),
            proposal_window: Some(config.node_timeout_for(ttl)),
        },
        false => Work::SameWork {
            fence: FenceMode::None,
            proposal_window: None,
        },
    })
}
