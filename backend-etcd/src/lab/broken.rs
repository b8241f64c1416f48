//! etcd's deliberately broken variant ([`BrokenVariant`]): the real client, but for how
//! it keeps a lease alive.

use std::time::{Duration, Instant};

use tenure_api::backend::default_drift;
use tenure_api::{async_trait, DistributedLock, Lease, LockError};
use tenure_conformance::broken::{BrokenVariant, ExtendFlaw, FlawedExtend};

/// etcd's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[BrokenVariant::new(
    "etcd-ignores-expiry",
    FlawedExtend::<IgnoresExpiry>::wrap,
)];

/// The answer to a keep-alive is never checked: no answer, or TTL 0, is taken as renewed.
#[derive(Debug, Default)]
struct IgnoresExpiry;

#[async_trait]
impl ExtendFlaw for IgnoresExpiry {
    async fn extend(
        &self,
        inner: &dyn DistributedLock,
        lease: &mut Lease,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let sent = Instant::now();
        // The keep-alive went out; whatever came back (if anything), renewed.
        let _ = inner.extend(lease, ttl).await;
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }
}
