//! Redlock's deliberately broken variants ([`BrokenVariant`]): rounds of their own over
//! one real Redis client per node (on the same servers and links), each with one classic
//! mistake of a Redlock client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::backend::{default_drift, poll_acquire};
use tenure_api::{
    async_trait, validate_ttl, AcquireOptions, Capabilities, DistributedLock, FencingToken,
    HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome, SystemClock, MAX_TTL,
};
use tenure_conformance::broken::BrokenVariant;
use tenure_conformance::testbed::BoxFuture;
use tenure_redis::lab::warm_up;
use tenure_redis::{Grant, RedisLock};

use crate::RedlockConfig;

/// Redlock's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[
    BrokenVariant::new("redlock-no-validity", |url, inner| {
        wrap(Flaw::NoValidity, url, inner)
    }),
    BrokenVariant::new("redlock-minority", |url, inner| {
        wrap(Flaw::Minority, url, inner)
    }),
    BrokenVariant::new("owner-reused-across-retries", |url, inner| {
        wrap(Flaw::OwnerReusedAcrossRetries, url, inner)
    }),
];

/// A classic mistake of a Redlock client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// The deadline is counted from the last reply, and a late quorum is kept.
    NoValidity,
    /// A grant on any one node is taken for the lock.
    Minority,
    /// Every round of one `acquire` grants to the same owner id, so a failed round's
    /// clean-up, landing late behind its stalled grant, deletes a later round's.
    OwnerReusedAcrossRetries,
}

/// Wraps `inner`, a real client of `url`, in `flaw`: one real client per node of its
/// own, through the same proxies.
fn wrap(
    flaw: Flaw,
    url: String,
    inner: Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
    Box::pin(async move {
        let config = RedlockConfig::from_url(&url)?;
        let needed = match flaw {
            Flaw::Minority => 1,
            _ => config.quorum(),
        };
        let nodes = config.nodes.iter().cloned().map(|mut node| {
            // Each request is bounded by the Redlock node timeout instead.
            node.request_timeout = node.request_timeout.max(config.node_timeout_for(MAX_TTL));
            async move {
                let lock = RedisLock::with_config(node).await?;
                warm_up(&lock).await?;
                Ok::<_, LockError>(lock)
            }
        });
        let nodes = futures::future::try_join_all(nodes).await?;
        let broken: Arc<dyn DistributedLock> = Arc::new(Broken {
            flaw,
            inner,
            nodes,
            config,
            needed,
        });
        Ok(broken)
    })
}

/// Rounds of one flaw over a real client per node; `inner` answers `inspect`.
struct Broken {
    flaw: Flaw,
    inner: Arc<dyn DistributedLock>,
    nodes: Vec<RedisLock>,
    config: RedlockConfig,
    /// The grants a round takes for the lock.
    needed: usize,
}

impl std::fmt::Debug for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broken")
            .field("flaw", &self.flaw)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Broken {
    /// A round for `owner`: a grant on `needed` nodes, with the largest node token; else
    /// a release of `owner` on every node (the clean-up).
    async fn round(
        &self,
        key: &LockKey,
        ttl: Duration,
        owner: OwnerId,
    ) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        let bound = self.config.node_timeout_for(ttl);
        let grants = self
            .nodes
            .iter()
            .map(|n| n.grant(key, owner, ttl, None, bound));
        let grants = futures::future::join_all(grants).await;
        let replied = Instant::now();
        let tokens: Vec<FencingToken> = grants
            .into_iter()
            .filter_map(|g| match g {
                Ok(Grant::Granted(token)) => Some(token),
                _ => None,
            })
            .collect();
        let valid = self.flaw == Flaw::NoValidity
            || replied < sent + ttl.saturating_sub(default_drift(ttl));
        if tokens.len() >= self.needed && valid {
            let (from, drift) = match self.flaw {
                Flaw::NoValidity => (replied, Duration::ZERO),
                _ => (sent, default_drift(ttl)),
            };
            let token = tokens.into_iter().max().unwrap_or(FencingToken(0));
            return Ok(Some(Lease::new(
                key.clone(),
                owner,
                token,
                from,
                ttl,
                drift,
            )));
        }
        let released = self
            .nodes
            .iter()
            .map(|n| n.release_owner(key, owner, bound));
        futures::future::join_all(released).await;
        Ok(None)
    }
}

#[async_trait]
impl DistributedLock for Broken {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.round(key, ttl, OwnerId::random()).await
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.refuse_label("broken")?;
        validate_ttl(opts.ttl)?;
        if self.flaw == Flaw::OwnerReusedAcrossRetries {
            // One owner id for every round of the call.
            let owner = OwnerId::random();
            return poll_acquire(&SystemClock, opts, || self.round(key, opts.ttl, owner)).await;
        }
        poll_acquire(&SystemClock, opts, || {
            self.round(key, opts.ttl, OwnerId::random())
        })
        .await
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let sent = Instant::now();
        let bound = self.config.node_timeout_for(ttl);
        let (key, owner) = (lease.key().clone(), lease.owner());
        let extended = self
            .nodes
            .iter()
            .map(|n| n.extend_owner(&key, owner, ttl, bound));
        let extended = futures::future::join_all(extended).await;
        if extended
            .into_iter()
            .filter(|e| matches!(e, Ok(true)))
            .count()
            < self.needed
        {
            return Err(LockError::lost("broken lock: extended on too few nodes"));
        }
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        // Each node's request bounded as the real Redlock bounds it: a cut-off node must
        // not hold the release up.
        let bound = self.config.node_timeout_for(lease.ttl());
        let released = self
            .nodes
            .iter()
            .map(|n| n.release_owner(lease.key(), lease.owner(), bound));
        let released = futures::future::join_all(released).await;
        Ok(match released.iter().any(|r| matches!(r, Ok(true))) {
            true => ReleaseOutcome::Released,
            false => ReleaseOutcome::NotHeld,
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    /// The backend's, except that its own acquire records no labels.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            labels: false,
            shared: false,
            ..self.inner.capabilities()
        }
    }
}
