//! # tenure-redlock
//!
//! Redlock over N independent Redis masters, with fencing tokens from a **quorum
//! max-register**.
//!
//! **Acquire** sends the acquire script to all nodes *concurrently*, each bounded by a
//! short per-node timeout (default ttl/100, at least 50 ms). The lock is held only with a
//! majority (⌊N/2⌋+1) of grants **and** remaining validity
//! `ttl − elapsed − drift > 0`, measured from before the first send (drift = 1 % of the
//! TTL + 2 ms). On failure it releases on **every** node — including those that refused
//! or timed out — and retries after a random delay within the caller's wait bound.
//!
//! **Fencing** (on by default): each node's script increments that node's fence counter
//! and returns it; the token is `t = max` over the granting majority; a second round
//! writes `fence = max(fence, t)` to the nodes, and the lease counts as held only when a
//! majority acknowledged it while still held by us. Any two majorities intersect, so a
//! later grant reads a counter ≥ t on at least one node and gets a larger token — as long
//! as **no majority loses its memory** (restarts without persistence). Each node's
//! counter is clock-floored by default (`max(counter + 1, server time in µs)`, see
//! [`tenure_redis::FenceMode`]), which closes that gap too while server clocks move
//! forward: a node restarted empty hands out a token above every earlier one.
//! `?fence=counter` keeps the plain `INCR`. Cost: two round trips per acquire instead of
//! one; `?fencing=false` skips the second round, and [`Redlock::capabilities`] then says
//! [`FencingKind::None`].
//!
//! Redlock's safety depends on clocks (bounded drift, no jumps) and on nodes keeping
//! their data or restarting later than the max TTL; the conformance suite shows what
//! happens when they do not.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admin;
mod config;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use tenure_api::{
    deadline, default_drift, poll_acquire, validate_ttl, AcquireOptions, Capabilities,
    DistributedLock, ExpiryKind, Fairness, FencingKind, FencingToken, HolderInfo, Lease, LockError,
    LockKey, OwnerId, ReleaseOutcome, Replication, SystemClock, WaitKind,
};
use tenure_redis::{Grant, RedisLock};
use tokio::sync::OnceCell;

pub use config::{RedlockConfig, MAX_NODE_TIMEOUT, MIN_NODE_TIMEOUT};

/// A Redlock client over N independent Redis masters. Cheap to share (`Arc`).
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedlockConfig,
    nodes: Vec<OnceCell<RedisLock>>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// Connects to the nodes of a `redlock://h1:p,h2:p,…` URL (see [`RedlockConfig`]).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(RedlockConfig::from_url(url)?).await
    }

    /// Validates the configuration ([`RedlockConfig::validate`]: a bad one is
    /// [`LockError::Config`], never a panic), then connects to every node concurrently.
    /// Succeeds when a majority is reachable; the others are connected to lazily, on
    /// later calls.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn with_config(config: RedlockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let nodes = config.nodes.iter().map(|_| OnceCell::new()).collect();
        let limit = config
            .nodes
            .iter()
            .map(|node| node.connect_timeout)
            .max()
            .unwrap_or(MIN_NODE_TIMEOUT)
            .saturating_mul(2);
        let lock = Self {
            inner: Arc::new(Inner { config, nodes }),
        };
        let connected = lock
            .inner
            .fan_out(limit, |_| async { Ok(()) })
            .await
            .iter()
            .filter(|r| r.is_ok())
            .count();
        let needed = lock.inner.config.quorum();
        if connected < needed {
            return Err(LockError::NoQuorum {
                got: connected,
                needed,
            });
        }
        Ok(lock)
    }

    /// The configuration (its `Display` hides passwords).
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }
}

impl Inner {
    /// Runs `op` on node `index`, connecting first if needed, all within `limit`.
    async fn on_node<'a, T, F, Fut>(
        &'a self,
        index: usize,
        limit: Duration,
        op: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(&'a RedisLock) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let config = &self.config.nodes[index];
        let call = async {
            let node = self.nodes[index]
                .get_or_try_init(|| RedisLock::with_config(config.clone()))
                .await?;
            op(node).await
        };
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(LockError::Unavailable {
                message: format!("{}: no reply within {limit:?}", config.endpoint()),
                source: None,
            })
        })
    }

    /// Runs `op` on every node concurrently (never one after another).
    async fn fan_out<'a, T, F, Fut>(&'a self, limit: Duration, op: F) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a RedisLock) -> Fut + Copy,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        join_all((0..self.nodes.len()).map(|i| self.on_node(i, limit, op))).await
    }

    async fn release_everywhere(&self, key: &LockKey, owner: OwnerId, limit: Duration) -> usize {
        self.fan_out(limit, |node| node.release_owner(key, owner))
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count()
    }

    /// One Redlock round for `owner`. On any failure it releases on every node before
    /// returning.
    async fn round(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let quorum = self.config.quorum();
        let limit = self.config.node_timeout_for(ttl);
        let drift = default_drift(ttl);
        let start = Instant::now();
        let valid_until = deadline(start, ttl, drift);
        let replies = self
            .fan_out(limit, |node| node.grant(key, owner, ttl))
            .await;
        let tokens: Vec<FencingToken> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Grant::Granted(token)) => Some(*token),
                _ => None,
            })
            .collect();
        let held_elsewhere = replies
            .iter()
            .filter(|r| matches!(r, Ok(Grant::Held(_))))
            .count();
        let expired = || {
            LockError::Unavailable {
            message: format!(
                "a majority granted `{key}` but the validity ran out (replies took longer than the ttl minus drift)"
            ),
            source: None,
        }
        };
        let outcome = if tokens.len() < quorum {
            if tokens.len() + held_elsewhere >= quorum {
                Ok(None)
            } else {
                Err(LockError::NoQuorum {
                    got: tokens.len(),
                    needed: quorum,
                })
            }
        } else if Instant::now() >= valid_until {
            Err(expired())
        } else {
            let token = tokens.iter().copied().max().unwrap_or(FencingToken(0));
            match self.confirm(key, owner, token, limit, quorum).await {
                Ok(Some(_)) if Instant::now() >= valid_until => Err(expired()),
                confirmed => confirmed,
            }
        };
        match outcome {
            Ok(Some(token)) => Ok(Some(Lease::new(
                key.clone(),
                owner,
                token,
                start,
                ttl,
                drift,
            ))),
            failed => {
                self.release_everywhere(key, owner, limit).await;
                failed.map(|_| None)
            }
        }
    }

    /// The fence round: writes `max(fence, token)` everywhere; the grant stands when a
    /// majority acknowledged it while the lock was still ours.
    async fn confirm(
        &self,
        key: &LockKey,
        owner: OwnerId,
        token: FencingToken,
        limit: Duration,
        quorum: usize,
    ) -> Result<Option<FencingToken>, LockError> {
        if !self.config.fencing {
            return Ok(Some(token));
        }
        let still_ours = self
            .fan_out(limit, |node| node.raise_fence(key, owner, token))
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count();
        if still_ours >= quorum {
            Ok(Some(token))
        } else {
            Err(LockError::NoQuorum {
                got: still_ours,
                needed: quorum,
            })
        }
    }
}

#[async_trait]
impl DistributedLock for Redlock {
    /// # Cancel safety
    /// The round runs in its own task: if this future is dropped, the task finishes the
    /// round and releases whatever it was granted, so no stray key is left behind.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.detached_round(key, OwnerId::random(), ttl).await
    }

    /// Retries rounds after random delays (jittered backoff) until `opts.wait` has passed.
    /// Every round of one call uses the same owner id. Redlock has no push signal, so
    /// waiting polls.
    ///
    /// # Cancel safety
    /// As `try_acquire`.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        poll_acquire(&SystemClock, opts, || {
            self.detached_round(key, owner, opts.ttl)
        })
        .await
    }

    /// Extends on all nodes concurrently; held only if a majority extended within the
    /// validity.
    ///
    /// # Cancel safety
    /// `lease` is unchanged; some nodes may have applied the extension.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let inner = &self.inner;
        let (quorum, drift) = (inner.config.quorum(), default_drift(ttl));
        let limit = inner.config.node_timeout_for(ttl);
        let start = Instant::now();
        let (key, owner) = (lease.key().clone(), lease.owner());
        let replies = inner
            .fan_out(limit, |node| node.extend_owner(&key, owner, ttl))
            .await;
        let extended = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let refused = replies.iter().filter(|r| matches!(r, Ok(false))).count();
        if extended >= quorum && Instant::now() < deadline(start, ttl, drift) {
            lease.renewed(start, ttl, drift);
            return Ok(());
        }
        if refused > inner.config.nodes.len() - quorum || extended + refused >= quorum {
            return Err(LockError::lost(format!(
                "only {extended} of {} nodes still hold `{key}` for {owner}",
                inner.config.nodes.len()
            )));
        }
        Err(LockError::NoQuorum {
            got: extended,
            needed: quorum,
        })
    }

    /// Releases on all nodes concurrently.
    ///
    /// # Cancel safety
    /// Nodes not reached keep the lock until its TTL.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let limit = self.inner.config.node_timeout_for(lease.ttl());
        let released = self
            .inner
            .release_everywhere(lease.key(), lease.owner(), limit)
            .await;
        Ok(if released > 0 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// The owner that a majority of nodes names, with the smallest remaining time among
    /// them and the token recorded by the fence round.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let inner = &self.inner;
        let quorum = inner.config.quorum();
        let limit = inner
            .config
            .node_timeout_for(Duration::from_secs(1))
            .saturating_mul(10);
        let replies = inner.fan_out(limit, |node| node.inspect(key)).await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let holders: Vec<HolderInfo> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        for candidate in &holders {
            let same: Vec<&HolderInfo> = holders
                .iter()
                .filter(|h| h.owner == candidate.owner)
                .collect();
            if same.len() >= quorum {
                return Ok(Some(HolderInfo {
                    owner: candidate.owner,
                    token: same.iter().filter_map(|h| h.token).max(),
                    remaining: same.iter().filter_map(|h| h.remaining).min(),
                }));
            }
        }
        if answered < quorum {
            return Err(LockError::NoQuorum {
                got: answered,
                needed: quorum,
            });
        }
        Ok(None)
    }

    fn capabilities(&self) -> Capabilities {
        let nodes = self.inner.config.nodes.len();
        Capabilities {
            backend: "redlock",
            fencing: if self.inner.config.fencing {
                FencingKind::QuorumRegister
            } else {
                FencingKind::None
            },
            expiry: ExpiryKind::ServerTtl,
            replication: Replication::IndependentQuorum { nodes },
            wait: WaitKind::Poll,
            fairness: Fairness::None,
            failures_tolerated: (nodes - 1) / 2,
            clock_dependent: true,
        }
    }
}

impl Redlock {
    /// Runs one round in its own task, so that dropping the caller's future cannot cut a
    /// round short between the grant and the clean-up; a grant nobody is waiting for
    /// anymore is released.
    async fn detached_round(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let (inner, key) = (self.inner.clone(), key.clone());
        let (reply, answer) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let result = inner.round(&key, owner, ttl).await;
            if let Err(Ok(Some(orphan))) = reply.send(result) {
                let limit = inner.config.node_timeout_for(ttl);
                inner
                    .release_everywhere(orphan.key(), orphan.owner(), limit)
                    .await;
            }
        });
        answer
            .await
            .unwrap_or_else(|_| Err(LockError::backend("the Redlock round task panicked")))
    }
}
