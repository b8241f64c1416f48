#![doc = include_str!("../docs.md")]

mod acquire;
mod admin;
mod client;
mod config;
mod error;
mod fenced;
#[cfg(feature = "testbed")]
mod floor;
mod held;
#[cfg(feature = "testbed")]
pub mod lab;
mod lease;
#[cfg(feature = "testbed")]
mod lease_floor;
mod records;
mod sql;
mod transaction;
#[cfg(feature = "testbed")]
mod verdicts;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, Postgres};
use sqlx::Connection;
use sqlx::{AssertSqlSafe, Executor, Row};
use tenure_api::backend::{
    default_drift, parse_holder_text, wait_in_server, Backend, Driver, HeldLeases, LossNotice,
};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome, Replication,
    WaitKind,
};
use tokio::sync::{oneshot, Semaphore};

use client::{autocommit_pool, close_unused, Dedicated, RecentFailure};
use error::{bounded_for, map_err};
use held::{Entry, Request};
use sql::Statements;

pub use config::{redact, validate_ident, Locking, PgConfig};
pub use fenced::{FencedTable, FencedWrite};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;
pub use transaction::LockedTransaction;

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
    /// Options for dedicated connections (keepalives, no statement timeout, client check
    /// interval).
    dedicated: PgConnectOptions,
    /// The same without `client_connection_check_interval`, for servers that refuse it.
    unchecked: PgConnectOptions,
    /// Whether dedicated connections still ask for `client_connection_check_interval`.
    client_check: AtomicBool,
    /// Held leases by owner id.
    held: HeldLeases<Entry>,
    /// One permit per held lock (`max_held`).
    slots: Arc<Semaphore>,
    /// One permit per blocking acquire queued in the server (`max_waiting`).
    waiting: Arc<Semaphore>,
    /// Clean dedicated connections (not in a transaction) for reuse.
    idle: Mutex<VecDeque<(Dedicated, Instant)>>,
    /// Grant records waiting for a pool connection (sent together).
    records: records::Records,
    /// `locking=lease`: the releases this client hears of.
    releases: lease::Releases,
}

impl fmt::Debug for PgLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLock")
            .field("config", &self.inner.config)
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
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
        // Lock connections: keepalive probes (`begin_batch` sets the idle time per lease),
        // no TCP user timeout (which would drop the session once probes go unanswered
        // for that long, however long the lease) and no statement timeout, whatever the
        // role's or database's default (a startup option overrides them; see
        // `sql::SESSION_SETTINGS`).
        let unchecked = named(base).options([
            ("tcp_keepalives_idle", "10".to_string()),
            (
                "tcp_keepalives_interval",
                sql::KEEPALIVE_INTERVAL.to_string(),
            ),
            ("tcp_keepalives_count", sql::KEEPALIVE_COUNT.to_string()),
            ("tcp_user_timeout", "0".to_string()),
            ("statement_timeout", "0".to_string()),
        ]);
        let dedicated = unchecked.clone().options([(
            "client_connection_check_interval",
            config.client_check.as_str(),
        )]);
        let pool_failed = Arc::new(RecentFailure::new());
        let pool = autocommit_pool(&config, pool_options, pool_failed.clone());
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
                held: HeldLeases::default(),
                idle: Mutex::new(VecDeque::new()),
                records: Default::default(),
                releases: Default::default(),
            }),
        };
        tokio::spawn(close_unused(Arc::downgrade(&lock.inner)));
        if lock.inner.config.migrate {
            lock.migrate().await?;
        } else {
            // Fail early if the server cannot be reached.
            lock.pooled().await?;
        }
        Ok(lock)
    }

    /// Creates the schema (if missing), the lock table, the holder table and the fence
    /// sequence, each only if missing. Idempotent and safe to run from many clients at
    /// once: the DDL runs in one transaction under `pg_advisory_xact_lock`, because
    /// `CREATE … IF NOT EXISTS` alone races (two sessions can both see "missing"). When all
    /// three objects exist it runs no DDL, so a role with only the privileges of
    /// [`PgConfig::grant_sql`] can leave `migrate` on.
    ///
    /// # Cancel safety
    /// Cancel-safe: the transaction is rolled back if the future is dropped.
    pub async fn migrate(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let mut conn = self.pooled().await?;
        let present: bool = self
            .bounded(
                "migrate",
                sqlx::query_scalar(
                    "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                     AND to_regclass($3) IS NOT NULL",
                )
                .bind(match config.locking {
                    Locking::Lease => config.lease_table(),
                    _ => config.lock_table(),
                })
                .bind(match config.locking {
                    Locking::Lease => config.lease_table(),
                    _ => config.holder_table(),
                })
                .bind(config.fence_sequence())
                .fetch_one(&mut *conn),
            )
            .await?;
        if present {
            return Ok(());
        }
        let mut tx = self.bounded("migrate", conn.begin()).await?;
        self.bounded(
            "migrate",
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(format!("tenure-postgres:{}", config.lock_table()))
                .execute(&mut *tx),
        )
        .await?;
        let schema_exists: bool = self
            .bounded(
                "migrate",
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(config.schema())
                    .fetch_one(&mut *tx),
            )
            .await?;
        if !schema_exists {
            // The name passed `validate_ident` and is quoted.
            let ddl = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", config.schema());
            let create = tx.execute(sqlx::raw_sql(AssertSqlSafe(ddl)));
            self.bounded("migrate", create).await?;
        }
        let ddl = self.inner.sql.migrate.clone();
        let create = tx.execute(sqlx::raw_sql(AssertSqlSafe(ddl)));
        self.bounded("migrate", create).await?;
        self.bounded("migrate", tx.commit()).await
    }

    /// A live holder from an inspect row: owner text, token, milliseconds left.
    fn holder_of(&self, row: &sqlx::postgres::PgRow) -> Result<HolderInfo, LockError> {
        let config = &self.inner.config;
        let owner: String = row.try_get(0).map_err(|e| map_err(config, "inspect", e))?;
        let token: i64 = row.try_get(1).map_err(|e| map_err(config, "inspect", e))?;
        let remaining: Option<i64> = row.try_get(2).map_err(|e| map_err(config, "inspect", e))?;
        let (owner, label) = parse_holder_text(&owner)?;
        Ok(HolderInfo {
            owner,
            label,
            foreign: false,
            token: u64::try_from(token).ok().map(FencingToken),
            remaining: remaining
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        })
    }

    /// Records a held transaction's new TTL in its holder record (for `inspect` and the
    /// doctor); best effort: the lease is extended either way.
    pub(crate) async fn record_ttl(&self, row_key: &str, ttl: Duration, xid: &str) {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let record = async {
            let mut conn = self.pooled().await?;
            self.bounded(
                "record ttl",
                sqlx::query(AssertSqlSafe(self.inner.sql.update_ttl.as_str()))
                    .bind(row_key)
                    .bind(ttl_ms)
                    .bind(xid)
                    .execute(&mut *conn),
            )
            .await
        };
        let _ = record.await;
    }

    /// Whether this client keeps leases in the lease table (`locking=lease`).
    pub(crate) fn leases(&self) -> bool {
        self.inner.sql.locking == Locking::Lease
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &PgConfig {
        &self.inner.config
    }

    /// The row key holding `key`'s lock: the configured prefix and the key.
    pub fn row_key(&self, key: &LockKey) -> String {
        format!("{}{}", self.inner.config.prefix, key)
    }

    /// How many clients — the holder and its waiters — the server has queued for `key`,
    /// read from `pg_locks`: with row locking, the transaction holding the key's row and
    /// those waiting for it; with advisory locking, those holding or awaiting its advisory
    /// lock. Tries (`NOWAIT`) are not queued: with row locking one is counted at most for
    /// the instant it holds the row's tuple lock, as is a new holder during a hand-off.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn queued(&self, key: &LockKey) -> Result<usize, LockError> {
        let mut conn = self.pooled().await?;
        let count: i64 = self
            .bounded(
                "queue count",
                sqlx::query_scalar(AssertSqlSafe(self.inner.sql.queued.as_str()))
                    .bind(self.row_key(key))
                    .fetch_one(&mut *conn),
            )
            .await?;
        usize::try_from(count)
            .map_err(|_| LockError::backend(format!("Postgres counted {count} queued clients")))
    }

    /// Number of leases this client holds now.
    pub fn held_count(&self) -> usize {
        self.inner.held.len()
    }

    /// Ends every held lease (their transactions roll back, freeing the locks) and closes
    /// all connections. Further calls fail with [`LockError::Unavailable`].
    ///
    /// # Cancel safety
    /// Cancel-safe: every lease's task is told to close its connection before the first
    /// await.
    pub async fn close(&self) {
        // Dropping the entries ends their tasks, which close the connections.
        drop(self.inner.held.drain());
        self.inner.close_idle(|_| true);
        self.inner.pool.close().await;
    }

    /// A connection of the autocommit pool: an idle one, or a new one. The wait for it is
    /// bounded by `connect_timeout`; the statements run on it are each bounded by
    /// `request_timeout` ([`bounded`](Self::bounded)). When none came: if every
    /// connection the pool may have was busy, the error says so (raise `pool_size`);
    /// otherwise one direct attempt, within another `connect_timeout`, asks the server
    /// why ([`client::no_connection`]).
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-open connection is dropped.
    pub(crate) async fn pooled(&self) -> Result<PoolConnection<Postgres>, LockError> {
        let config = &self.inner.config;
        let pool = &self.inner.pool;
        // The pool gives up after `connect_timeout` (its own bound; this one is a
        // backstop), and then says only that it timed out: [`client::no_connection`]
        // asks the server why.
        let limit = config.connect_timeout + Duration::from_secs(1);
        let acquired = bounded_for(config, limit, "connect", async {
            match pool.acquire().await {
                Err(sqlx::Error::PoolTimedOut) => Ok(None),
                other => other.map(Some),
            }
        })
        .await?;
        let most = pool.options().get_max_connections();
        match acquired {
            Some(connection) => Ok(connection),
            // Every connection the pool may open is open (or being opened): busy.
            None if pool.size() >= most => Err(LockError::Unavailable {
                message: format!(
                    "connect on {}: all {most} connections of the pool stayed busy for {:?} \
                     (raise pool_size)",
                    config.endpoint(),
                    config.connect_timeout
                ),
                source: None,
            }),
            None => Err(client::no_connection(config, &pool.connect_options()).await),
        }
    }

    /// Whether dedicated connections ask the server to check for closed client sockets
    /// while a statement (a lock wait) runs; false once the server refused it.
    pub fn client_check_enabled(&self) -> bool {
        self.inner.client_check.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl DistributedLock for PgLock {
    /// # Cancel safety
    /// Cancel-safe: until the lease is returned, its dedicated connection is owned by the
    /// future; dropping the future closes the connection, and the server rolls the
    /// transaction back and frees the row at once. A fence value may be consumed (tokens
    /// may skip numbers; they never repeat). With `locking=lease` a dropped attempt gives
    /// back, from a task of its own, the grant it may have taken (by its owner id, the
    /// attempt's own).
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        if self.leases() {
            return self.lease_try_acquire(key, ttl, None).await;
        }
        self.attempt(
            std::slice::from_ref(key),
            OwnerId::random(),
            ttl,
            None,
            None,
        )
        .await
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
        if self.leases() {
            return self.lease_acquire(key, opts).await;
        }
        let owner = OwnerId::random();
        let key = std::slice::from_ref(key);
        wait_in_server(
            opts,
            |wait| self.attempt(key, owner, opts.ttl, opts.label.as_deref(), wait),
            // The server's `lock_timeout` ran out at its cap, before our deadline (and not
            // early for another reason: that would spin).
            |wait, tried, _| {
                wait.is_some_and(sql::lock_timeout_capped)
                    && tried.elapsed() >= sql::LOCK_TIMEOUT_CAP / 2
            },
        )
        .await
    }

    /// Tries every key in one statement — `FOR UPDATE SKIP LOCKED` over their rows in the
    /// order given, `LIMIT 1` (advisory locking: a `CASE` of `pg_try_advisory_xact_lock`
    /// calls that stops at the first granted) — so a full [`Semaphore`](tenure_api::Semaphore)
    /// costs one attempt, not one per permit. Then, within `opts.wait`, it waits in the
    /// server's lock queue of every key at once and keeps the first grant (each wait a
    /// dedicated connection counted against `max_waiting`).
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire), for each key.
    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        if self.leases() {
            return tenure_api::backend::acquire_each(self, keys, opts).await;
        }
        let keys = tenure_api::backend::validate_keys(keys)?;
        let started = Instant::now();
        let label = opts.label.as_deref();
        let failed = match self
            .attempt(keys, OwnerId::random(), opts.ttl, label, None)
            .await
        {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) => None,
            Err(e) if e.is_retryable() => Some(e),
            Err(e) => return Err(e),
        };
        tenure_api::backend::wait_for_any(self, keys, opts, started, failed).await
    }

    /// # Cancel safety
    /// `lease` is unchanged if the future is dropped; the statement may or may not have
    /// re-armed the server's timer (which only lengthens our own grant). The connection
    /// stays held.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        if self.leases() {
            return self.lease_extend(lease, ttl).await;
        }
        let Some(entry) = self.inner.held.find(lease, false) else {
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
            self.record_ttl(&lease.handle().path, ttl, &entry.xid).await;
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
        if self.leases() {
            return self.lease_release(lease).await;
        }
        let Some(entry) = self.inner.held.find(&lease, true) else {
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
        if self.leases() {
            let mut holders = self.lease_inspect_each(std::slice::from_ref(key)).await?;
            return Ok(holders.pop().flatten());
        }
        let mut conn = self.pooled().await?;
        let row = self
            .bounded(
                "inspect",
                sqlx::query(AssertSqlSafe(self.inner.sql.inspect.as_str()))
                    .bind(self.row_key(key))
                    .fetch_optional(&mut *conn),
            )
            .await?;
        row.map(|row| self.holder_of(&row)).transpose()
    }

    /// Every key's live holder in one statement.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        if self.leases() {
            return self.lease_inspect_each(keys).await;
        }
        let row_keys: Vec<String> = keys.iter().map(|key| self.row_key(key)).collect();
        let mut conn = self.pooled().await?;
        let rows = self
            .bounded(
                "inspect",
                sqlx::query(AssertSqlSafe(self.inner.sql.inspect_each.as_str()))
                    .bind(&row_keys)
                    .fetch_all(&mut *conn),
            )
            .await?;
        let mut holders: HashMap<String, HolderInfo> = HashMap::new();
        for row in rows {
            let key: String = row
                .try_get(3)
                .map_err(|e| map_err(&self.inner.config, "inspect", e))?;
            holders.insert(key, self.holder_of(&row)?);
        }
        Ok(row_keys.iter().map(|key| holders.remove(key)).collect())
    }

    /// The transaction modes: expiry by the server ending the transaction (its idle
    /// timeout, a wall-clock deadline), FIFO waiters in the server's lock queue.
    /// `locking=lease`: expiry by the server's clock, waiters woken by `NOTIFY` (or the
    /// holder's expiry), no order. Both depend on the server's clock.
    fn capabilities(&self) -> Capabilities {
        let leases = self.leases();
        Capabilities {
            backend: "postgres",
            fencing: FencingKind::Sequence,
            expiry: match leases {
                true => ExpiryKind::ServerTtl,
                false => ExpiryKind::ConnectionTransaction,
            },
            replication: Replication::SingleNode,
            wait: WaitKind::Push,
            fairness: match leases {
                true => Fairness::None,
                false => Fairness::Fifo,
            },
            failures_tolerated: 0,
            // Leases expire by the server's clock; a transaction's idle timeout is a
            // wall-clock deadline too, which a forward step makes due at the backend's
            // next timer interrupt (measured: the matrix's clock-jump cell).
            clock_dependent: true,
            labels: true,
            shared: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The fallback, live: the server refuses the value asked for (here an invalid one,
    /// which Postgres rejects with the same SQLSTATE and message shape as a platform
    /// without support), and the lock connects without it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_refuses_the_client_check_is_used_without_it() {
        let server = crate::lab::Postgres::start().await.unwrap();
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
