//! # tenure-postgres
//!
//! A [`DistributedLock`] on one PostgreSQL server (14 or later): a row lock held by an
//! open transaction on a **dedicated connection** per lease, a committed sequence for the
//! fencing token, and the server's `idle_in_transaction_session_timeout` as the lease.
//!
//! ## Protocol
//!
//! * **Acquire (try).** On a dedicated connection: `BEGIN; SET LOCAL
//!   idle_in_transaction_session_timeout = <ttl>`, then
//!   `SELECT … FROM <table> WHERE key = $1 FOR UPDATE NOWAIT`. SQLSTATE `55P03` means
//!   another transaction holds the row: `Ok(None)`. If the key has no row yet, it is
//!   inserted in **autocommit** on another connection (`INSERT … ON CONFLICT DO NOTHING`,
//!   so concurrent first acquirers never block on each other's uncommitted insert) and the
//!   `SELECT` runs again in the same transaction (READ COMMITTED sees the new row).
//! * **Acquire (wait).** The same with `SET LOCAL lock_timeout = <remaining wait>` and a
//!   blocking `FOR UPDATE`: the server queues the waiters and wakes the next one when the
//!   holder's transaction ends — FIFO, no polling. A lock timeout is
//!   [`LockError::Timeout`].
//! * **Fencing token.** After the row lock is granted, `nextval(<table>_fence)` is taken
//!   **in autocommit on another connection**, in the same statement that records the holder
//!   (see *Inspect*); the statement's commit is flushed (`synchronous_commit = on` is set on
//!   those connections) before the reply, so no crash can hand the same value out twice,
//!   and a token is never reused even if its holder's transaction later dies. A counter
//!   column updated *inside* the lock transaction would be unsafe: when a holder crashes
//!   or is cut off, its transaction rolls back, the counter reverts, and the next holder
//!   is handed the very token the crashed holder may already have written with — two
//!   holders, one token, and the fenced resource cannot tell them apart.
//! * **Lease.** The held transaction sits idle; if the holder says nothing for `ttl`, the
//!   server's `idle_in_transaction_session_timeout` ends the session, which rolls the
//!   transaction back and frees the row. `extend` runs a statement on the held transaction
//!   (`set_config('idle_in_transaction_session_timeout', ttl, true)` — which also re-arms
//!   the timer) and checks the transaction id is unchanged; any failure is
//!   [`LockError::LeaseLost`], since a broken connection can never get its transaction
//!   back. Server-side TCP keepalives (`tcp_keepalives_*`) and
//!   `client_connection_check_interval` are set on every dedicated connection, so the
//!   server also notices a vanished client while it waits in the lock queue. (sqlx exposes
//!   no client-side socket options; the client bounds every statement with
//!   `command_timeout_ms` instead.)
//! * **Release.** `COMMIT` on the dedicated connection, which then goes back to a small
//!   cache of clean connections (or is closed).
//! * **Inspect.** The lock row's own columns cannot carry the holder: an `UPDATE` inside the
//!   held transaction is invisible to everyone else until it commits, and an `UPDATE` from
//!   elsewhere would block on the row lock. So the grant is recorded in a side table
//!   `<table>_holders` (key, owner, token, transaction id, backend pid, ttl) written in
//!   autocommit together with the fence. [`PgLock::inspect`] reports the recorded holder
//!   only while its transaction is still running (`pg_xact_status(xid) = 'in progress'`
//!   — exact, with no probing lock that could disturb acquirers), and the time left before
//!   the server's idle timer frees it, computed from `pg_stat_activity.state_change` (this
//!   needs the same role as the holder or `pg_read_all_stats`; otherwise `remaining` is
//!   `None`).
//!
//! Dedicated connections are kept in the backend keyed by owner id, so [`Lease`] stays
//! plain data. Their number is bounded by `max_held` (held locks plus acquires in
//! progress); past it, acquires fail at once with a [`LockError::Backend`] saying so.
//!
//! **Guarantees** ([`PgLock::capabilities`]): a single node; expiry by the server ending
//! the connection/transaction; FIFO push wake-ups from the server's lock queue; fencing
//! from a durable sequence that survives crashes and restarts. Mutual exclusion itself
//! does not depend on clocks: the row lock is held exactly as long as the transaction.
//!
//! ## Schema
//!
//! Created on connect when `migrate=true` (the default), or by [`PgLock::migrate`]:
//! idempotent and safe to run concurrently (serialised by a transaction-scoped advisory
//! lock).
//!
//! ```sql
//! CREATE UNLOGGED TABLE <schema>.<table> (key text PRIMARY KEY, created_at timestamptz …);
//! CREATE TABLE <schema>.<table>_holders (key text PRIMARY KEY, owner text, token bigint,
//!     xid xid8, pid int, ttl_ms bigint, granted_at timestamptz);
//! CREATE SEQUENCE <schema>.<table>_fence AS bigint MINVALUE 1 NO CYCLE;
//! ```
//!
//! The lock table is `UNLOGGED`: its rows only anchor row locks (which die with the
//! server anyway), so it needs no WAL; after a crash it is empty and rows are re-inserted
//! on demand. The holder table and the sequence are logged.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_api::LockError> {
//! use std::time::Duration;
//! use tenure_api::{DistributedLock, LockKey};
//! let lock = tenure_postgres::PgLock::connect("postgres://app:secret@db:5432/app?prefix=jobs/").await?;
//! if let Some(lease) = lock.try_acquire(&LockKey::new("nightly")?, Duration::from_secs(30)).await? {
//!     // … send lease.token() with every write to the protected resource …
//!     lock.release(lease).await?;
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admin;
mod config;
mod fenced;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, Row};
use tenure_api::{
    default_drift, validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind,
    Fairness, FencingKind, FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey,
    OwnerId, ReleaseOutcome, Replication, WaitKind,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use config::{redact, validate_ident, PgConfig};
pub use fenced::{FencedTable, FencedWrite};

/// SQLSTATE `lock_not_available`: `NOWAIT` found the row locked, or `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// How long a clean dedicated connection may sit in the reuse cache.
const IDLE_REUSE_LIMIT: Duration = Duration::from_secs(30);
/// Interval at which the server checks that a client is still connected while it runs a
/// statement (including a lock wait).
const CLIENT_CHECK_INTERVAL_MS: u32 = 1000;
/// Largest value Postgres accepts for a millisecond timeout setting.
const MAX_TIMEOUT_MS: u128 = i32::MAX as u128;

/// A lock service on one Postgres server. Cheap to clone (`Arc` inside); clones share the
/// held connections. Dropping the last clone closes every dedicated connection, which
/// frees every lock it held at once.
#[derive(Clone)]
pub struct PgLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: PgConfig,
    sql: Statements,
    /// Autocommit connections: row insert, fence + holder record, inspect, migration.
    pool: PgPool,
    /// Options for dedicated connections (keepalives, client check interval).
    dedicated: PgConnectOptions,
    /// Held leases by owner id.
    held: Mutex<HashMap<OwnerId, Arc<Entry>>>,
    /// One permit per dedicated connection in use.
    slots: Arc<Semaphore>,
    /// Clean dedicated connections (not in a transaction) for reuse.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
}

/// A held lease: what identifies the grant, and its live resources.
struct Entry {
    key: LockKey,
    token: FencingToken,
    /// The holding transaction's id (`xid8` as text).
    xid: String,
    held: tokio::sync::Mutex<Held>,
}

/// A held lease's live resources.
struct Held {
    /// The connection whose open transaction holds the row lock; `None` once broken.
    conn: Option<PgConnection>,
    ttl: Duration,
    _slot: OwnedSemaphorePermit,
}

/// SQL text built once from the validated, quoted names.
#[derive(Debug)]
struct Statements {
    lock_nowait: String,
    lock_wait: String,
    ensure_row: String,
    record: String,
    inspect: String,
    update_ttl: String,
    migrate: String,
}

impl Statements {
    fn new(config: &PgConfig) -> Self {
        let (table, holders, fence) = (
            config.lock_table(),
            config.holder_table(),
            config.fence_sequence(),
        );
        let lock = format!(
            "SELECT pg_current_xact_id()::text, pg_backend_pid() FROM {table} \
             WHERE key = $1 FOR UPDATE"
        );
        Self {
            lock_nowait: format!("{lock} NOWAIT"),
            lock_wait: lock,
            ensure_row: format!(
                "INSERT INTO {table} (key) VALUES ($1) ON CONFLICT (key) DO NOTHING"
            ),
            // Only the live holder of the row lock records itself, and never over a holder
            // whose transaction is still running (a late record from a dead holder loses).
            record: format!(
                "INSERT INTO {holders} AS h (key, owner, token, xid, pid, ttl_ms, granted_at) \
                 SELECT $1, $2, nextval('{fence}'), $3::text::xid8, $4, $5, clock_timestamp() \
                 WHERE pg_xact_status($3::text::xid8) = 'in progress' \
                 ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, \
                 xid = EXCLUDED.xid, pid = EXCLUDED.pid, ttl_ms = EXCLUDED.ttl_ms, \
                 granted_at = EXCLUDED.granted_at \
                 WHERE pg_xact_status(h.xid) IS DISTINCT FROM 'in progress' \
                 RETURNING token"
            ),
            inspect: format!(
                "SELECT h.owner, h.token, CASE a.state \
                 WHEN 'idle in transaction' THEN GREATEST(h.ttl_ms - \
                 (EXTRACT(EPOCH FROM clock_timestamp() - a.state_change) * 1000)::bigint, 0) \
                 WHEN 'active' THEN h.ttl_ms END \
                 FROM {holders} h LEFT JOIN pg_stat_activity a ON a.pid = h.pid \
                 WHERE h.key = $1 AND pg_xact_status(h.xid) = 'in progress'"
            ),
            update_ttl: format!(
                "UPDATE {holders} SET ttl_ms = $2 WHERE key = $1 AND xid = $3::text::xid8"
            ),
            migrate: format!(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, \
                 created_at timestamptz NOT NULL DEFAULT now()); \
                 CREATE TABLE IF NOT EXISTS {holders} (key text PRIMARY KEY, owner text NOT NULL, \
                 token bigint NOT NULL, xid xid8 NOT NULL, pid integer NOT NULL, \
                 ttl_ms bigint NOT NULL, granted_at timestamptz NOT NULL); \
                 CREATE SEQUENCE IF NOT EXISTS {fence} AS bigint MINVALUE 1 NO CYCLE"
            ),
        }
    }
}

impl fmt::Debug for PgLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLock")
            .field("config", &self.inner.config)
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
}

/// What the locking `SELECT` found.
enum Locked {
    /// The row is ours: the transaction id and backend pid.
    Granted { xid: String, pid: i32 },
    /// Another transaction holds it (`NOWAIT`), or `lock_timeout` ran out.
    Busy,
}

impl PgLock {
    /// Connects to the server named by a `postgres://` URL (see [`PgConfig`]) and, unless
    /// `migrate=false`, creates the lock objects if they are missing.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind (a migration in flight is rolled back).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(PgConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`connect`](Self::connect).
    pub async fn with_config(config: PgConfig) -> Result<Self, LockError> {
        let base = config.connect_options().clone();
        let named = |o: PgConnectOptions| {
            if o.get_application_name().is_some() {
                o
            } else {
                o.application_name("tenure")
            }
        };
        // Pool connections commit the fence: make sure that commit is flushed before it
        // is acknowledged, whatever the role's or database's default.
        let pool_options = named(base.clone()).options([("synchronous_commit", "on")]);
        let dedicated = named(base).options([
            ("tcp_keepalives_idle", "10".to_string()),
            ("tcp_keepalives_interval", "3".to_string()),
            ("tcp_keepalives_count", "3".to_string()),
            (
                "client_connection_check_interval",
                CLIENT_CHECK_INTERVAL_MS.to_string(),
            ),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size)
            .min_connections(0)
            .acquire_timeout(config.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .test_before_acquire(true)
            .connect_lazy_with(pool_options);
        let lock = Self {
            inner: Arc::new(Inner {
                sql: Statements::new(&config),
                slots: Arc::new(Semaphore::new(config.max_held)),
                config,
                pool,
                dedicated,
                held: Mutex::new(HashMap::new()),
                idle: Mutex::new(Vec::new()),
            }),
        };
        if lock.inner.config.migrate {
            lock.migrate().await?;
        } else {
            // Fail early if the server cannot be reached.
            lock.bounded("connect", lock.inner.pool.acquire()).await?;
        }
        Ok(lock)
    }

    /// Creates the schema (if missing), the lock table, the holder table and the fence
    /// sequence, each only if missing. Idempotent and safe to run from many clients at
    /// once: the DDL runs in one transaction under `pg_advisory_xact_lock`, because
    /// `CREATE … IF NOT EXISTS` alone races (two sessions can both see "missing").
    ///
    /// # Cancel safety
    /// Cancel-safe: the transaction is rolled back if the future is dropped.
    pub async fn migrate(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let work = async {
            let mut tx = self.inner.pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(format!("tenure-postgres:{}", config.lock_table()))
                .execute(&mut *tx)
                .await?;
            let schema_exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(config.schema())
                    .fetch_one(&mut *tx)
                    .await?;
            if !schema_exists {
                // The name passed `validate_ident` and is quoted.
                let ddl = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", config.schema());
                tx.execute(sqlx::raw_sql(AssertSqlSafe(ddl))).await?;
            }
            tx.execute(sqlx::raw_sql(AssertSqlSafe(self.inner.sql.migrate.clone())))
                .await?;
            tx.commit().await
        };
        self.bounded("migrate", work).await
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &PgConfig {
        &self.inner.config
    }

    /// The row key holding `key`'s lock: the configured prefix and the key.
    pub fn row_key(&self, key: &LockKey) -> String {
        format!("{}{}", self.inner.config.prefix, key)
    }

    /// Number of leases this client holds now.
    pub fn held_count(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Ends every held lease (their transactions roll back, freeing the locks) and closes
    /// all connections. Further calls fail with [`LockError::Unavailable`].
    ///
    /// # Cancel safety
    /// Cancel-safe: the held connections are already closed when the first await starts.
    pub async fn close(&self) {
        let held: Vec<_> = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, held)| held)
            .collect();
        for entry in held {
            if let Ok(mut held) = entry.held.try_lock() {
                held.conn = None;
            }
        }
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.inner.pool.close().await;
    }

    /// The autocommit pool (for helpers such as [`FencedTable`]).
    pub(crate) fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Runs `future` for at most `command_timeout`, mapping errors.
    async fn bounded<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, LockError> {
        bounded_for(
            &self.inner.config,
            self.inner.config.command_timeout,
            what,
            future,
        )
        .await
    }

    /// A dedicated connection with an open transaction whose idle timeout is `ttl` and,
    /// when `lock_timeout` is given, whose lock waits are bounded by it.
    async fn begin(
        &self,
        ttl: Duration,
        lock_timeout: Option<Duration>,
    ) -> Result<PgConnection, LockError> {
        let mut batch = format!(
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}",
            timeout_ms(ttl)
        );
        if let Some(wait) = lock_timeout {
            batch.push_str(&format!("; SET LOCAL lock_timeout = {}", timeout_ms(wait)));
        }
        let config = &self.inner.config;
        if let Some(mut conn) = self.pop_idle() {
            let started = bounded_for(
                config,
                config.command_timeout,
                "begin",
                conn.execute(sqlx::raw_sql(AssertSqlSafe(batch.clone()))),
            )
            .await;
            if started.is_ok() {
                return Ok(conn);
            }
            // A stale cached connection (e.g. the server restarted): the others are no
            // better, so drop them all and open a fresh one.
            self.inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
        let mut conn = bounded_for(
            config,
            config.connect_timeout,
            "connect",
            PgConnection::connect_with(&self.inner.dedicated),
        )
        .await?;
        bounded_for(
            config,
            config.command_timeout,
            "begin",
            conn.execute(sqlx::raw_sql(AssertSqlSafe(batch))),
        )
        .await?;
        Ok(conn)
    }

    fn pop_idle(&self) -> Option<PgConnection> {
        let mut idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < IDLE_REUSE_LIMIT {
                return Some(conn);
            }
        }
        None
    }

    /// Returns a connection known to be outside any transaction to the reuse cache, or
    /// closes it.
    async fn recycle(&self, conn: PgConnection) {
        let rejected = {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if idle.len() < self.inner.config.idle_connections {
                idle.push((conn, Instant::now()));
                None
            } else {
                Some(conn)
            }
        };
        if let Some(conn) = rejected {
            let _ = tokio::time::timeout(self.inner.config.command_timeout, conn.close()).await;
        }
    }

    /// Ends a transaction that holds nothing and recycles its connection; on failure the
    /// connection is dropped (closing it rolls the transaction back on the server).
    async fn abandon(&self, mut conn: PgConnection) {
        let limit = self.inner.config.command_timeout;
        if let Ok(Ok(_)) = tokio::time::timeout(limit, conn.execute("ROLLBACK")).await {
            self.recycle(conn).await;
        }
    }

    /// Runs the locking `SELECT`; inserts the key's row (autocommit) once if it is missing.
    async fn lock_row(
        &self,
        conn: &mut PgConnection,
        row_key: &str,
        wait: Option<Duration>,
        deadline: Instant,
    ) -> Result<Locked, LockError> {
        let config = &self.inner.config;
        let sql = match wait {
            None => &self.inner.sql.lock_nowait,
            Some(_) => &self.inner.sql.lock_wait,
        };
        for attempt in 0..2 {
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
                + config.command_timeout;
            let result = tokio::time::timeout(
                limit,
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(row_key)
                    .fetch_optional(&mut *conn),
            )
            .await;
            match result {
                Err(_) => {
                    return Err(LockError::Unavailable {
                        message: format!(
                            "lock on {}: no reply within {limit:?}",
                            config.endpoint()
                        ),
                        source: None,
                    })
                }
                Ok(Ok(Some(row))) => {
                    let xid: String = row.try_get(0).map_err(|e| map_err(config, "lock", e))?;
                    let pid: i32 = row.try_get(1).map_err(|e| map_err(config, "lock", e))?;
                    return Ok(Locked::Granted { xid, pid });
                }
                Ok(Ok(None)) if attempt == 0 => {
                    // First use of this key: create its row in autocommit, outside our
                    // transaction, then look again (a new statement sees the new row).
                    self.bounded(
                        "insert lock row",
                        sqlx::query(AssertSqlSafe(self.inner.sql.ensure_row.as_str()))
                            .bind(row_key)
                            .execute(&self.inner.pool),
                    )
                    .await?;
                    if let Some(_wait) = wait {
                        let remaining = deadline.saturating_duration_since(Instant::now());
                        let set = format!("SET LOCAL lock_timeout = {}", timeout_ms(remaining));
                        self.bounded(
                            "set lock_timeout",
                            conn.execute(sqlx::raw_sql(AssertSqlSafe(set))),
                        )
                        .await?;
                    }
                }
                Ok(Ok(None)) => {
                    return Err(LockError::backend(format!(
                        "the lock row for {row_key:?} vanished while acquiring"
                    )))
                }
                Ok(Err(e)) if sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    return Ok(Locked::Busy)
                }
                Ok(Err(e)) => return Err(map_err(config, "lock", e)),
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    /// One attempt: `wait = None` is `NOWAIT`; `Some(w)` waits in the server's queue for up
    /// to `w`. `Ok(None)`: held by another (or the wait ran out).
    async fn attempt(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Lease>, LockError> {
        let config = &self.inner.config;
        let slot = self.inner.slots.clone().try_acquire_owned().map_err(|_| {
            LockError::backend(format!(
                "this client already uses max_held={} dedicated connections (held locks and \
                 acquires in progress); release a lock or raise max_held",
                config.max_held
            ))
        })?;
        let row_key = self.row_key(key);
        let started = Instant::now();
        let deadline = started + wait.unwrap_or_default();
        let mut conn = self.begin(ttl, wait).await?;
        // The server's idle timer starts after the locking statement completes, so a
        // deadline counted from its sending is conservative.
        let mut sent = Instant::now();
        let (xid, pid) = match self.lock_row(&mut conn, &row_key, wait, deadline).await? {
            Locked::Granted { xid, pid } => (xid, pid),
            Locked::Busy => {
                self.abandon(conn).await;
                return Ok(None);
            }
        };
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let token: Option<i64> = self
            .bounded(
                "take fence",
                sqlx::query_scalar(AssertSqlSafe(self.inner.sql.record.as_str()))
                    .bind(&row_key)
                    .bind(owner.to_string())
                    .bind(&xid)
                    .bind(pid)
                    .bind(ttl_ms)
                    .fetch_optional(&self.inner.pool),
            )
            .await?;
        let Some(token) = token else {
            // Our transaction ended between the lock and the record (e.g. its backend was
            // terminated): dropping `conn` makes sure nothing of it remains.
            return Err(LockError::Unavailable {
                message: format!(
                    "the lock connection to {} ended while the grant was being recorded",
                    config.endpoint()
                ),
                source: None,
            });
        };
        let token = u64::try_from(token)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| LockError::backend(format!("fence sequence returned {token}")))?;
        if sent.elapsed() > ttl / 8 {
            // We queued for a while: count the lease from a statement sent now rather than
            // from the start of the wait.
            sent = Instant::now();
            refresh(&mut conn, ttl, &xid, config).await?;
        }
        let lease = Lease::new(
            key.clone(),
            owner,
            FencingToken(token),
            sent,
            ttl,
            default_drift(ttl),
        )
        .with_handle(LeaseHandle {
            path: row_key,
            id: i64::from(pid),
            revision: xid.parse().unwrap_or_default(),
        });
        let entry = Entry {
            key: key.clone(),
            token: FencingToken(token),
            xid,
            held: tokio::sync::Mutex::new(Held {
                conn: Some(conn),
                ttl,
                _slot: slot,
            }),
        };
        // No await between here and the return: once in the map, the lease is ours.
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner, Arc::new(entry));
        Ok(Some(lease))
    }

    /// The held entry for `lease`, if this client holds exactly that grant.
    fn entry(&self, lease: &Lease, remove: bool) -> Option<Arc<Entry>> {
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = held.get(&lease.owner())?.clone();
        if entry.key != *lease.key() || entry.token != lease.token() {
            return None;
        }
        if remove {
            held.remove(&lease.owner());
        }
        Some(entry)
    }

    fn forget(&self, owner: OwnerId, entry: &Arc<Entry>) {
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if held.get(&owner).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            held.remove(&owner);
        }
    }
}

/// Re-arms the held transaction's idle timer with `ttl` and checks it is still the
/// transaction `xid`. Any failure means the lease is gone.
async fn refresh(
    conn: &mut PgConnection,
    ttl: Duration,
    xid: &str,
    config: &PgConfig,
) -> Result<(), LockError> {
    let result = tokio::time::timeout(
        config.command_timeout,
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
             pg_current_xact_id_if_assigned()::text",
        )
        .bind(timeout_ms(ttl).to_string())
        .fetch_one(conn),
    )
    .await;
    match result {
        Ok(Ok((_, Some(current)))) if current == xid => Ok(()),
        Ok(Ok((_, current))) => Err(LockError::lost(format!(
            "the holding transaction {xid} has ended (now {current:?})"
        ))),
        Ok(Err(e)) => Err(LockError::lost(format!(
            "the holding connection to {} is gone: {}",
            config.endpoint(),
            map_err(config, "extend", e)
        ))),
        Err(_) => Err(LockError::lost(format!(
            "the holding connection to {} did not answer within {:?}",
            config.endpoint(),
            config.command_timeout
        ))),
    }
}

#[async_trait]
impl DistributedLock for PgLock {
    /// # Cancel safety
    /// Cancel-safe: until the lease is returned, its dedicated connection is owned by the
    /// future; dropping the future closes the connection, and the server rolls the
    /// transaction back and frees the row at once. A fence value may be consumed (tokens
    /// may skip numbers; they never repeat).
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.attempt(key, OwnerId::random(), ttl, None).await
    }

    /// Waits in the server's lock queue (blocking `FOR UPDATE` under `lock_timeout`), so
    /// waiters are woken in arrival order when the holder's transaction ends, with no
    /// polling. Transient connection errors are retried with backoff within the wait.
    ///
    /// # Cancel safety
    /// As `try_acquire`: a dropped wait closes its connection. The server notices the
    /// closed socket within `client_connection_check_interval` (1 s) — or, if the lock is
    /// granted first, as soon as it answers — and rolls back: no ghost lock, no ghost
    /// waiter beyond that.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let mut failures = 0u32;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let wait = (!remaining.is_zero()).then_some(remaining);
            match self.attempt(key, owner, opts.ttl, wait).await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => {
                    return Err(LockError::Timeout {
                        waited: started.elapsed(),
                    })
                }
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    failures = failures.saturating_add(1);
                    let pause = opts
                        .backoff
                        .delay(failures)
                        .min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// # Cancel safety
    /// `lease` is unchanged if the future is dropped; the statement may or may not have
    /// re-armed the server's timer (which only lengthens our own grant). The connection
    /// stays held.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let not_ours = || {
            LockError::lost(format!(
                "`{}` is not held by {} through this client",
                lease.key(),
                lease.owner()
            ))
        };
        let entry = self.entry(lease, false).ok_or_else(not_ours)?;
        let mut held = entry.held.lock().await;
        let config = &self.inner.config;
        let sent = Instant::now();
        let xid = entry.xid.as_str();
        let Some(conn) = held.conn.as_mut() else {
            drop(held);
            self.forget(lease.owner(), &entry);
            return Err(LockError::lost("the holding connection was already lost"));
        };
        if let Err(e) = refresh(conn, ttl, xid, config).await {
            held.conn = None; // closing it ends whatever is left of the transaction
            drop(held);
            self.forget(lease.owner(), &entry);
            return Err(e);
        }
        if held.ttl != ttl {
            held.ttl = ttl;
            // Keep inspect's remaining time right; the lease is extended either way.
            let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            let _ = self
                .bounded(
                    "record ttl",
                    sqlx::query(AssertSqlSafe(self.inner.sql.update_ttl.as_str()))
                        .bind(lease.handle().path.as_str())
                        .bind(ttl_ms)
                        .bind(xid)
                        .execute(&self.inner.pool),
                )
                .await;
        }
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    /// `COMMIT` on the held transaction. [`ReleaseOutcome::NotHeld`] if this client does not
    /// hold the lease or the server had already ended its transaction (expired, killed);
    /// [`LockError::Unavailable`] if the server did not answer (the connection is closed,
    /// so the server frees the lock when it notices, at the latest `ttl` after the last
    /// renewal).
    ///
    /// # Cancel safety
    /// The lease is forgotten at the first poll; if the future is dropped before `COMMIT`
    /// completes, the connection is closed and the server rolls back, freeing the lock.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(entry) = self.entry(&lease, true) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let mut held = entry.held.lock().await;
        let Some(mut conn) = held.conn.take() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let config = &self.inner.config;
        match tokio::time::timeout(config.command_timeout, conn.execute("COMMIT")).await {
            Ok(Ok(_)) => {
                drop(held);
                self.recycle(conn).await;
                Ok(ReleaseOutcome::Released)
            }
            // The server ended the session (idle timeout, terminated, restarted): the
            // transaction was rolled back and the lock freed before we asked.
            Ok(Err(_)) => Ok(ReleaseOutcome::NotHeld),
            Err(_) => Err(LockError::Unavailable {
                message: format!(
                    "release on {}: no reply within {:?}; the connection was closed, so the \
                     server frees the lock when it notices",
                    config.endpoint(),
                    config.command_timeout
                ),
                source: None,
            }),
        }
    }

    /// The holder recorded for `key` whose transaction is still running, with its owner,
    /// token, and — when `pg_stat_activity` shows the holder's session — the time left
    /// before the server's idle timer frees it.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let row = self
            .bounded(
                "inspect",
                sqlx::query(AssertSqlSafe(self.inner.sql.inspect.as_str()))
                    .bind(self.row_key(key))
                    .fetch_optional(&self.inner.pool),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let config = &self.inner.config;
        let owner: String = row.try_get(0).map_err(|e| map_err(config, "inspect", e))?;
        let token: i64 = row.try_get(1).map_err(|e| map_err(config, "inspect", e))?;
        let remaining: Option<i64> = row.try_get(2).map_err(|e| map_err(config, "inspect", e))?;
        Ok(Some(HolderInfo {
            owner: OwnerId::parse(&owner)?,
            token: u64::try_from(token).ok().map(FencingToken),
            remaining: remaining
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        }))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "postgres",
            fencing: FencingKind::Sequence,
            expiry: ExpiryKind::ConnectionTransaction,
            replication: Replication::SingleNode,
            wait: WaitKind::Push,
            fairness: Fairness::Fifo,
            failures_tolerated: 0,
            clock_dependent: false,
        }
    }
}

/// A duration as whole milliseconds for a Postgres timeout setting: at least 1 (0 would
/// mean "no timeout"), at most `i32::MAX`.
fn timeout_ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, MAX_TIMEOUT_MS) as u64
}

/// Runs `future` for at most `limit`, mapping errors; running out is `Unavailable`.
async fn bounded_for<T>(
    config: &PgConfig,
    limit: Duration,
    what: &str,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(limit, future).await {
        Ok(result) => result.map_err(|e| map_err(config, what, e)),
        Err(_) => Err(LockError::Unavailable {
            message: format!("{what} on {}: no reply within {limit:?}", config.endpoint()),
            source: None,
        }),
    }
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// Connection-level failures are `Unavailable`; authentication and unknown databases are
/// `Config`; anything else is `Backend`. Messages name the endpoint, never the password.
pub(crate) fn map_err(config: &PgConfig, what: &str, error: sqlx::Error) -> LockError {
    let message = format!("{what} on {}: {error}", config.endpoint());
    let code = sqlstate(&error);
    let class = code.as_deref().map(|c| &c[..2.min(c.len())]);
    let unavailable = matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
    ) || matches!(class, Some("08"))
        || matches!(
            code.as_deref(),
            Some("57P01" | "57P02" | "57P03" | "53300" | "25P03" | "40P01")
        );
    if unavailable {
        return LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        };
    }
    if matches!(error, sqlx::Error::Configuration(_) | sqlx::Error::Tls(_))
        || matches!(class, Some("28"))
        || code.as_deref() == Some("3D000")
    {
        return LockError::Config(message);
    }
    LockError::Backend {
        message,
        source: Some(Box::new(error)),
    }
}
