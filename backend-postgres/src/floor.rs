//! The protocol floor on PostgreSQL (feature `testbed`, for `tenure bench --floor`) with
//! bare sqlx: the fresh key's row inserted (`ON CONFLICT DO NOTHING`), then `BEGIN;
//! SELECT … FOR UPDATE NOWAIT; COMMIT`; with `locking=advisory`, `BEGIN; SELECT
//! pg_try_advisory_xact_lock(hashtextextended(k, 0)); COMMIT`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tenure_api::{async_trait, LockError};
use tenure_conformance::testbed::{cycle_failed, BoxFuture, Locker};

const TABLE: &str = "tenure_bench_floor";

/// Row insert, then `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT`; or, for
/// `locking=advisory`, `BEGIN; SELECT pg_try_advisory_xact_lock(…); COMMIT`.
pub(crate) struct PgFloor {
    pool: PgPool,
    advisory: bool,
}

impl PgFloor {
    pub(crate) async fn connect(url: &str, tasks: usize) -> Result<Self, LockError> {
        let config = crate::PgConfig::from_url(url)?;
        let advisory = config.locking == crate::Locking::Advisory;
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
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(|e| cycle_failed("begin", e))?;
            let locked: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(key)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| cycle_failed("pg_try_advisory_xact_lock", e))?;
            if !locked {
                return Err(format!("advisory lock on {key:?} is held"));
            }
            held();
            return tx.commit().await.map_err(|e| cycle_failed("commit", e));
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {TABLE} (key) VALUES ($1) ON CONFLICT DO NOTHING"
        )))
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(|e| cycle_failed("insert", e))?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| cycle_failed("begin", e))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT key FROM {TABLE} WHERE key = $1 FOR UPDATE NOWAIT"
        )))
        .bind(key)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| cycle_failed("select for update nowait", e))?;
        held();
        tx.commit().await.map_err(|e| cycle_failed("commit", e))
    }
}

/// The floor for a `postgres://` URL, able to serve `tasks` concurrent cycles.
pub(crate) fn floor(
    url: &str,
    tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let floor: Arc<dyn Locker> = Arc::new(PgFloor::connect(url, tasks).await?);
        Ok(floor)
    })
}
