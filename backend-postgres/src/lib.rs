#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod fenced;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, Row};
use tenure_api::{
    default_drift, validate_ttl, AcquireOptions, Backend, Capabilities, DistributedLock, Driver,
    ExpiryKind, Fairness, FencingKind, FencingToken, HolderInfo, Lease, LeaseDropped, LeaseHandle,
    LeaseTie, LockError, LockKey, LossNotice, OwnerId, ReleaseOutcome, Replication, WaitKind,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

pub use config::{redact, validate_ident, Locking, PgConfig};
pub use fenced::{FencedTable, FencedWrite};

/// SQLSTATE `lock_not_available`: `NOWAIT` found the row locked, or `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// Whether a connect error is the server refusing `client_connection_check_interval`:
/// SQLSTATE 22023 (`invalid value for parameter "client_connection_check_interval"`, on a
/// platform that cannot detect closed sockets) or 42704 (a server that does not know it).
fn client_check_rejected(code: Option<&str>, message: &str) -> bool {
    matches!(code, Some("22023" | "42704")) && message.contains("client_connection_check_interval")
}

/// SQLSTATE `too_many_connections`: the server (`max_connections`), role or database is out
/// of connection slots.
const TOO_MANY_CONNECTIONS: &str = "53300";
/// A pool connection idle for longer is pinged before use. sqlx pings every connection as
/// it goes back to the pool, so one used moments ago needs no second round trip.
const POOL_PING_AFTER_IDLE: Duration = Duration::from_secs(1);
/// For how long after a pool connection failed every pool connection is pinged before use.
const POOL_PING_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// When something last failed, readable from the pool's `before_acquire` hook.
#[derive(Debug)]
struct RecentFailure {
    epoch: Instant,
    /// Milliseconds after `epoch` plus one; 0 = never.
    at: AtomicU64,
}

impl RecentFailure {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            at: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.at.store(now + 1, Ordering::Relaxed);
    }

    fn is_recent(&self) -> bool {
        match self.at.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let since = Duration::from_millis(at - 1);
                self.epoch.elapsed().saturating_sub(since) < POOL_PING_AFTER_FAILURE
            }
        }
    }
}
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
    /// When a pool connection last failed (its siblings are then pinged before use).
    pool_failed: Arc<RecentFailure>,
    /// Options for dedicated connections (keepalives, client check interval).
    dedicated: PgConnectOptions,
    /// The same without `client_connection_check_interval`, for servers that refuse it.
    unchecked: PgConnectOptions,
    /// Whether dedicated connections still ask for `client_connection_check_interval`.
    client_check: AtomicBool,
    /// Held leases by owner id.
    held: Mutex<HashMap<OwnerId, Arc<Entry>>>,
    /// One permit per held lock (`max_held`).
    slots: Arc<Semaphore>,
    /// One permit per blocking acquire queued in the server (`max_waiting`).
    waiting: Arc<Semaphore>,
    /// Clean dedicated connections (not in a transaction) for reuse.
    idle: Mutex<VecDeque<(Dedicated, Instant)>>,
}

/// A dedicated connection. A [`PgListener`] (on a one-connection pool of its own) rather
/// than a bare connection, because its `try_recv` reads the socket while the transaction
/// sits idle: that is how a held lease learns at once that the server closed it.
type Dedicated = PgListener;

/// A held lease: what identifies the grant, and the channel to the task that owns its
/// connection.
struct Entry {
    key: LockKey,
    token: FencingToken,
    /// The holding transaction's id (`xid8` as text).
    xid: String,
    /// The TTL of the last grant or extension (for the holder record).
    ttl: Mutex<Duration>,
    /// Requests to the lease's task; dropping the entry ends the task (and the lease).
    tasks: mpsc::Sender<Request>,
    /// Fired by the task when the connection is lost.
    lost: LossNotice,
}

/// What a lease's task is asked to do on its connection.
enum Request {
    /// Re-arm the idle timer with a TTL.
    Extend(Duration, oneshot::Sender<Result<(), LockError>>),
    /// `COMMIT` and give the connection back.
    Release(oneshot::Sender<Result<ReleaseOutcome, LockError>>),
}

/// SQL text built once from the validated, quoted names.
#[derive(Debug)]
struct Statements {
    locking: Locking,
    /// The lock table's quoted name.
    table: String,
    /// The `NOWAIT` lock; `$1` is the row key. No row: busy (advisory) or no lock row yet.
    lock_nowait: String,
    /// The blocking lock, under `lock_timeout`.
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
        // What a granted lock statement returns: the transaction id and backend pid.
        let granted =
            format!("SELECT pg_current_xact_id()::text AS {LOCKED_XID}, pg_backend_pid()");
        let (lock_nowait, lock_wait) = match config.locking {
            Locking::Row => {
                let lock = format!("{granted} FROM {table} WHERE key = $1 FOR UPDATE");
                (format!("{lock} NOWAIT"), lock)
            }
            Locking::Advisory => {
                let id = format!(
                    "hashtextextended({} || $1, 0)",
                    literal(&format!("{table}:"))
                );
                (
                    format!("{granted} WHERE pg_try_advisory_xact_lock({id})"),
                    format!("{granted} FROM pg_advisory_xact_lock({id})"),
                )
            }
        };
        Self {
            locking: config.locking,
            lock_nowait,
            lock_wait,
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
            table,
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
    /// This backend for URL dispatch ([`Driver`]): `postgres://`, `postgresql://`.
    pub const DRIVER: Driver = Driver {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

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
        if config.idle_timeout.is_zero() {
            return Err(LockError::Config(
                "option idle_timeout_ms must be positive".into(),
            ));
        }
        if config.prefix.contains('\0') {
            return Err(LockError::Config(
                "option prefix must not contain a NUL character".into(),
            ));
        }
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
        let unchecked = named(base).options([
            ("tcp_keepalives_idle", "10"),
            ("tcp_keepalives_interval", "3"),
            ("tcp_keepalives_count", "3"),
        ]);
        let dedicated = unchecked.clone().options([(
            "client_connection_check_interval",
            config.client_check.as_str(),
        )]);
        let pool_failed = Arc::new(RecentFailure::new());
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size)
            .min_connections(0)
            .acquire_timeout(config.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .test_before_acquire(false)
            .before_acquire({
                let failed = pool_failed.clone();
                move |conn, meta| {
                    let ping = meta.idle_for >= POOL_PING_AFTER_IDLE || failed.is_recent();
                    Box::pin(async move {
                        if ping {
                            conn.ping().await?;
                        }
                        Ok(true)
                    })
                }
            })
            .connect_lazy_with(pool_options);
        let lock = Self {
            inner: Arc::new(Inner {
                sql: Statements::new(&config),
                slots: Arc::new(Semaphore::new(config.max_held)),
                waiting: Arc::new(Semaphore::new(config.max_waiting)),
                config,
                pool,
                pool_failed,
                dedicated,
                unchecked,
                client_check: AtomicBool::new(true),
                held: Mutex::new(HashMap::new()),
                idle: Mutex::new(VecDeque::new()),
            }),
        };
        tokio::spawn(close_unused(Arc::downgrade(&lock.inner)));
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
    /// Cancel-safe: every lease's task is told to close its connection before the first
    /// await.
    pub async fn close(&self) {
        // Dropping the entries ends their tasks, which close the connections.
        let held: Vec<_> = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        drop(held);
        self.inner.close_idle(|_| true);
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

    /// A dedicated connection with an open lock transaction whose idle timeout is `ttl`
    /// and, when `lock_timeout` is given, whose lock waits are bounded by it; nothing else
    /// the server could use to end the transaction earlier stays armed. Without
    /// `lock_timeout` the `NOWAIT` lock has been tried too, and its outcome is returned
    /// (`None`: the row was gone again, see [`lock_row`](Self::lock_row)); with it, the
    /// caller locks. See [`begin_batch`].
    async fn begin(
        &self,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        row_key: &str,
    ) -> Result<(Dedicated, Option<Locked>), LockError> {
        let batch = begin_batch(&self.inner.sql, ttl, lock_timeout, row_key);
        let config = &self.inner.config;
        let mut cached = self.pop_idle();
        loop {
            let fresh = cached.is_none();
            let mut conn = match cached.take() {
                Some(conn) => conn,
                None => self.open().await?,
            };
            let started = tokio::time::timeout(
                config.command_timeout,
                // To the end of the reply (see `lock_row`).
                sqlx::raw_sql(AssertSqlSafe(batch.clone())).fetch_all(&mut conn),
            )
            .await;
            let error = match started {
                Ok(Ok(_)) if lock_timeout.is_some() => return Ok((conn, None)),
                Ok(Ok(rows)) => {
                    let Some(row) = rows.last().filter(|r| r.try_column(LOCKED_XID).is_ok()) else {
                        let tried = match self.inner.sql.locking {
                            Locking::Row => None,
                            Locking::Advisory => Some(Locked::Busy),
                        };
                        return Ok((conn, tried));
                    };
                    match (row.try_get(0), row.try_get(1)) {
                        (Ok(xid), Ok(pid)) => {
                            return Ok((conn, Some(Locked::Granted { xid, pid })))
                        }
                        (Err(e), _) | (_, Err(e)) => {
                            discard(conn);
                            return Err(map_err(config, "lock", e));
                        }
                    }
                }
                Ok(Err(e))
                    if lock_timeout.is_none()
                        && sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                {
                    return Ok((conn, Some(Locked::Busy)))
                }
                Ok(Err(e)) => map_err(config, "begin", e),
                Err(_) => LockError::Unavailable {
                    message: format!(
                        "begin on {}: no reply within {:?}",
                        config.endpoint(),
                        config.command_timeout
                    ),
                    source: None,
                },
            };
            discard(conn);
            if fresh {
                return Err(error);
            }
            // A stale cached connection (e.g. the server restarted): the others are no
            // better, so drop them all and try once more on a fresh one.
            self.inner.close_idle(|_| true);
        }
    }

    /// Opens a dedicated connection: a listener on a one-connection pool of its own that
    /// never reconnects behind our back. A server that refuses
    /// `client_connection_check_interval` (one that cannot detect closed sockets) is asked
    /// without it from then on.
    async fn open(&self) -> Result<Dedicated, LockError> {
        let checked = self.inner.client_check.load(Ordering::Relaxed);
        let options = if checked {
            &self.inner.dedicated
        } else {
            &self.inner.unchecked
        };
        match self.open_with(options).await {
            Err((_, true)) if checked => {
                self.inner.client_check.store(false, Ordering::Relaxed);
                self.open_with(&self.inner.unchecked)
                    .await
                    .map_err(|(e, _)| e)
            }
            opened => opened.map_err(|(e, _)| e),
        }
    }

    /// [`open`](Self::open) with `options`; the error says whether the server refused
    /// `client_connection_check_interval`.
    async fn open_with(&self, options: &PgConnectOptions) -> Result<Dedicated, (LockError, bool)> {
        let config = &self.inner.config;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .test_before_acquire(false)
            .acquire_timeout(config.connect_timeout)
            .connect_lazy_with(options.clone());
        let opened = tokio::time::timeout(
            config.connect_timeout + Duration::from_secs(1),
            PgListener::connect_with(&pool),
        )
        .await;
        let mut conn = match opened {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) if !matches!(e, sqlx::Error::PoolTimedOut) => {
                drop(pool.close());
                let rejected = e
                    .as_database_error()
                    .is_some_and(|d| client_check_rejected(d.code().as_deref(), d.message()));
                return Err((map_err(config, "connect", e), rejected));
            }
            _ => {
                // The pool retries "too many connections" quietly until it times out: one
                // direct attempt tells what the server says.
                drop(pool.close());
                let probe = bounded_for(
                    config,
                    config.connect_timeout,
                    "connect",
                    PgConnection::connect_with(options),
                )
                .await
                .map_err(|e| (e, false))?;
                let _ = tokio::time::timeout(config.command_timeout, probe.close()).await;
                return Err((
                    LockError::Unavailable {
                        message: format!(
                            "connect on {}: no connection within {:?}",
                            config.endpoint(),
                            config.connect_timeout
                        ),
                        source: None,
                    },
                    false,
                ));
            }
        };
        conn.eager_reconnect(false);
        conn.ignore_pool_close_event(true);
        // Closing the pool now makes the connection close (not wait in the pool) once the
        // listener lets go of it.
        drop(pool.close());
        Ok(conn)
    }

    /// Whether dedicated connections ask the server to check for closed client sockets
    /// while a statement (a lock wait) runs; false once the server refused it.
    pub fn client_check_enabled(&self) -> bool {
        self.inner.client_check.load(Ordering::Relaxed)
    }

    /// The most recently used cached connection, if it was used recently enough.
    fn pop_idle(&self) -> Option<Dedicated> {
        let mut idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (conn, since) = idle.pop_back()?;
        if since.elapsed() < self.inner.config.idle_timeout {
            return Some(conn);
        }
        // The newest is too old, so all are.
        idle.push_back((conn, since));
        drop(idle);
        self.inner.close_idle(|_| true);
        None
    }

    /// Returns a connection known to be outside any transaction to the reuse cache, or
    /// closes it.
    fn recycle(inner: &Inner, conn: Dedicated) {
        let mut idle = inner.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < inner.config.idle_connections {
            idle.push_back((conn, Instant::now()));
        } else {
            drop(idle);
            discard(conn);
        }
    }

    /// Ends a transaction that holds nothing and recycles its connection; on failure the
    /// connection is closed (which rolls the transaction back on the server).
    async fn abandon(&self, conn: Dedicated) {
        rollback_and_recycle(&self.inner, conn).await;
    }

    /// Runs the locking `SELECT`; inserts the key's row (autocommit) once if it is missing
    /// (the begin batch inserted it, but it may have been deleted since).
    async fn lock_row(
        &self,
        conn: &mut Dedicated,
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
                // `fetch_all` reads the reply to its end, so nothing of it is left for the
                // held lease's socket watch to mistake for an unsolicited message.
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(row_key)
                    .fetch_all(&mut *conn),
            )
            .await
            .map(|rows| rows.map(|rows| rows.into_iter().next()));
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
                Ok(Ok(None)) if self.inner.sql.locking == Locking::Advisory => {
                    return Ok(Locked::Busy)
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
                            (&mut *conn).execute(sqlx::raw_sql(AssertSqlSafe(set))),
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
        // A blocking acquire queues under its own bound and takes a held slot only once
        // granted, so waiters on one hot key never starve acquires of other keys.
        let queued = match wait {
            Some(_) => Some(
                self.inner
                    .waiting
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| {
                        LockError::backend(format!(
                            "too many blocking acquires: this client already has max_waiting={} \
                     waiting in the server's lock queues; raise max_waiting or wait less",
                            config.max_waiting
                        ))
                    })?,
            ),
            None => None,
        };
        let mut slot = match queued {
            Some(_) => None,
            None => Some(self.held_slot()?),
        };
        if slot.is_none() && self.inner.slots.available_permits() == 0 {
            return Err(self.too_many_held());
        }
        let row_key = self.row_key(key);
        let started = Instant::now();
        let deadline = started + wait.unwrap_or_default();
        let (mut conn, tried) = self.begin(ttl, wait, &row_key).await?;
        // The server's idle timer starts after the locking statement completes, so a
        // deadline counted from its sending is conservative. A single attempt counts from
        // the call's start, before the connection was taken and the transaction opened:
        // what it promises never outlives the call plus its TTL, however slow the call.
        let mut sent = match wait {
            Some(_) => Instant::now(),
            None => started,
        };
        let locked = match tried {
            Some(locked) => Ok(locked),
            None => self.lock_row(&mut conn, &row_key, wait, deadline).await,
        };
        let (xid, pid) = match locked {
            Ok(Locked::Granted { xid, pid }) => (xid, pid),
            Ok(Locked::Busy) => {
                self.abandon(conn).await;
                return Ok(None);
            }
            Err(e) => {
                discard(conn);
                return Err(e);
            }
        };
        drop(queued);
        let slot = match slot.take() {
            Some(slot) => slot,
            None => match self.held_slot() {
                Ok(slot) => slot,
                Err(e) => {
                    self.abandon(conn).await;
                    return Err(e);
                }
            },
        };
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let record = || {
            self.bounded(
                "take fence",
                sqlx::query_scalar(AssertSqlSafe(self.inner.sql.record.as_str()))
                    .bind(&row_key)
                    .bind(owner.to_string())
                    .bind(&xid)
                    .bind(pid)
                    .bind(ttl_ms)
                    .fetch_optional(&self.inner.pool),
            )
        };
        let mut token: Result<Option<i64>, LockError> = record().await;
        if token.as_ref().is_err_and(LockError::is_retryable) {
            // Most likely a pool connection that died since its last use (they are not
            // pinged before every use): once more, with the pool's connections pinged
            // first. Safe whether or not the first statement took effect: a record this
            // transaction already made leaves the second nothing to match (`Ok(None)`).
            self.inner.pool_failed.mark();
            token = record().await;
        }
        let token = match token {
            Ok(Some(token)) => token,
            Ok(None) => {
                // Our transaction ended between the lock and the record (e.g. its backend
                // was terminated), or a live transaction is recorded as the holder (a
                // client of this table in the other `locking` mode): closing `conn` makes
                // sure nothing of ours remains.
                discard(conn);
                return Err(LockError::Unavailable {
                    message: format!(
                        "the grant on {} could not be recorded: the lock connection ended, \
                         or another client holds the key under the other locking mode",
                        config.endpoint()
                    ),
                    source: None,
                });
            }
            Err(e) => {
                discard(conn);
                return Err(e);
            }
        };
        let Some(token) = u64::try_from(token).ok().filter(|t| *t > 0) else {
            discard(conn);
            return Err(LockError::backend(format!(
                "fence sequence returned {token}"
            )));
        };
        if wait.is_some() && sent.elapsed() > ttl / 8 {
            // We queued for a while: count the lease from a statement sent now rather than
            // from the start of the wait.
            sent = Instant::now();
            if let Err(e) = refresh(&mut conn, ttl, &xid, config).await {
                // Nobody was told it held the lock: this is a failed attempt, not a lost
                // lease (and `acquire` retries it within its wait).
                discard(conn);
                return Err(LockError::Unavailable {
                    message: format!("the lock transaction ended right after its grant: {e}"),
                    source: None,
                });
            }
        }
        let lost = LossNotice::new();
        let (tie, dropped) = LeaseTie::new(lost.clone());
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
        })
        .with_tie(tie);
        let (tasks, requests) = mpsc::channel(4);
        let entry = Arc::new(Entry {
            key: key.clone(),
            token: FencingToken(token),
            xid,
            ttl: Mutex::new(ttl),
            tasks,
            lost,
        });
        let task = HeldTask {
            inner: Arc::downgrade(&self.inner),
            owner,
            entry: Arc::downgrade(&entry),
            xid: entry.xid.clone(),
            lost: entry.lost.clone(),
            slot: Some(slot),
        };
        // No await between here and the return: once in the map, the lease is ours.
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner, entry);
        tokio::spawn(task.run(conn, requests, dropped));
        Ok(Some(lease))
    }

    /// A held-lock slot, or the documented "too many held locks" error.
    fn held_slot(&self) -> Result<OwnedSemaphorePermit, LockError> {
        self.inner
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.too_many_held())
    }

    fn too_many_held(&self) -> LockError {
        LockError::backend(format!(
            "too many held locks: this client already holds max_held={} locks; release one \
             (a lease dropped without release is reclaimed at once) or raise max_held",
            self.inner.config.max_held
        ))
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
}

/// The task that owns a held lease's connection: runs its extends and its release, and
/// watches the socket in between, so a connection the server closed (terminated backend,
/// restart, idle timeout, keepalive failure) fires the lease's [`LossNotice`] at once,
/// and a lease dropped without release is rolled back and its slot freed at once.
struct HeldTask {
    inner: Weak<Inner>,
    owner: OwnerId,
    entry: Weak<Entry>,
    xid: String,
    lost: LossNotice,
    /// Given back before a release is answered, so the caller can use it at once.
    slot: Option<OwnedSemaphorePermit>,
}

impl HeldTask {
    async fn run(
        mut self,
        mut conn: Dedicated,
        mut requests: mpsc::Receiver<Request>,
        dropped: LeaseDropped,
    ) {
        loop {
            tokio::select! {
                biased;
                request = requests.recv() => match request {
                    Some(Request::Extend(ttl, reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        let result = refresh(&mut conn, ttl, &self.xid, &inner.config).await;
                        if let Err(e) = &result {
                            self.lose(e.to_string());
                            let _ = reply.send(result);
                            break;
                        }
                        let _ = reply.send(result);
                    }
                    Some(Request::Release(reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        let config = &inner.config;
                        let committed = tokio::time::timeout(
                            config.command_timeout,
                            (&mut conn).execute("COMMIT"),
                        )
                        .await;
                        drop(self.slot.take());
                        let outcome = match committed {
                            Ok(Ok(_)) => {
                                PgLock::recycle(&inner, conn);
                                let _ = reply.send(Ok(ReleaseOutcome::Released));
                                return;
                            }
                            // The server ended the session (idle timeout, terminated,
                            // restarted): the transaction was rolled back and the lock
                            // freed before we asked.
                            Ok(Err(_)) => Ok(ReleaseOutcome::NotHeld),
                            Err(_) => Err(LockError::Unavailable {
                                message: format!(
                                    "release on {}: no reply within {:?}; the connection was \
                                     closed, so the server frees the lock when it notices",
                                    config.endpoint(),
                                    config.command_timeout
                                ),
                                source: None,
                            }),
                        };
                        let _ = reply.send(outcome);
                        break;
                    }
                    // The entry is gone: the client was closed or dropped.
                    None => {
                        self.lost.fire(
                            LockError::lost("the lock client was closed, ending its transactions")
                                .to_string(),
                        );
                        break;
                    }
                },
                _ = dropped.wait() => {
                    // Every copy of the lease was dropped without a release: free the lock
                    // and the slot now rather than at the TTL.
                    self.forget();
                    if let Some(inner) = self.inner.upgrade() {
                        rollback_and_recycle(&inner, conn).await;
                        return;
                    }
                    break;
                }
                closed = Watch::new(conn.try_recv()) => {
                    let why = match closed {
                        Watched::Closed(Err(e)) => e.to_string(),
                        Watched::Closed(Ok(None)) => "the server closed it".to_string(),
                        Watched::Closed(Ok(Some(_))) => "an unexpected notification".to_string(),
                        Watched::Unsolicited => "the server sent an unsolicited message \
                            (the FATAL that precedes closing the session)"
                            .to_string(),
                    };
                    self.lose(LockError::lost(format!(
                        "the holding connection ended (the server rolled the transaction \
                         back and freed the lock): {why}"
                    )).to_string());
                    break;
                }
            }
        }
        // Whatever ended the task (a released lease needs no notice, and gets none it
        // could act on), the connection closes now: the lease is gone.
        self.lost
            .fire(LockError::lost("the lease's connection was closed").to_string());
        discard(conn);
    }

    /// Reports the loss to the lease's holder and forgets the lease.
    fn lose(&mut self, reason: String) {
        self.lost.fire(reason);
        self.forget();
    }

    /// Gives the slot back, then takes the lease out of the map (in that order, so a
    /// caller that sees the lease gone can use its slot).
    fn forget(&mut self) {
        drop(self.slot.take());
        let (Some(inner), Some(entry)) = (self.inner.upgrade(), self.entry.upgrade()) else {
            return;
        };
        let mut held = inner.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held
            .get(&self.owner)
            .is_some_and(|e| Arc::ptr_eq(e, &entry))
        {
            held.remove(&self.owner);
        }
    }
}

/// What the socket watch of an idle held connection saw.
enum Watched<T> {
    /// `try_recv` returned: the connection is closed (or a notification came).
    Closed(T),
    /// The socket woke the watch, yet `try_recv` still waits: the server sent a message
    /// nobody asked for. To a session idle in its transaction the server sends nothing
    /// unless it is ending it: the `FATAL` it sends *before* releasing the session's locks
    /// (`pg_terminate_backend`, shutdown, idle timeout). `try_recv` skips error messages
    /// and only returns at end of stream, after the locks are free; this catches the
    /// earlier message. (A spurious wake-up would end a healthy lease early: safe.)
    Unsolicited,
}

/// Wraps `try_recv` and tells apart polls caused by its own (socket) wake-ups.
struct Watch<F> {
    inner: std::pin::Pin<Box<F>>,
    woken: Arc<AtomicBool>,
}

/// Records that the socket woke the watch, then wakes the task.
struct WatchWaker {
    woken: Arc<AtomicBool>,
    task: std::task::Waker,
}

impl std::task::Wake for WatchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake_by_ref();
    }
}

impl<F> Watch<F> {
    fn new(inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            woken: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl<F: Future> Future for Watch<F> {
    type Output = Watched<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let woken = self.woken.swap(false, Ordering::SeqCst);
        let waker = std::task::Waker::from(Arc::new(WatchWaker {
            woken: self.woken.clone(),
            task: cx.waker().clone(),
        }));
        let mut own = std::task::Context::from_waker(&waker);
        match self.inner.as_mut().poll(&mut own) {
            std::task::Poll::Ready(out) => std::task::Poll::Ready(Watched::Closed(out)),
            std::task::Poll::Pending if woken => std::task::Poll::Ready(Watched::Unsolicited),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

/// Closes a dedicated connection; the server rolls back whatever transaction it had.
fn discard(conn: Dedicated) {
    if tokio::runtime::Handle::try_current().is_ok() {
        drop(conn);
    } else {
        // A listener closes in a task of its own, which needs a runtime; without one, the
        // socket stays open until the process exits (a clean connection holds no lock).
        std::mem::forget(conn);
    }
}

impl Inner {
    /// Closes the cached connections for which `close` says so, oldest first; stops at
    /// the first one it keeps.
    fn close_idle(&self, close: impl Fn(Instant) -> bool) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut closing = Vec::new();
        while idle.front().is_some_and(|(_, since)| close(*since)) {
            closing.extend(idle.pop_front().map(|(conn, _)| conn));
        }
        drop(idle);
        closing.into_iter().for_each(discard);
    }
}

/// Closes cached connections unused for `idle_timeout`, so that a burst of concurrent
/// locks does not keep its connections open for long; ends with the client.
async fn close_unused(inner: Weak<Inner>) {
    loop {
        let Some(limit) = inner.upgrade().map(|inner| inner.config.idle_timeout) else {
            return;
        };
        tokio::time::sleep(limit / 4).await;
        let Some(inner) = inner.upgrade() else { return };
        inner.close_idle(|since| since.elapsed() >= limit);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close_idle(|_| true);
    }
}

/// `ROLLBACK`, then back to the reuse cache; on failure the connection is closed.
async fn rollback_and_recycle(inner: &Inner, mut conn: Dedicated) {
    let limit = inner.config.command_timeout;
    match tokio::time::timeout(limit, (&mut conn).execute("ROLLBACK")).await {
        Ok(Ok(_)) => PgLock::recycle(inner, conn),
        _ => discard(conn),
    }
}

/// The one simple query that starts an attempt on a dedicated connection, in one round
/// trip:
///
/// 1. the key's row, inserted and committed in a transaction of its own (an explicit
///    `BEGIN … COMMIT`, so the server logs no "no transaction in progress" warning), so
///    that concurrent first acquirers never wait on each other's uncommitted insert and
///    the lock below always finds the row;
/// 2. the lock transaction: the lease as the idle timeout; server TCP keepalives that
///    cannot give up on a silent client before the lease's TTL has run (a keepalive
///    failure ends the session, which frees the lock); no statement or transaction
///    timeout (role or database defaults) that could end it sooner; and the lock wait
///    bound, if any. `transaction_timeout` exists from Postgres 17 on; it is looked up with
///    `current_setting(…, missing_ok)`, not in `pg_settings` (which builds every setting's
///    row: 0.7–1.2 ms of server time per lock, more than the rest of a cycle together);
/// 3. for a single attempt (`lock_timeout` is `None`), the `NOWAIT` lock itself, so a
///    try-acquire takes three round trips in all: this one, the fence, the `COMMIT`.
///
/// The session `SET`s before `BEGIN` join the lock transaction (a simple query folds
/// them in), so a rollback undoes them too. The key goes in as an escape-string literal
/// (see [`literal`]): a simple query has no parameters.
fn begin_batch(
    sql: &Statements,
    ttl: Duration,
    lock_timeout: Option<Duration>,
    row_key: &str,
) -> String {
    let (idle, interval, count) = keepalives(ttl);
    let (table, key) = (&sql.table, literal(row_key));
    let mut batch = match sql.locking {
        Locking::Row => format!(
            "BEGIN; INSERT INTO {table} (key) VALUES ({key}) ON CONFLICT (key) DO NOTHING; \
             COMMIT; "
        ),
        Locking::Advisory => String::new(),
    };
    batch.push_str(&format!(
        "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
         SET tcp_keepalives_count = {count}; \
         BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; \
         SET LOCAL statement_timeout = 0; \
         SELECT set_config('transaction_timeout', '0', true) \
         WHERE current_setting('transaction_timeout', true) IS NOT NULL",
        timeout_ms(ttl)
    ));
    match lock_timeout {
        Some(wait) => batch.push_str(&format!("; SET LOCAL lock_timeout = {}", timeout_ms(wait))),
        // A single pass over the template: `$1` inside the key is not replaced again.
        None => batch.push_str(&format!("; {}", sql.lock_nowait.replace("$1", &key))),
    }
    batch
}

/// The column naming the lock `SELECT`'s row in a [`begin_batch`] reply.
const LOCKED_XID: &str = "tenure_locked_xid";

/// `text` as an escape-string literal, `E'…'`, whose meaning does not depend on
/// `standard_conforming_strings`. Keys and prefixes have no NUL (checked before).
fn literal(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 4);
    quoted.push_str("E'");
    for c in text.chars() {
        if c == '\'' || c == '\\' {
            quoted.push(c);
        }
        quoted.push(c);
    }
    quoted.push('\'');
    quoted
}

/// Server keepalive settings (idle, interval, count; seconds) for a lease of `ttl`: the
/// server gives up on a silent client no sooner than `idle + interval × count`, which is
/// at least `ttl`.
fn keepalives(ttl: Duration) -> (u64, u64, u64) {
    const INTERVAL: u64 = 3;
    const COUNT: u64 = 3;
    // Linux caps TCP_KEEPIDLE at 32767 s; MAX_TTL is far below it.
    let idle = ttl.as_secs_f64().ceil().clamp(1.0, 32_767.0) as u64;
    (idle, INTERVAL, COUNT)
}

/// Re-arms the held transaction's idle timer with `ttl` and checks it is still the
/// transaction `xid`. Any failure means the lease is gone.
async fn refresh(
    conn: &mut Dedicated,
    ttl: Duration,
    xid: &str,
    config: &PgConfig,
) -> Result<(), LockError> {
    let result = tokio::time::timeout(
        config.command_timeout,
        sqlx::query_as::<_, (String, String, Option<String>)>(
            "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
             set_config('tcp_keepalives_idle', $2, false), \
             pg_current_xact_id_if_assigned()::text",
        )
        .bind(timeout_ms(ttl).to_string())
        .bind(keepalives(ttl).0.to_string())
        // To the end of the reply (see `lock_row`).
        .fetch_all(&mut *conn),
    )
    .await
    .map(|rows| rows.and_then(|rows| rows.into_iter().next().ok_or(sqlx::Error::RowNotFound)));
    match result {
        Ok(Ok((_, _, Some(current)))) if current == xid => Ok(()),
        Ok(Ok((_, _, current))) => Err(LockError::lost(format!(
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
    /// polling. Transient connection errors are retried with backoff within the wait. A
    /// queued acquire counts against `max_waiting`, and against `max_held` only once
    /// granted.
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
        let Some(entry) = self.entry(lease, false) else {
            return Err(LockError::lost(format!(
                "`{}` is not held by {} through this client{}",
                lease.key(),
                lease.owner(),
                lease
                    .loss_notice()
                    .and_then(LossNotice::reason)
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )));
        };
        let gone = |entry: &Entry| {
            LockError::lost(
                entry
                    .lost
                    .reason()
                    .unwrap_or_else(|| "the holding connection was already lost".into()),
            )
        };
        let sent = Instant::now();
        let (reply, answer) = oneshot::channel();
        if entry.tasks.send(Request::Extend(ttl, reply)).await.is_err() {
            return Err(gone(&entry));
        }
        answer.await.map_err(|_| gone(&entry))??;
        let changed = {
            let mut held = entry.ttl.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *held, ttl) != ttl
        };
        if changed {
            // Keep inspect's remaining time right; the lease is extended either way.
            let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            let _ = self
                .bounded(
                    "record ttl",
                    sqlx::query(AssertSqlSafe(self.inner.sql.update_ttl.as_str()))
                        .bind(lease.handle().path.as_str())
                        .bind(ttl_ms)
                        .bind(entry.xid.as_str())
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
        let (reply, answer) = oneshot::channel();
        // The entry is out of the map: once this `entry` is dropped the task ends, so a
        // dropped future never leaves the connection held.
        if entry.tasks.send(Request::Release(reply)).await.is_err() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        drop(entry);
        answer.await.unwrap_or(Ok(ReleaseOutcome::NotHeld))
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
            Some("57P01" | "57P02" | "57P03" | TOO_MANY_CONNECTIONS | "25P03" | "40P01")
        );
    if unavailable {
        let message = if code.as_deref() == Some(TOO_MANY_CONNECTIONS) {
            format!(
                "{message} (the server is out of connection slots: raise its max_connections, \
                 or the role's or database's CONNECTION LIMIT; each held lock and each \
                 blocking acquire uses one connection)"
            )
        } else {
            message
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_never_give_up_before_the_ttl() {
        for ms in [
            100, 999, 1000, 1001, 10_000, 19_000, 30_000, 30_500, 3_600_000,
        ] {
            let ttl = Duration::from_millis(ms);
            let (idle, interval, count) = keepalives(ttl);
            assert!(
                Duration::from_secs(idle) >= ttl && interval > 0 && count > 0,
                "{ttl:?}: {idle}+{interval}x{count}"
            );
        }
        let batch = try_batch("postgres://u@h/db", Duration::from_secs(30), "k");
        assert!(batch.contains("tcp_keepalives_idle = 30;"), "{batch}");
        assert!(batch.contains("statement_timeout = 0"), "{batch}");
        assert!(batch.contains("transaction_timeout"), "{batch}");
    }

    /// The begin batch of a try-acquire of `key` by a client of `url`.
    fn try_batch(url: &str, ttl: Duration, key: &str) -> String {
        let config = PgConfig::from_url(url).unwrap();
        begin_batch(&Statements::new(&config), ttl, None, key)
    }

    #[test]
    fn advisory_locking_locks_a_hash_of_table_and_key_and_inserts_no_row() {
        let batch = try_batch(
            "postgres://u@h/db?locking=advisory",
            Duration::from_secs(1),
            "k",
        );
        assert!(!batch.contains("INSERT"), "{batch}");
        assert!(
            batch.ends_with(
                "WHERE pg_try_advisory_xact_lock(hashtextextended(\
                 E'\"public\".\"tenure_locks\":' || E'k', 0))"
            ),
            "{batch}"
        );
    }

    #[tokio::test]
    async fn settings_set_in_code_are_checked_before_connecting() {
        let mut config = PgConfig::from_url("postgres://u@127.0.0.1:1/db").unwrap();
        config.idle_timeout = Duration::ZERO;
        let err = PgLock::with_config(config.clone()).await.unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
        assert!(err.to_string().contains("idle_timeout_ms"), "{err}");
        config.idle_timeout = Duration::from_secs(1);
        config.prefix = "a\0b".into();
        let err = PgLock::with_config(config).await.unwrap_err();
        assert!(err.to_string().contains("NUL"), "{err}");
    }

    #[test]
    fn keys_are_quoted_whatever_they_contain() {
        assert_eq!(literal("plain/key"), "E'plain/key'");
        assert_eq!(literal(r"it's a \ key"), r"E'it''s a \\ key'");
        assert_eq!(literal("$k$ ends in $"), "E'$k$ ends in $'");
        let batch = try_batch("postgres://u@h/db", Duration::from_secs(1), "x');--");
        assert!(batch.contains("VALUES (E'x'');--')"), "{batch}");
        assert!(
            batch.ends_with("WHERE key = E'x'');--' FOR UPDATE NOWAIT"),
            "{batch}"
        );
    }

    #[test]
    fn a_refused_client_check_is_recognised() {
        // What Postgres 14+ says on a platform that cannot detect closed sockets (the
        // detail is "client_connection_check_interval must be set to 0 on this platform"),
        // and what a server that does not know the setting says.
        let refused = [
            (
                "22023",
                "invalid value for parameter \"client_connection_check_interval\": 1000",
            ),
            (
                "42704",
                "unrecognized configuration parameter \"client_connection_check_interval\"",
            ),
        ];
        for (code, message) in refused {
            assert!(
                client_check_rejected(Some(code), message),
                "{code} {message}"
            );
        }
        for (code, message) in [
            (
                Some("22023"),
                "invalid value for parameter \"tcp_keepalives_idle\": -5",
            ),
            (Some("53300"), "sorry, too many clients already"),
            (None, "client_connection_check_interval"),
        ] {
            assert!(!client_check_rejected(code, message), "{code:?} {message}");
        }
    }

    /// The fallback, live: the server refuses the value asked for (here an invalid one,
    /// which Postgres rejects with the same SQLSTATE and message shape as a platform
    /// without support), and the lock connects without it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_refuses_the_client_check_is_used_without_it() {
        let server = tenure_conformance::servers::postgres::Postgres::start()
            .await
            .unwrap();
        let key = LockKey::new("client-check").unwrap();
        let ttl = Duration::from_secs(5);
        let mut config = PgConfig::from_url(&server.url()).unwrap();
        config.client_check = "not-a-number".into();
        let lock = PgLock::with_config(config).await.unwrap();
        assert!(lock.client_check_enabled());
        let lease = lock.try_acquire(&key, ttl).await.unwrap().expect("free");
        assert!(
            !lock.client_check_enabled(),
            "the fault fired: the server refused the setting"
        );
        assert!(lock.try_acquire(&key, ttl).await.unwrap().is_none());
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
        // A server that accepts it keeps it.
        let lock = PgLock::connect(&server.url()).await.unwrap();
        let lease = lock.try_acquire(&key, ttl).await.unwrap().expect("free");
        assert!(lock.client_check_enabled());
        lock.release(lease).await.unwrap();
    }
}
