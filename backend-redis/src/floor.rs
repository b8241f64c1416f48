//! The protocol floor on Redis (feature `testbed`, for `tenure bench --floor`): the
//! cheapest acquire + release of a fresh key the plain `redis` crate can do, with none of
//! tenure's work — `SET k v NX PX ttl`, then an `EVALSHA` compare-and-delete (on every
//! node at once, for Redlock).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure_api::{async_trait, LockError};
use tenure_conformance::testbed::{cycle_failed, BoxFuture, Locker};

const DELETE_IF_OURS: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

/// Plain `SET NX PX` + scripted delete, on one node or all nodes at once.
pub struct RedisFloor {
    nodes: Vec<MultiplexedConnection>,
    delete: redis::Script,
    ttl_ms: u64,
}

impl std::fmt::Debug for RedisFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFloor")
            .field("nodes", &self.nodes.len())
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl RedisFloor {
    async fn open(client_url: &str) -> Result<MultiplexedConnection, LockError> {
        let client = redis::Client::open(client_url)
            .map_err(|e| LockError::Config(format!("floor client: {e}")))?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| LockError::unavailable("floor connect", e))
    }

    fn new(nodes: Vec<MultiplexedConnection>, ttl: Duration) -> Self {
        Self {
            nodes,
            delete: redis::Script::new(DELETE_IF_OURS),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The floor on the server of a `redis://` URL.
    pub async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        let config = crate::RedisConfig::from_url(url)?;
        Ok(Self::new(
            vec![Self::open(config.client_url()?).await?],
            ttl,
        ))
    }

    /// The floor on every node of `nodes` at once (Redlock's), each given by its
    /// client URL.
    pub async fn connect_all(nodes: &[&str], ttl: Duration) -> Result<Self, LockError> {
        let nodes = futures::future::try_join_all(nodes.iter().map(|url| Self::open(url))).await?;
        Ok(Self::new(nodes, ttl))
    }
}

#[async_trait]
impl Locker for RedisFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let value = "floor";
        let set = self.nodes.iter().map(|conn| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(self.ttl_ms)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        });
        for reply in futures::future::join_all(set).await {
            reply.map_err(|e| cycle_failed("SET NX PX", e))?;
        }
        held();
        let delete = self.nodes.iter().map(|conn| {
            let mut conn = conn.clone();
            async move {
                self.delete
                    .key(key)
                    .arg(value)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        });
        for reply in futures::future::join_all(delete).await {
            reply.map_err(|e| cycle_failed("EVALSHA delete", e))?;
        }
        Ok(())
    }
}

/// The floor for a `redis://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let floor: Arc<dyn Locker> = Arc::new(RedisFloor::connect(url, ttl).await?);
        Ok(floor)
    })
}
