//! The floors on PostgreSQL (feature `testbed`, for `tenure bench --floor`), both in bare
//! sqlx, each for a try-acquire + release of a fresh key:
//!
//! - the protocol floor (`PgFloor`): the cheapest cycle — the fresh key's row inserted
//!   (`ON CONFLICT DO NOTHING`), then `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT`; with
//!   `locking=advisory`, `BEGIN; SELECT pg_try_advisory_xact_lock(hashtextextended(k, 0));
//!   COMMIT`;
//! - the same-work floor (`PgSameWork`): exactly the statements tenure's cycle sends, on
//!   tenure's tables, batched into the same round trips and sent on the same connections
//!   (the begin batch and the `COMMIT` on a lock connection kept for reuse, the fence and
//!   holder record on an autocommit pool connection), with none of tenure's client-side
//!   work (owner tracking, retries, deadlines, loss watch).
//!
//! tenure / same-work is what tenure's client costs; same-work / protocol floor is what
//! the guarantee (the holder record, the fencing token flushed before it is handed out)
//! costs the server.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Executor, Row};
use tenure_api::backend::holder_text;
use tenure_api::{async_trait, validate_ttl, LockError, LockKey, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::client::Dedicated;
use crate::records::Record;
use crate::sql::{begin_batch, LOCKED_XID};
use crate::{Locking, PgConfig, PgLock};

const TABLE: &str = "tenure_bench_floor";

/// Row insert, then `BEGIN; SELECT … FOR UPDATE NOWAIT; COMMIT`; or, for
/// `locking=advisory`, `BEGIN; SELECT pg_try_advisory_xact_lock(…); COMMIT`.
pub(crate) struct PgFloor {
    pool: PgPool,
    advisory: bool,
}

impl PgFloor {
    pub(crate) async fn connect(url: &str, tasks: usize) -> Result<Self, LockError> {
        let config = PgConfig::from_url(url)?;
        let advisory = config.locking == Locking::Advisory;
        let pool = PgPoolOptions::new()
            .max_connections(pool_size(tasks))
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
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    if is_lease(url) {
        return crate::lease_floor::floor(url, ttl);
    }
    boxed_locker(PgFloor::connect(url, tasks))
}

/// Whether `url` asks for `locking=lease` (whose floors are `lease_floor`'s).
fn is_lease(url: &str) -> bool {
    PgConfig::from_url(url).is_ok_and(|c| c.locking == Locking::Lease)
}

/// Connections for `tasks` concurrent cycles.
fn pool_size(tasks: usize) -> u32 {
    u32::try_from(tasks).unwrap_or(64).max(1)
}

/// The same-work floor: exactly the statements of tenure's `try_acquire` of a fresh key
/// and the `release` right after (`PgLock::attempt`, then the lease task's `COMMIT`), in
/// the same round trips and on the same connections, with none of tenure's client-side
/// work. It borrows from a `PgLock` of the URL (which never takes a lease) what decides
/// the server's work: the configuration, the SQL (`sql::Statements`, `sql::begin_batch`),
/// the autocommit pool and its record queue (as tenure's: `pool_size` connections, 2 by
/// default, and the records of grants that come while every one is busy share one
/// statement, as tenure's do) and the way
/// lock connections are opened (`PgLock::open`: the same startup options, and the session
/// settings and client address query once per connection).
///
/// Per cycle with row locking (the default; the default names shown), three round trips:
///
/// 1. on a lock connection (the one last put back, else a new one), one simple query:
///    `BEGIN; INSERT INTO "public"."tenure_locks" (key) VALUES (E'k') ON CONFLICT (key)
///    DO NOTHING; COMMIT; SET tcp_keepalives_idle = ⌈ttl⌉ s; BEGIN; SET LOCAL
///    idle_in_transaction_session_timeout = ttl ms; SELECT pg_current_xact_id()::text AS
///    tenure_locked_xid, pg_backend_pid() FROM "public"."tenure_locks" WHERE key = E'k'
///    FOR UPDATE NOWAIT`;
/// 2. on an autocommit pool connection, one prepared statement (shared with the
///    records of concurrent grants), committed and flushed on its own: the fence and
///    holder record, `INSERT INTO "public"."tenure_locks_holders" …
///    SELECT …, nextval('"public"."tenure_locks_fence"'), … FROM (SELECT
///    set_config('synchronous_commit', 'on', true)) AS durable, unnest($1, …, $5) … ON
///    CONFLICT (key) DO UPDATE … RETURNING key, token`, a row per grant (the key, an
///    owner text, the lock transaction's id and backend pid, the TTL);
/// 3. on the lock connection, while the lock is held: `COMMIT`; the connection is kept
///    for the next cycle.
///
/// With `locking=advisory`, the same three, the first without the row insert: `SET
/// tcp_keepalives_idle = ⌈ttl⌉ s; BEGIN; SET LOCAL idle_in_transaction_session_timeout =
/// ttl ms; SELECT pg_current_xact_id()::text AS tenure_locked_xid, pg_backend_pid() WHERE
/// pg_try_advisory_xact_lock(hashtextextended(E'"public"."tenure_locks":' || E'k', 0))`.
///
/// As for tenure, sqlx syncs a pool connection as it goes back to the pool (off the
/// cycle's path), and the pool pings one idle for a second or more before use. Not done
/// here: owner ids, leases, the loss watch, held and waiting slots, bounds on replies,
/// retries (of a stale cached connection, of a lost record).
pub(crate) struct PgSameWork {
    /// tenure's client on the URL: configuration, SQL, autocommit pool, lock connections.
    lock: PgLock,
    /// Lock connections outside any transaction, the last put back on top.
    idle: Mutex<Vec<Dedicated>>,
    /// The lease asked for, as tenure's cycle asks for it.
    ttl: Duration,
    /// The same in milliseconds, for the holder record.
    ttl_ms: i64,
    /// The holder text of every record: one owner id's, without a label.
    holder: String,
}

impl fmt::Debug for PgSameWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSameWork")
            .field("lock", &self.lock)
            .field("idle", &self.idle().len())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl PgSameWork {
    /// Connects tenure's client on `url` (creating its lock objects if missing, as tenure
    /// does).
    pub(crate) async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        validate_ttl(ttl)?;
        let lock = PgLock::with_config(PgConfig::from_url(url)?).await?;
        Ok(Self {
            lock,
            idle: Mutex::new(Vec::new()),
            ttl,
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            holder: holder_text(OwnerId::random(), None),
        })
    }

    /// The lock connections kept for reuse.
    fn idle(&self) -> MutexGuard<'_, Vec<Dedicated>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Locker for PgSameWork {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let inner = &self.lock.inner;
        let key = LockKey::new(key).map_err(|e| cycle_failed("key", e))?;
        let row_key = self.lock.row_key(&key);
        let batch = begin_batch(&inner.sql, self.ttl, None, std::slice::from_ref(&row_key));
        let cached = self.idle().pop();
        let mut conn = match cached {
            Some(conn) => conn,
            None => self
                .lock
                .open()
                .await
                .map_err(|e| cycle_failed("connect", e))?,
        };
        // Any error from here on drops `conn`, closing it: the server rolls back.
        let rows = sqlx::raw_sql(AssertSqlSafe(batch))
            .fetch_all(conn.listener())
            .await
            .map_err(|e| cycle_failed("begin", e))?;
        let Some(locked) = rows.iter().rev().find(|r| r.try_column(LOCKED_XID).is_ok()) else {
            return Err(format!("{key} is held (or its lock row is missing)"));
        };
        let xid: String = locked.try_get(0).map_err(|e| cycle_failed("lock", e))?;
        let pid: i32 = locked.try_get(1).map_err(|e| cycle_failed("lock", e))?;
        // Through tenure's record queue: the records of grants that come while every pool
        // connection is busy share one statement, as tenure's do.
        let record = Record {
            row_key,
            holder: self.holder.clone(),
            xid,
            pid,
            ttl_ms: self.ttl_ms,
        };
        match self.lock.record(record).await {
            Ok(Some(_token)) => {}
            Ok(None) => return Err(format!("the grant on {key} was not recorded")),
            Err(e) => return Err(cycle_failed("take fence", e)),
        }
        held();
        conn.listener()
            .execute("COMMIT")
            .await
            .map_err(|e| cycle_failed("commit", e))?;
        self.idle().push(conn);
        Ok(())
    }
}

/// The same-work floor for a `postgres://` URL, of leases of `ttl` (its pool sized as
/// tenure's, whatever the concurrent cycles).
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    if is_lease(url) {
        return crate::lease_floor::same_work(url, ttl);
    }
    boxed_locker(PgSameWork::connect(url, ttl))
}
