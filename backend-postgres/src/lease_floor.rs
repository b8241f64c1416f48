//! The floors of `locking=lease` (feature `testbed`, for `tenure bench --floor`), both in
//! bare sqlx on a pool of the URL's `pool_size` connections (tenure's), each for a
//! try-acquire + release of a fresh key:
//!
//! - the protocol floor (`LeaseFloor`): the least a lease row needs — `INSERT … ON
//!   CONFLICT (key) DO UPDATE … WHERE until <= clock_timestamp() RETURNING 1`, then an
//!   `UPDATE` that ends it; no owner, no token, no durability forced;
//! - the same-work floor (`LeaseSameWork`): tenure's own two statements
//!   (`sql::LeaseStatements`: the acquire with its fence `nextval` and flushed commit, the
//!   owner- and token-checked release with its `pg_notify`) on tenure's own pool, with
//!   none of tenure's client-side work.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};
use tenure_api::{async_trait, LockError, LockKey, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::{PgConfig, PgLock};

const TABLE: &str = "tenure_bench_lease_floor";

/// `INSERT … ON CONFLICT … WHERE until <= now RETURNING`, then `UPDATE … SET until =
/// '-infinity'`.
pub(crate) struct LeaseFloor {
    pool: PgPool,
    ttl_ms: i64,
}

impl LeaseFloor {
    async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        let config = PgConfig::from_url(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size)
            .connect_with(config.connect_options().clone())
            .await
            .map_err(|e| LockError::unavailable("floor connect", e))?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (key text PRIMARY KEY, until timestamptz \
             NOT NULL)"
        )))
        .execute(&pool)
        .await
        .map_err(|e| LockError::unavailable("floor table", e))?;
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(Self { pool, ttl_ms })
    }
}

#[async_trait]
impl Locker for LeaseFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let granted = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {TABLE} AS t VALUES ($1, clock_timestamp() + $2 * interval '1 \
             millisecond') ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until \
             WHERE t.until <= clock_timestamp() RETURNING 1"
        )))
        .bind(key)
        .bind(self.ttl_ms)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| cycle_failed("acquire", e))?;
        if granted.is_none() {
            return Err(format!("{key} is held"));
        }
        held();
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {TABLE} SET until = '-infinity' WHERE key = $1"
        )))
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(|e| cycle_failed("release", e))?;
        Ok(())
    }
}

/// tenure's two lease statements, bare, on tenure's pool.
pub(crate) struct LeaseSameWork {
    lock: PgLock,
    ttl_ms: i64,
    owner: String,
}

impl LeaseSameWork {
    async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        let lock = PgLock::with_config(PgConfig::from_url(url)?).await?;
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let owner = OwnerId::random().to_string();
        Ok(Self {
            lock,
            ttl_ms,
            owner,
        })
    }
}

#[async_trait]
impl Locker for LeaseSameWork {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let sql = &self.lock.inner.sql.lease;
        let key = LockKey::new(key).map_err(|e| cycle_failed("key", e))?;
        let row_key = self.lock.row_key(&key);
        let mut conn = self
            .lock
            .pooled()
            .await
            .map_err(|e| cycle_failed("pool", e))?;
        let row = sqlx::query(AssertSqlSafe(sql.acquire.as_str()))
            .bind(&row_key)
            .bind(&self.owner)
            .bind(None::<&str>)
            .bind(self.ttl_ms)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| cycle_failed("acquire", e))?;
        let token: Option<i64> = row.try_get(0).map_err(|e| cycle_failed("acquire", e))?;
        let Some(token) = token else {
            return Err(format!("{key} is held"));
        };
        drop(conn);
        held();
        let mut conn = self
            .lock
            .pooled()
            .await
            .map_err(|e| cycle_failed("pool", e))?;
        sqlx::query(AssertSqlSafe(sql.release.as_str()))
            .bind(&row_key)
            .bind(&self.owner)
            .bind(token)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| cycle_failed("release", e))?;
        Ok(())
    }
}

/// The protocol floor of a `locking=lease` URL.
pub(crate) fn floor(url: &str, ttl: Duration) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(LeaseFloor::connect(url, ttl))
}

/// The same-work floor of a `locking=lease` URL.
pub(crate) fn same_work(
    url: &str,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(LeaseSameWork::connect(url, ttl))
}
