//! The protocol floor on Redlock's nodes (feature `testbed`, for `tenure bench --floor`):
//! Redis's floor (`tenure_redis::floor`) sent to every node at once.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::LockError;
use tenure_conformance::testbed::{BoxFuture, Locker};
use tenure_redis::floor::RedisFloor;

/// The floor for a `redlock://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let config = crate::RedlockConfig::from_url(url)?;
        let nodes = config
            .nodes
            .iter()
            .map(|node| node.client_url())
            .collect::<Result<Vec<_>, _>>()?;
        let floor: Arc<dyn Locker> = Arc::new(RedisFloor::connect_all(&nodes, ttl).await?);
        Ok(floor)
    })
}
