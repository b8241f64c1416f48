//! The floors on Redis (feature `testbed`, for `tenure bench --floor`), with the plain
//! `redis` crate, on one node or on every node at once (Redlock's):
//!
//! - the *protocol floor*: the cheapest acquire + release of a fresh key, with none of
//!   tenure's work — `SET k v NX PX ttl`, then an `EVALSHA` compare-and-delete;
//! - the *same-work floor*: tenure's own server work — its acquire script
//!   ([`SCRIPTS`]`.acquire`, with the fence counter) or, unfenced, its `SET NX PX` of
//!   `"<owner>:<count>"`; Redlock's fence round where the nodes' counts disagree; its
//!   release script, announcing on the key's channel — with none of its client (no owner
//!   tracking, bounds, retries, routing).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure_api::{async_trait, LockError, LockKey, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::config::{FENCE, RELEASED};
use crate::scripts::SCRIPTS;
use crate::{FenceMode, RedisConfig};

const DELETE_IF_OURS: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

/// What a floor cycle sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The protocol floor: `SET NX PX`, scripted compare-and-delete.
    Protocol,
    /// tenure's server work.
    SameWork {
        /// The fence counter the acquire script keeps ([`FenceMode::None`]: none, a `SET
        /// NX PX`).
        fence: FenceMode,
        /// Redlock's: a count proposed to every node (this client's clock), taken within
        /// this window.
        proposal_window: Option<Duration>,
    },
}

/// A floor on one node or on all nodes at once.
pub struct RedisFloor {
    nodes: Vec<(MultiplexedConnection, RedisConfig)>,
    delete: redis::Script,
    ttl_ms: u64,
    work: Work,
}

impl std::fmt::Debug for RedisFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFloor")
            .field("nodes", &self.nodes.len())
            .field("ttl_ms", &self.ttl_ms)
            .field("work", &self.work)
            .finish_non_exhaustive()
    }
}

impl RedisFloor {
    /// The floor doing `work` on every node of `nodes` at once, its grants on leases of
    /// `ttl`.
    ///
    /// # Cancel safety
    /// Cancel-safe: the connections made so far are dropped.
    ///
    /// A same-work floor refuses, with [`LockError::Config`], nodes configured for work it
    /// does not send (`wait_replicas`: tenure's `WAIT` after each write).
    pub async fn connect(
        nodes: Vec<RedisConfig>,
        ttl: Duration,
        work: Work,
    ) -> Result<Self, LockError> {
        if matches!(work, Work::SameWork { .. }) && nodes.iter().any(|n| n.wait_replicas > 0) {
            return Err(LockError::Config(
                "the same-work floor sends no WAIT: not with wait_replicas".into(),
            ));
        }
        let connections = futures::future::try_join_all(nodes.iter().map(|config| async {
            let client = redis::Client::open(config.client_url()?)
                .map_err(|e| LockError::Config(format!("floor client: {e}")))?;
            client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| LockError::unavailable("floor connect", e))
        }))
        .await?;
        Ok(Self {
            nodes: connections.into_iter().zip(nodes).collect(),
            delete: redis::Script::new(DELETE_IF_OURS),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            work,
        })
    }

    /// `SET NX PX` on every node, then the compare-and-delete.
    async fn protocol_cycle(
        &self,
        key: &str,
        held: &(dyn Fn() + Send + Sync),
    ) -> Result<(), String> {
        let value = "floor";
        let replies = self.on_every_node(|mut conn, _| async move {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl_ms)
                .query_async::<Option<String>>(&mut conn)
                .await
        });
        for reply in replies.await {
            reply.map_err(|e| cycle_failed("SET NX PX", e))?;
        }
        held();
        let replies = self.on_every_node(|mut conn, _| async move {
            self.delete
                .key(key)
                .arg(value)
                .invoke_async::<i64>(&mut conn)
                .await
        });
        for reply in replies.await {
            reply.map_err(|e| cycle_failed("EVALSHA delete", e))?;
        }
        Ok(())
    }

    /// tenure's acquire on every node (and its fence round where the granted counts
    /// disagree), then its release.
    async fn same_work_cycle(
        &self,
        key: &str,
        held: &(dyn Fn() + Send + Sync),
        fence: FenceMode,
        proposal_window: Option<Duration>,
    ) -> Result<(), String> {
        let key = LockKey::new(key).map_err(|e| e.to_string())?;
        let owner = OwnerId::random().hex();
        let owner = std::str::from_utf8(&owner).expect("an owner id is hex");
        let count = proposal_window.map(|_| crate::unfenced_count());
        let replies = self.on_every_node(|mut conn, config| {
            let lock = config.lock_key(&key);
            async move {
                if fence == FenceMode::None {
                    let value = format!("{owner}:{}", count.unwrap_or_else(crate::unfenced_count));
                    let set = redis::cmd("SET")
                        .arg(&lock)
                        .arg(value)
                        .arg("NX")
                        .arg("PX")
                        .arg(self.ttl_ms)
                        .query_async::<Option<String>>(&mut conn)
                        .await?;
                    return Ok((i64::from(set.is_some()), count.unwrap_or(0) as i64));
                }
                let mut call = SCRIPTS.acquire.key(&lock);
                call.key(format!("{lock}{FENCE}"))
                    .arg(owner)
                    .arg(self.ttl_ms)
                    .arg(fence.as_str());
                // As tenure's client: a proposal only to a clock-floored counter.
                if let (FenceMode::ClockFloored, Some(count), Some(window)) =
                    (fence, count, proposal_window)
                {
                    call.arg("").arg(count).arg(window.as_micros() as u64);
                }
                let (granted, count, _) = call.invoke_async::<(i64, i64, i64)>(&mut conn).await?;
                Ok::<_, redis::RedisError>((granted, count))
            }
        });
        let mut counts = Vec::with_capacity(self.nodes.len());
        for reply in replies.await {
            match reply.map_err(|e| cycle_failed("acquire", e))? {
                (1, count) => counts.push(count),
                _ => return Err("a fresh key was held".into()),
            }
        }
        let highest = counts.iter().copied().max().unwrap_or(0);
        let agreed = counts.iter().filter(|&&c| c == highest).count() > self.nodes.len() / 2;
        // Redlock's: the fence round to every node where a majority did not count the
        // highest count itself; where it did, the highest recorded on the nodes that
        // counted another (as tenure's round does once it is decided).
        if fence != FenceMode::None && self.nodes.len() > 1 {
            let raises = self
                .nodes
                .iter()
                .zip(&counts)
                .filter(|(_, &c)| !agreed || c != highest);
            let raises = raises.map(|((conn, config), _)| {
                let (mut conn, lock) = (conn.clone(), config.lock_key(&key));
                async move {
                    SCRIPTS
                        .raise_fence
                        .key(&lock)
                        .key(format!("{lock}{FENCE}"))
                        .arg(owner)
                        .arg(highest)
                        .arg(fence.as_str())
                        .invoke_async::<i64>(&mut conn)
                        .await
                }
            });
            for reply in futures::future::join_all(raises).await {
                reply.map_err(|e| cycle_failed("raise fence", e))?;
            }
        }
        held();
        let replies = self.on_every_node(|mut conn, config| {
            let lock = config.lock_key(&key);
            async move {
                SCRIPTS
                    .release
                    .key(&lock)
                    .arg(owner)
                    .arg(format!("{lock}{RELEASED}"))
                    .arg("")
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        });
        for reply in replies.await {
            reply.map_err(|e| cycle_failed("release", e))?;
        }
        Ok(())
    }

    /// `request` sent to every node at once, each given its connection and configuration.
    fn on_every_node<'a, F, Fut, T>(
        &'a self,
        request: F,
    ) -> impl std::future::Future<Output = Vec<T>> + 'a
    where
        F: Fn(MultiplexedConnection, &'a RedisConfig) -> Fut,
        Fut: std::future::Future<Output = T> + 'a,
    {
        let requests = self
            .nodes
            .iter()
            .map(|(conn, config)| request(conn.clone(), config));
        futures::future::join_all(requests)
    }
}

#[async_trait]
impl Locker for RedisFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        match self.work {
            Work::Protocol => self.protocol_cycle(key, held).await,
            Work::SameWork {
                fence,
                proposal_window,
            } => {
                self.same_work_cycle(key, held, fence, proposal_window)
                    .await
            }
        }
    }
}

/// A floor doing `work(config)` for a `redis://` URL.
fn connect(
    url: &str,
    ttl: Duration,
    work: fn(&RedisConfig) -> Work,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(async move {
        let config = RedisConfig::from_url(url)?;
        let work = work(&config);
        RedisFloor::connect(vec![config], ttl, work).await
    })
}

/// The protocol floor for a `redis://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, ttl, |_| Work::Protocol)
}

/// The same-work floor for a `redis://` URL, with its fence mode.
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, ttl, |config| Work::SameWork {
        fence: config.fence,
        proposal_window: None,
    })
}
