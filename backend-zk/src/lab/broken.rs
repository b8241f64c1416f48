//! ZooKeeper's deliberately broken variant ([`BrokenVariant`]): the real client, but for
//! how it judges a silent session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use tenure_api::backend::default_drift;
use tenure_api::{async_trait, DistributedLock, Lease, LockError};
use tenure_conformance::broken::{BrokenVariant, ExtendFlaw, FlawedExtend};

use crate::{ZkConfig, ZkLock};

/// ZooKeeper's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[
    BrokenVariant::new(
        "zk-disconnected-held",
        FlawedExtend::<DisconnectedHeld>::wrap,
    ),
    BrokenVariant::new("zk-foreign-nodes-ignored", foreign_nodes_ignored),
];

/// tenure's ZooKeeper client before 2026-12-07: its nodes named `lock-<owner>-<sequence>`
/// (which Curator orders by the owner's hex), every other recipe's node ignored.
fn foreign_nodes_ignored(
    url: String,
    _inner: Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
    Box::pin(async move {
        let separator = if url.contains('?') { '&' } else { '?' };
        let mut config = ZkConfig::from_url(&format!("{url}{separator}node_names=legacy"))?;
        config.blind_to_other_recipes = true;
        Ok(Arc::new(ZkLock::with_config(config).await?) as Arc<dyn DistributedLock>)
    })
}

/// A `Disconnected` session is taken for a live one.
#[derive(Debug, Default)]
struct DisconnectedHeld;

#[async_trait]
impl ExtendFlaw for DisconnectedHeld {
    async fn extend(
        &self,
        inner: &dyn DistributedLock,
        lease: &mut Lease,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let sent = Instant::now();
        // No prompt answer means a disconnected session, presumed alive, its node still
        // ours; only a server that says otherwise ends the lease.
        let prompt = ttl / 10;
        let error = match tokio::time::timeout(prompt, inner.extend(lease, ttl)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => LockError::lost("broken lock: no answer"),
        };
        match tokio::time::timeout(prompt, inner.inspect(lease.key())).await {
            Ok(Ok(Some(holder))) if holder.owner != lease.owner() => Err(error),
            Ok(Ok(None)) => Err(error),
            _ => {
                lease.renewed(sent, ttl, default_drift(ttl));
                Ok(())
            }
        }
    }
}
