//! The floors on MySQL (feature `testbed`, for `tenure bench --floor`), both in bare sqlx
//! on a pool of one connection per concurrent cycle (as tenure keeps a session per held
//! lock), each a try-acquire + release of a fresh key:
//!
//! - the protocol floor: `SELECT GET_LOCK(name, 0)`, then `SELECT RELEASE_LOCK(name)`;
//!   with `locking=row`, the fresh key's row inserted (`INSERT IGNORE`), then `START
//!   TRANSACTION; SELECT … FOR UPDATE NOWAIT`, then `ROLLBACK`;
//! - the same-work floor: the statements tenure's cycle sends — the key's name made safe
//!   for `GET_LOCK`, and the fencing counter bumped and the holder recorded in one
//!   autocommit statement on tenure's table (for a row lock, on a shared connection, after
//!   the lock statement found no row, the row's insert and the lock again) — with none of
//!   tenure's client-side work (the lease, its task and socket watch, owner checks).

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, Executor};
use tenure_api::backend::holder_text;
use tenure_api::{async_trait, LockError, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::client::session_pool;
use crate::names::lock_name;
use crate::sql::{
    lock_row, relock_row, Statements, GET_LOCK, LOCK_SESSION, RELEASE_LOCK, SHARED_SESSION,
};
use crate::{Locking, MySqlConfig};

/// A floor on one server.
struct MySqlFloor {
    pool: MySqlPool,
    /// Shared connections (the same-work floor's row-lock records), as tenure's.
    shared: MySqlPool,
    config: MySqlConfig,
    /// A key's row's insert (the protocol floor's row locks).
    insert_row: String,
    prefix: String,
    /// tenure's statements, for the same-work floor.
    same_work: Option<Statements>,
    ttl_ms: u64,
}

#[async_trait]
impl Locker for MySqlFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let name = format!("{}{key}", self.prefix);
        if self.config.locking == Locking::Row {
            return self.row_cycle(name.as_bytes(), held).await;
        }
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| cycle_failed("connect", e))?;
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
        if self.same_work.is_some() {
            self.record(name.as_bytes(), &mut *conn).await?;
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

impl MySqlFloor {
    /// The grant's record, as tenure sends it.
    async fn record<'c>(
        &self,
        name: &[u8],
        on: impl sqlx::Executor<'c, Database = sqlx::MySql>,
    ) -> Result<(), String> {
        let Some(sql) = &self.same_work else {
            return Ok(());
        };
        let holder = holder_text(OwnerId::random(), None);
        sqlx::query(AssertSqlSafe(sql.grant.as_str()))
            .bind(name)
            .bind(&holder)
            .bind(0u64)
            .bind(self.ttl_ms)
            .bind(&holder)
            .bind(0u64)
            .bind(self.ttl_ms)
            .execute(on)
            .await
            .map_err(|e| cycle_failed("record the grant", e))?;
        Ok(())
    }

    /// A row lock's cycle of a fresh key.
    async fn row_cycle(&self, name: &[u8], held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let rows_table = self.config.rows_table();
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| cycle_failed("connect", e))?;
        if let Some(sql) = &self.same_work {
            // tenure's: the lock finds no row, the row is inserted on a shared connection,
            // the lock is taken again, the grant recorded there.
            let batch = lock_row(&rows_table, name, None);
            sqlx::raw_sql(AssertSqlSafe(batch))
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| cycle_failed("lock", e))?;
            sqlx::query(AssertSqlSafe(sql.insert_row.as_str()))
                .bind(name)
                .execute(&self.shared)
                .await
                .map_err(|e| cycle_failed("insert the row", e))?;
            sqlx::raw_sql(AssertSqlSafe(relock_row(&rows_table, name)))
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| cycle_failed("lock again", e))?;
            self.record(name, &self.shared).await?;
        } else {
            sqlx::query(AssertSqlSafe(self.insert_row.as_str()))
                .bind(name)
                .execute(&mut *conn)
                .await
                .map_err(|e| cycle_failed("insert the row", e))?;
            sqlx::raw_sql(AssertSqlSafe(lock_row(&rows_table, name, None)))
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| cycle_failed("lock", e))?;
        }
        held();
        conn.execute("ROLLBACK")
            .await
            .map_err(|e| cycle_failed("ROLLBACK", e))?;
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
        // As tenure's lock connections: not pinged before use, their sessions as tenure's.
        let pool = session_pool(
            u32::try_from(tasks.max(1)).unwrap_or(u32::MAX),
            LOCK_SESSION,
        )
        .test_before_acquire(false)
        .connect_with(config.connect_options().clone())
        .await
        .map_err(|e| LockError::unavailable("floor connect", e))?;
        sqlx::raw_sql(AssertSqlSafe(config.schema_sql()))
            .execute(&pool)
            .await
            .map_err(|e| LockError::unavailable("floor tables", e))?;
        let statements = Statements::new(config.table(), &config.rows_table());
        let insert_row = statements.insert_row.clone();
        let same_work = same_work.then_some(statements);
        let shared = session_pool(config.pool_size, SHARED_SESSION)
            .connect_with(config.connect_options().clone())
            .await
            .map_err(|e| LockError::unavailable("floor connect", e))?;
        Ok(MySqlFloor {
            pool,
            shared,
            insert_row,
            prefix: config.prefix.clone(),
            config,
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
