//! ZooKeeper's deliberately broken variant ([`BrokenVariant`]): the real client, but for
//! how it judges a silent session.

use std::time::{Duration, Instant};

use tenure_api::backend::default_drift;
use tenure_api::{async_trait, DistributedLock, Lease, LockError};
use tenure_conformance::broken::{BrokenVariant, ExtendFlaw, FlawedExtend};

/// ZooKeeper's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[BrokenVariant::new(
    "zk-disconnected-held",
    FlawedExtend::<DisconnectedHeld>::wrap,
)];

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
