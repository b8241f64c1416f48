//! The floors on MySQL (feature `testbed`, for `tenure bench --floor`), both in bare sqlx
//! on a pool of one connection per concurrent cycle (as tenure keeps a session per held
//! lock), each a try-acquire + release of a fresh key:
//!
//! - the protocol floor: `SELECT GET_LOCK(name, 0)`, then `SELECT RELEASE_LOCK(name)`;
//! - the same-work floor: the same with what tenure's grant adds — the key's name made
//!   safe for `GET_LOCK`, and the fencing counter bumped and the holder recorded in one
//!   autocommit statement on tenure's table — with none of tenure's client-side work (the
//!   lease, its task and socket watch, owner checks).

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::AssertSqlSafe;
use tenure_api::backend::holder_text;
use tenure_api::{async_trait, LockError, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::names::lock_name;
use crate::sql::{create_table, Statements, GET_LOCK, RELEASE_LOCK};
use crate::MySqlConfig;

/// A floor on one server.
struct MySqlFloor {
    pool: MySqlPool,
    prefix: String,
    /// tenure's statements, for the same-work floor.
    same_work: Option<Statements>,
    ttl_ms: u64,
}

#[async_trait]
impl Locker for MySqlFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| cycle_failed("connect", e))?;
        let name = format!("{}{key}", self.prefix);
        let lock = match self.same_work {
            Some(_) => lock_name(&name),
            None => name.clone(),
        };
        let got: Option<i64> = sqlx::query_scalar(GET_LOCK)
            .bind(&lock)
            .bind(0.0f64)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| cycle_failed("GET_LOCK", e))?;
        if got != Some(1) {
            return Err(format!("{lock:?} is held"));
        }
        if let Some(sql) = &self.same_work {
            let holder = holder_text(OwnerId::random(), None);
            sqlx::query(AssertSqlSafe(sql.grant.as_str()))
                .bind(name.as_bytes())
                .bind(&holder)
                .bind(self.ttl_ms)
                .bind(&holder)
                .bind(self.ttl_ms)
                .execute(&mut *conn)
                .await
                .map_err(|e| cycle_failed("record the grant", e))?;
        }
        held();
        sqlx::query_scalar::<_, Option<i64>>(RELEASE_LOCK)
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| cycle_failed("RELEASE_LOCK", e))?;
        Ok(())
    }
}

fn connect(
    url: &str,
    tasks: usize,
    ttl: Duration,
    same_work: bool,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(async move {
        let config = MySqlConfig::from_url(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(u32::try_from(tasks.max(1)).unwrap_or(u32::MAX))
            // As tenure's cached lock connections: not pinged before use.
            .test_before_acquire(false)
            .connect_with(config.connect_options().clone())
            .await
            .map_err(|e| LockError::unavailable("floor connect", e))?;
        let same_work = match same_work {
            true => {
                sqlx::raw_sql(AssertSqlSafe(create_table(config.table())))
                    .execute(&pool)
                    .await
                    .map_err(|e| LockError::unavailable("floor table", e))?;
                Some(Statements::new(config.table()))
            }
            false => None,
        };
        Ok(MySqlFloor {
            pool,
            prefix: config.prefix.clone(),
            same_work,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        })
    })
}

/// The protocol floor for a `mysql://` URL.
pub(crate) fn floor(
    url: &str,
    tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, tasks, ttl, false)
}

/// The same-work floor for a `mysql://` URL.
pub(crate) fn same_work(
    url: &str,
    tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, tasks, ttl, true)
}
