//! Postgres's deliberately broken variant ([`BrokenVariant`]): the real client, its leases
//! handed out under tokens from a fence the holder raises in a transaction of its own.

use std::sync::Arc;

use sqlx::Connection as _;
use tenure_api::{async_trait, DistributedLock, FencingToken, LockError, LockKey};
use tenure_conformance::broken::{unavailable, BrokenVariant, Retokened, TokenSource};
use tenure_conformance::testbed::BoxFuture;

use crate::PgConfig;

/// Postgres's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[BrokenVariant::new("pg-fence-in-txn", fence_in_txn)];

/// The broken variant's own fence counters.
const FENCE_TABLE: &str = "tenure_broken_fence";

/// The fence counter is raised in a transaction of the holder's that commits with the
/// release, so a crashed holder's token is handed out again.
fn fence_in_txn(
    url: String,
    inner: Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
    Box::pin(async move {
        let config = PgConfig::from_url(&url)?;
        let mut conn = connect(&config).await?;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {FENCE_TABLE} (key text PRIMARY KEY, n bigint NOT NULL)"
        );
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
        {
            // Concurrent creations race on the catalog; one of them made it.
            let probe = format!("SELECT 1 FROM {FENCE_TABLE} LIMIT 0");
            sqlx::query(sqlx::AssertSqlSafe(probe))
                .execute(&mut conn)
                .await
                .map_err(|_| unavailable("fence table", e))?;
        }
        let fence = FenceInTxn {
            conn: tokio::sync::Mutex::new(Some(conn)),
            config,
        };
        let broken: Arc<dyn DistributedLock> = Arc::new(Retokened::new(inner, fence));
        Ok(broken)
    })
}

async fn connect(config: &PgConfig) -> Result<sqlx::PgConnection, LockError> {
    sqlx::PgConnection::connect_with(config.connect_options())
        .await
        .map_err(|e| unavailable("connect", e))
}

/// A connection of the holder's own, in the transaction that holds its fence raise.
#[derive(Debug)]
struct FenceInTxn {
    conn: tokio::sync::Mutex<Option<sqlx::PgConnection>>,
    config: PgConfig,
}

#[async_trait]
impl TokenSource for FenceInTxn {
    /// Raises `key`'s counter in an open transaction of its own, committed on release.
    async fn token(&self, key: &LockKey) -> Result<FencingToken, LockError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(connect(&self.config).await?);
        }
        let conn = slot.as_mut().expect("connected above");
        let raise = format!(
            "INSERT INTO {FENCE_TABLE} AS f (key, n) VALUES ($1, 1) \
             ON CONFLICT (key) DO UPDATE SET n = f.n + 1 RETURNING n"
        );
        let result = async {
            sqlx::query("BEGIN").execute(&mut *conn).await?;
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(raise))
                .bind(key.as_str())
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match result {
            Ok(n) => Ok(FencingToken(u64::try_from(n).unwrap_or(0))),
            Err(e) => {
                *slot = None;
                Err(unavailable("fence raise", e))
            }
        }
    }

    /// Commits the fence raise (with the release, as the lock's own transaction would).
    async fn released(&self) {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_mut() {
            if sqlx::query("COMMIT").execute(&mut *c).await.is_err() {
                *slot = None;
            }
        }
    }
}
