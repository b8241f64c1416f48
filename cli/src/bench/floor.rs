//! The raw protocol floor: the cheapest acquire + release of a fresh key each backend's
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

use tenure_api::{async_trait, LockError};

use super::Locker;

/// Floor lockers for `url`, able to serve `tasks` concurrent cycles.
pub(super) async fn lockers(
    url: &str,
    tasks: usize,
    ttl: Duration,
) -> Result<Vec<Arc<dyn Locker>>, LockError> {
    let locker: Arc<dyn Locker> = match tenure::driver_for(url)?.name {
        "redis" => Arc::new(redis_floor::RedisFloor::connect(url, ttl).await?),
        "redlock" => Arc::new(redis_floor::RedisFloor::connect_all(url, ttl).await?),
        "etcd" => Arc::new(etcd_floor::EtcdFloor::connect(url).await?),
        "zk" => Arc::new(zk_floor::ZkFloor::connect(url).await?),
        "postgres" => Arc::new(pg_floor::PgFloor::connect(url, tasks).await?),
        _ => {
            return Err(LockError::InvalidInput(format!(
                "no protocol floor for {}",
                tenure::redact_url(url)
            )))
        }
    };
    Ok(vec![locker])
}

fn failed(what: &str, error: impl std::fmt::Display) -> String {
    format!("{what}: {error}")
}

mod redis_floor {
    use super::*;
    use redis::aio::MultiplexedConnection;

    const DELETE_IF_OURS: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

    /// Plain `SET NX PX` + scripted delete, on one node or all nodes at once.
    pub(crate) struct RedisFloor {
        nodes: Vec<MultiplexedConnection>,
        delete: redis::Script,
        ttl_ms: u64,
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

        pub(crate) async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
            let config = tenure_redis::RedisConfig::from_url(url)?;
            Ok(Self::new(
                vec![Self::open(config.client_url()?).await?],
                ttl,
            ))
        }

        pub(crate) async fn connect_all(url: &str, ttl: Duration) -> Result<Self, LockError> {
            let config = tenure_redlock::RedlockConfig::from_url(url)?;
            let nodes = futures::future::try_join_all(
                config
                    .nodes
                    .iter()
                    .map(|node| async move { Self::open(node.client_url()?).await }),
            )
            .await?;
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
                reply.map_err(|e| failed("SET NX PX", e))?;
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
                reply.map_err(|e| failed("EVALSHA delete", e))?;
            }
            Ok(())
        }
    }
}

mod etcd_floor {
    use super::*;
    use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};

    /// Guarded put on one lease granted up front, then delete.
    pub(crate) struct EtcdFloor {
        client: Client,
        lease: i64,
    }

    impl EtcdFloor {
        pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
            let config = tenure_etcd::EtcdConfig::from_url(url)?;
            let mut options = ConnectOptions::new().with_connect_timeout(config.connect_timeout);
            if let Some((user, password)) = config.credentials() {
                options = options.with_user(user, password);
            }
            let client = Client::connect(config.endpoints(), Some(options))
                .await
                .map_err(|e| LockError::unavailable("floor connect", e))?;
            // Long enough for any run (`--secs` is at most an hour per implementation).
            let lease = client
                .lease_client()
                .grant(7200, None)
                .await
                .map_err(|e| LockError::unavailable("floor lease grant", e))?
                .id();
            Ok(Self { client, lease })
        }
    }

    impl Drop for EtcdFloor {
        fn drop(&mut self) {
            let (mut leases, id) = (self.client.lease_client(), self.lease);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = leases.revoke(id).await;
                });
            }
        }
    }

    #[async_trait]
    impl Locker for EtcdFloor {
        async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
            let mut kv = self.client.kv_client();
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    "floor",
                    Some(PutOptions::new().with_lease(self.lease)),
                )]);
            let reply = kv.txn(txn).await.map_err(|e| failed("txn put", e))?;
            if !reply.succeeded() {
                return Err("a fresh key existed".into());
            }
            held();
            kv.delete(key, None)
                .await
                .map_err(|e| failed("delete", e))?;
            Ok(())
        }
    }
}

pub(super) use zk_floor::zk_connect;

mod zk_floor {
    use super::*;
    use zookeeper_client::{Acls, Client, CreateMode};

    /// Ephemeral sequential create under one parent, then delete.
    pub(crate) struct ZkFloor {
        client: Client,
        parent: String,
    }

    impl ZkFloor {
        pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
            let (client, parent) = zk_connect(url, "tenure-floor").await?;
            Ok(Self { client, parent })
        }
    }

    /// A plain client session for the server of a `zk://` URL, and the persistent node
    /// `name` under its chroot (created if missing).
    pub(crate) async fn zk_connect(url: &str, name: &str) -> Result<(Client, String), LockError> {
        let config = tenure_zk::ZkConfig::from_url(url)?;
        let mut connector = Client::connector();
        if let Some(digest) = config.digest() {
            connector = connector.with_auth("digest", &digest);
        }
        let client = connector
            .connect(&config.connect_string())
            .await
            .map_err(|e| LockError::unavailable("bench connect", e))?;
        let parent = format!("{}/{name}", config.chroot());
        let mut path = String::new();
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            path = format!("{path}/{part}");
            let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
            match client.create(&path, &[], &persistent).await {
                Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                Err(e) => return Err(LockError::unavailable("bench parent node", e)),
            }
        }
        Ok((client, parent))
    }

    #[async_trait]
    impl Locker for ZkFloor {
        async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
            let prefix = format!("{}/{}-", self.parent, key.replace('/', "_"));
            let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
            let (_, sequence) = self
                .client
                .create(&prefix, &[], &mode)
                .await
                .map_err(|e| failed("create", e))?;
            held();
            self.client
                .delete(&format!("{prefix}{sequence}"), None)
                .await
                .map_err(|e| failed("delete", e))
        }
    }
}

mod pg_floor {
    use super::*;
    use sqlx::postgres::{PgPool, PgPoolOptions};

    const TABLE: &str = "tenure_bench_floor";

    /// Row insert, then `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT`; or, for
    /// `locking=advisory`, `BEGIN; SELECT pg_try_advisory_xact_lock(…); COMMIT`.
    pub(crate) struct PgFloor {
        pool: PgPool,
        advisory: bool,
    }

    impl PgFloor {
        pub(crate) async fn connect(url: &str, tasks: usize) -> Result<Self, LockError> {
            let config = tenure_postgres::PgConfig::from_url(url)?;
            let advisory = config.locking == tenure_postgres::Locking::Advisory;
            let pool = PgPoolOptions::new()
                .max_connections(u32::try_from(tasks).unwrap_or(64).max(1))
                .connect_with(config.connect_options().clone())
                .await
                .map_err(|e| LockError::unavailable("floor connect", e))?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {TABLE} (key text PRIMARY KEY)"
            )))
            .execute(&pool)
            .await
            .map_err(|e| LockError::unavailable("floor table", e))?;
            Ok(Self { pool, advisory })
        }
    }

    #[async_trait]
    impl Locker for PgFloor {
        async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
            if self.advisory {
                let mut tx = self.pool.begin().await.map_err(|e| failed("begin", e))?;
                let locked: bool =
                    sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
                        .bind(key)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| failed("pg_try_advisory_xact_lock", e))?;
                if !locked {
                    return Err(format!("advisory lock on {key:?} is held"));
                }
                held();
                return tx.commit().await.map_err(|e| failed("commit", e));
            }
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {TABLE} (key) VALUES ($1) ON CONFLICT DO NOTHING"
            )))
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(|e| failed("insert", e))?;
            let mut tx = self.pool.begin().await.map_err(|e| failed("begin", e))?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT key FROM {TABLE} WHERE key = $1 FOR UPDATE NOWAIT"
            )))
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| failed("select for update nowait", e))?;
            held();
            tx.commit().await.map_err(|e| failed("commit", e))
        }
    }
}
