#![doc = include_str!("../docs.md")]

mod admin;
mod client;
mod config;
mod error;
#[cfg(feature = "testbed")]
mod floor;
mod held;
#[cfg(feature = "testbed")]
pub mod lab;
mod names;
mod sql;
#[cfg(feature = "testbed")]
mod verdicts;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, Executor, Row};
use tenure_api::backend::{
    default_drift, held_slot, holder_text, parse_holder_text, wait_in_server, waiting_slot,
    Backend, Driver, HeldLeases, LeaseTie, LossNotice,
};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey, OwnerId, ReleaseOutcome,
    Replication, WaitKind,
};
use tokio::sync::{mpsc, oneshot, Semaphore};

use client::{open, shared_pool, Dedicated, IdleConnections};
use error::{bounded_for, map_err};
use held::{Entry, HeldTask, Request};
use sql::{wait_timeout, Statements, GET_LOCK};

pub use config::{validate_ident, Locking, MySqlConfig};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;

/// Locks on one MySQL or MariaDB server: a `GET_LOCK` named lock per key (or a `FOR
/// UPDATE NOWAIT` row lock, [`Locking::Row`]), held by a session of its own, fenced by a
/// committed counter. Cheap to clone (`Arc` inside);
/// clones share the held connections. See the [crate docs](crate).
#[derive(Clone)]
pub struct MySqlLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: MySqlConfig,
    sql: Statements,
    /// Shared connections: inspect, the migration; for row locks also the grants'
    /// records, the rows' inserts and the holders' probes.
    pool: MySqlPool,
    /// Whether the server is MariaDB (its session variables differ from MySQL's).
    mariadb: bool,
    /// Held locks by owner id.
    held: HeldLeases<Entry>,
    /// One permit per held lock (`max_held`).
    slots: Arc<Semaphore>,
    /// One permit per blocking acquire waiting in the server (`max_waiting`).
    waiting: Arc<Semaphore>,
    /// Clean lock connections for reuse.
    idle: IdleConnections,
}

impl fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl MySqlLock {
    /// This backend for URL dispatch ([`Driver`]): `mysql://`, `mariadb://`.
    pub const DRIVER: Driver = Driver {
        name: "mysql",
        schemes: &["mysql", "mariadb"],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

    /// Connects to the server a `mysql://` URL names (see [`MySqlConfig`]) and, unless
    /// `migrate=false`, creates the lock table if it is missing.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(MySqlConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`connect`](Self::connect).
    pub async fn with_config(config: MySqlConfig) -> Result<Self, LockError> {
        tenure_api::tls::install_crypto_provider();
        config.validate()?;
        let pool = shared_pool(&config);
        let version: String = bounded_for(
            &config,
            config.connect_timeout + config.request_timeout,
            "connect",
            sqlx::query_scalar("SELECT VERSION()").fetch_one(&pool),
        )
        .await?;
        let lock = Self {
            inner: Arc::new(Inner {
                sql: Statements::new(config.table(), &config.rows_table()),
                slots: Arc::new(Semaphore::new(config.max_held)),
                waiting: Arc::new(Semaphore::new(config.max_waiting)),
                mariadb: version.contains("MariaDB"),
                config,
                pool,
                held: HeldLeases::default(),
                idle: IdleConnections::default(),
            }),
        };
        if lock.inner.config.migrate {
            lock.migrate().await?;
        }
        Ok(lock)
    }

    /// Creates the tables this configuration uses if one is missing
    /// ([`MySqlConfig::schema_sql`]). When they exist, no DDL runs, so a user with only the privileges of
    /// [`MySqlConfig::grant_sql`] can leave `migrate` on.
    ///
    /// # Cancel safety
    /// Cancel-safe: each `CREATE TABLE IF NOT EXISTS` is atomic, and a later call creates
    /// what an interrupted one did not.
    pub async fn migrate(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let tables = config.tables();
        let found: i64 = bounded_for(
            config,
            config.request_timeout,
            "migrate",
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?)",
            )
            .bind(&tables[0])
            .bind(tables.last())
            .fetch_one(&self.inner.pool),
        )
        .await?;
        if usize::try_from(found).is_ok_and(|found| found == tables.len()) {
            return Ok(());
        }
        let create = config.schema_sql();
        bounded_for(
            config,
            config.request_timeout,
            "migrate",
            self.inner
                .pool
                .execute(sqlx::raw_sql(AssertSqlSafe(create))),
        )
        .await?;
        Ok(())
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &MySqlConfig {
        &self.inner.config
    }

    /// The `GET_LOCK` name of `key` (with the configured prefix): what another language
    /// passes to `GET_LOCK` to share the lock (see the crate docs for the rule).
    pub fn lock_name(&self, key: &LockKey) -> String {
        names::lock_name(&self.inner.config.name(key))
    }

    /// How many locks this client holds.
    pub fn held_count(&self) -> usize {
        self.inner.held.len()
    }

    /// A lock connection: a cached clean one, or a new one.
    async fn dedicated(&self, ttl: Duration) -> Result<(Dedicated, bool), LockError> {
        let inner = &self.inner;
        match inner.idle.pop() {
            Some(conn) => Ok((conn, true)),
            None => Ok((
                open(&inner.config, inner.mariadb, wait_timeout(ttl)).await?,
                false,
            )),
        }
    }

    /// `GET_LOCK` on a lock connection whose `wait_timeout` is set for `ttl`. `deadline`: wait in
    /// the server until then (MySQL waits whole seconds, rounded up; MariaDB to the
    /// microsecond). A cached connection that fails is replaced by a fresh one once, which
    /// waits for what is left.
    async fn get_lock(
        &self,
        lock_name: &str,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Locked, LockError> {
        let inner = &self.inner;
        let config = &inner.config;
        loop {
            let (mut conn, cached) = self.dedicated(ttl).await?;
            let wait = deadline.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let seconds = match inner.mariadb {
                true => wait.as_secs_f64(),
                false => wait.as_secs_f64().ceil(),
            };
            let limit = Duration::from_secs_f64(seconds) + config.request_timeout;
            let result = async {
                conn.set_wait_timeout(config, wait_timeout(ttl)).await?;
                bounded_for(
                    config,
                    limit,
                    "lock",
                    sqlx::query_scalar::<_, Option<i64>>(GET_LOCK)
                        .bind(lock_name)
                        .bind(seconds)
                        .fetch_one(&mut conn.conn),
                )
                .await
            }
            .await;
            match result {
                Ok(Some(1)) => return Ok(Locked::Granted(conn)),
                Ok(Some(0)) => return Ok(Locked::Busy(Some(conn))),
                Ok(other) => {
                    return Err(LockError::Unavailable {
                        message: format!(
                            "GET_LOCK on {} returned {other:?}: the wait was interrupted \
                             (KILL QUERY) or the server is out of memory",
                            config.endpoint()
                        ),
                        source: None,
                    })
                }
                // A stale cached connection (the server ended it): the others are no
                // better, so drop them all and try once more on a fresh one.
                Err(e) if cached && e.is_retryable() => inner.idle.clear(),
                Err(e) => return Err(e),
            }
        }
    }

    /// The row mode's lock on a lock connection whose `wait_timeout` is set for `ttl`: a
    /// transaction opened and the key's row locked (`NOWAIT`, or waiting in the row's
    /// queue until `deadline`: the server waits whole seconds, rounded up, so the wait is
    /// cut here at the deadline, and its connection closed). A missing row is inserted
    /// (autocommit, on a shared connection) and locked in the same transaction. A cached
    /// connection that fails is replaced by a fresh one once.
    async fn lock_row(
        &self,
        name: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Locked, LockError> {
        let inner = &self.inner;
        let config = &inner.config;
        let rows_table = config.rows_table();
        loop {
            let (mut conn, cached) = self.dedicated(ttl).await?;
            let wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let secs = wait.map(|w| w.as_secs_f64().ceil().max(1.0) as u64);
            let limit = wait.unwrap_or(config.request_timeout);
            let locked = async {
                conn.set_wait_timeout(config, wait_timeout(ttl)).await?;
                let batch = sql::lock_row(&rows_table, name, secs);
                let rows = sqlx::raw_sql(AssertSqlSafe(batch)).fetch_all(&mut conn.conn);
                match tokio::time::timeout(limit, rows).await {
                    Err(_) if wait.is_some() => Ok(None),
                    Err(_) => Err(LockError::no_reply("lock", config.endpoint(), limit)),
                    Ok(Ok(rows)) => Ok(Some(Ok(!rows.is_empty()))),
                    Ok(Err(e)) if row_busy(&e) => Ok(Some(Err(()))),
                    Ok(Err(e)) => Err(map_err(config, "lock", e)),
                }
            }
            .await;
            match locked {
                Ok(Some(Ok(true))) => return Ok(Locked::Granted(conn)),
                // The key's first use: its row, then the lock in the same transaction.
                Ok(Some(Ok(false))) => {
                    let inserted = bounded_for(
                        config,
                        config.request_timeout,
                        "insert the lock row",
                        sqlx::query(AssertSqlSafe(inner.sql.insert_row.as_str()))
                            .bind(name)
                            .execute(&inner.pool),
                    )
                    .await;
                    let locked = match inserted {
                        // Another client inserted and locked the row meanwhile: the
                        // insert's duplicate check waited a second for its lock.
                        Err(LockError::Unavailable {
                            source: Some(source),
                            ..
                        }) if source.downcast_ref::<sqlx::Error>().is_some_and(row_busy) => false,
                        Err(e) => return Err(e),
                        Ok(_) => held::relock(inner, &mut conn, name).await?,
                    };
                    return Ok(match locked {
                        true => Locked::Granted(conn),
                        false => Locked::Busy(busy(inner, conn).await),
                    });
                }
                Ok(Some(Err(()))) => return Ok(Locked::Busy(busy(inner, conn).await)),
                // The wait ran out here: closing the connection ends the server's.
                Ok(None) => return Ok(Locked::Busy(None)),
                Err(e) if cached && e.is_retryable() => inner.idle.clear(),
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt: `wait = None` tries once; `Some(w)` waits in the server for up to `w`.
    /// `Ok(None)`: held by another (or the wait ran out).
    async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        label: Option<&str>,
        wait: Option<Duration>,
    ) -> Result<Option<Lease>, LockError> {
        let inner = &self.inner;
        let config = &inner.config;
        let started = Instant::now();
        // A blocking acquire waits under its own bound and takes a held slot only once
        // granted, so waiters on one hot key never starve acquires of other keys.
        let queued = match wait {
            Some(_) => Some(waiting_slot(&inner.waiting, config.max_waiting)?),
            None => None,
        };
        let mut slot = match queued {
            Some(_) => None,
            None => Some(held_slot(&inner.slots, config.max_held)?),
        };
        let name = config.name(key);
        let lock_name = names::lock_name(&name);
        let deadline = wait.map(|wait| started + wait);
        let locked = match config.locking {
            Locking::GetLock => self.get_lock(&lock_name, ttl, deadline).await?,
            Locking::Row => self.lock_row(name.as_bytes(), ttl, deadline).await?,
        };
        let mut conn = match locked {
            Locked::Granted(conn) => conn,
            Locked::Busy(Some(conn)) => {
                inner.idle.push(conn, config.idle_connections);
                return Ok(None);
            }
            Locked::Busy(None) => return Ok(None),
        };
        drop(queued);
        let slot = match slot.take() {
            Some(slot) => slot,
            // Dropping `conn` closes the session, which frees the lock.
            None => held_slot(&inner.slots, config.max_held)?,
        };
        // The server's idle timer restarts when a statement on the session completes: a
        // deadline counted from before one is sent is conservative. A single attempt
        // counts from the call's start; one that waited, from a statement sent after the
        // wait (the grant's record, or for a row lock, its check).
        let sent = match wait {
            Some(_) => Instant::now(),
            None => started,
        };
        let owner = OwnerId::random();
        let holder = holder_text(owner, label);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let record = sqlx::query(AssertSqlSafe(inner.sql.grant.as_str()))
            .bind(name.as_bytes())
            .bind(&holder)
            .bind(conn.id)
            .bind(ttl_ms)
            .bind(&holder)
            .bind(conn.id)
            .bind(ttl_ms);
        let limit = config.request_timeout;
        let recorded = match config.locking {
            // On the session: the statement that restarts its idle timer.
            Locking::GetLock => {
                bounded_for(
                    config,
                    limit,
                    "record the grant",
                    record.execute(&mut conn.conn),
                )
                .await?
            }
            // On a shared connection: the lock's transaction must not commit it. After a
            // wait, a check on the session first restarts its idle timer.
            Locking::Row => {
                if wait.is_some() {
                    held::check_row(inner, &mut conn).await.map_err(|e| {
                        LockError::Unavailable {
                            message: format!(
                                "the lock's session failed right after its grant: {e}"
                            ),
                            source: None,
                        }
                    })?;
                }
                bounded_for(
                    config,
                    limit,
                    "record the grant",
                    record.execute(&inner.pool),
                )
                .await?
            }
        };
        let token = recorded.last_insert_id();
        if token == 0 {
            return Err(LockError::backend(format!(
                "the fencing counter of {name:?} on {} returned no value",
                config.endpoint()
            )));
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
            path: lock_name.clone(),
            id: 0,
            revision: 0,
        })
        .with_tie(tie);
        let (tasks, requests) = mpsc::channel(4);
        let entry = Arc::new(Entry {
            key: key.clone(),
            token: FencingToken(token),
            tasks,
            lost,
        });
        let task = HeldTask {
            inner: Arc::downgrade(&self.inner),
            owner,
            entry: Arc::downgrade(&entry),
            name,
            lock_name,
            ttl,
            promised: sent + ttl,
            locking: config.locking,
            lost: entry.lost.clone(),
            slot: Some(slot),
        };
        // No await between here and the return: once in the map, the lease is ours.
        inner.held.insert(owner, entry);
        tokio::spawn(task.run(conn, requests, dropped));
        Ok(Some(lease))
    }
}

impl MySqlLock {
    /// Which of `names`' rows are locked now (row locks): see [`sql::probe_rows`].
    ///
    /// # Cancel safety
    /// Cancel-safe: the probe's transaction is rolled back before its connection is used
    /// again.
    pub(crate) async fn rows_held(&self, names: &[&[u8]]) -> Result<Vec<Vec<u8>>, LockError> {
        let config = &self.inner.config;
        let probe = sql::probe_rows(&config.rows_table(), names, self.inner.mariadb);
        // A transaction of sqlx's: rolled back however the probe ends, before its
        // connection serves anything else.
        let mut tx = bounded_for(
            config,
            config.connect_timeout,
            "inspect",
            self.inner.pool.begin(),
        )
        .await?;
        let rows = bounded_for(
            config,
            config.request_timeout,
            "inspect",
            sqlx::raw_sql(AssertSqlSafe(probe)).fetch_all(&mut *tx),
        )
        .await?;
        let _ = tx.rollback().await;
        let get = |e| map_err(config, "inspect", e);
        let (mut free, mut present) = (Vec::new(), Vec::new());
        for row in &rows {
            match row.try_get::<Vec<u8>, _>("free") {
                Ok(name) => free.push(name),
                Err(_) => present.push(row.try_get::<Vec<u8>, _>("present").map_err(get)?),
            }
        }
        present.retain(|name| !free.contains(name));
        Ok(present)
    }

    /// `inspect` of a row lock: the recorded grant of a row that is locked now (another
    /// program's lock of the row, with no record of tenure's, is a foreign holder).
    async fn inspect_row(&self, name: &str) -> Result<Option<HolderInfo>, LockError> {
        let config = &self.inner.config;
        if self.rows_held(&[name.as_bytes()]).await?.is_empty() {
            return Ok(None);
        }
        let row = bounded_for(
            config,
            config.request_timeout,
            "inspect",
            sqlx::query(AssertSqlSafe(self.inner.sql.record.as_str()))
                .bind(name.as_bytes())
                .fetch_optional(&self.inner.pool),
        )
        .await?;
        let Some(row) = row else {
            return Ok(Some(foreign_holder(format!("row {name:?}"))));
        };
        let get = |e| map_err(config, "inspect", e);
        let holder: String = row.try_get(0).map_err(get)?;
        let token: u64 = row.try_get(1).map_err(get)?;
        let ttl_ms: u64 = row.try_get(3).map_err(get)?;
        let idle_s: Option<i64> = row.try_get(4).map_err(get)?;
        let (owner, label) = parse_holder_text(&holder)?;
        Ok(Some(HolderInfo {
            owner,
            label,
            foreign: false,
            token: Some(FencingToken(token)),
            remaining: time_left(ttl_ms, idle_s),
        }))
    }
}

/// What is left of a TTL after its session's idle time (whole seconds, as the server
/// shows it), if the server shows it.
pub(crate) fn time_left(ttl_ms: u64, idle_s: Option<i64>) -> Option<Duration> {
    let idle = u64::try_from(idle_s?).unwrap_or(0).saturating_mul(1000);
    Some(Duration::from_millis(ttl_ms.saturating_sub(idle)))
}

/// A holder with no record of tenure's, named by what holds it.
fn foreign_holder(what: String) -> HolderInfo {
    HolderInfo {
        owner: OwnerId::derived(what.as_bytes()),
        label: None,
        foreign: true,
        token: None,
        remaining: None,
    }
}

#[async_trait]
impl DistributedLock for MySqlLock {
    /// # Cancel safety
    /// Cancel-safe: a dropped attempt closes its connection, and the server frees a lock
    /// it granted with the session.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.attempt(key, ttl, None, None).await
    }

    /// Waits in the server (`GET_LOCK` with the time left), so a release wakes a waiter
    /// with no polling; the server promises no order among waiters. Transient connection
    /// errors are retried with backoff within the wait.
    ///
    /// # Cancel safety
    /// As `try_acquire`: a dropped wait closes its connection, which ends the wait (and
    /// frees a lock granted just then).
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let label = opts.label.as_deref();
        wait_in_server(
            opts,
            |wait| self.attempt(key, opts.ttl, label, wait),
            // The server rounds a wait (MySQL: up to whole seconds): if it still returned
            // before ours, wait again for what is left of ours.
            |_, _, deadline| deadline.saturating_duration_since(Instant::now()) > ROUNDING,
        )
        .await
    }

    /// Each key in turn, then a wait for whichever is freed first.
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire), for each key.
    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        tenure_api::backend::acquire_each(self, keys, opts).await
    }

    /// Checks on the holding session that it still holds the lock, and sets its
    /// `wait_timeout` for `ttl`.
    ///
    /// # Cancel safety
    /// `lease` is unchanged if the future is dropped; the session may have been given the
    /// new `wait_timeout` (which only lengthens our own hold).
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
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
                    .unwrap_or_else(|| "the holding session was already lost".into()),
            )
        };
        let sent = Instant::now();
        let (reply, answer) = oneshot::channel();
        if entry.tasks.send(Request::Extend(ttl, reply)).await.is_err() {
            return Err(gone(&entry));
        }
        answer.await.map_err(|_| gone(&entry))??;
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    /// `RELEASE_LOCK` on the holding session. [`ReleaseOutcome::NotHeld`] if this client
    /// does not hold the lease or the server had already ended the session;
    /// [`LockError::Unavailable`] if the server did not answer (the connection is closed,
    /// so the server frees the lock when it notices).
    ///
    /// # Cancel safety
    /// Cancel-safe: once the first poll has taken the lease from this client's table, the
    /// lock is freed either way — by the release its task completes, or, if the future is
    /// dropped before the task was handed the release, by closing the connection.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(entry) = self.inner.held.find(&lease, true) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let (reply, answer) = oneshot::channel();
        if entry.tasks.send(Request::Release(reply)).await.is_err() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        drop(entry);
        answer.await.unwrap_or(Ok(ReleaseOutcome::NotHeld))
    }

    /// The session holding `key`'s lock, with the grant tenure recorded for it (owner,
    /// label, token, and the time left from the session's idle time, in whole seconds).
    /// A session that holds the lock with no record of tenure's (another program's
    /// `GET_LOCK`) is a foreign holder named by its connection id.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let inner = &self.inner;
        let config = &inner.config;
        let name = config.name(key);
        if config.locking == Locking::Row {
            return self.inspect_row(&name).await;
        }
        let lock_name = names::lock_name(&name);
        // A grant is recorded just after `GET_LOCK` returns: a holder whose record names
        // another session may be one being recorded now, so look again before calling it
        // foreign.
        let mut tries = 0;
        let (session, holder, token, recorded, ttl_ms, idle_s) = loop {
            let row = bounded_for(
                config,
                config.request_timeout,
                "inspect",
                sqlx::query(AssertSqlSafe(inner.sql.inspect.as_str()))
                    .bind(&lock_name)
                    .bind(&lock_name)
                    .bind(name.as_bytes())
                    .fetch_one(&inner.pool),
            )
            .await?;
            let get = |e| map_err(config, "inspect", e);
            let Some(session) = row.try_get::<Option<u64>, _>(0).map_err(get)? else {
                return Ok(None);
            };
            let recorded: Option<u64> = row.try_get(3).map_err(get)?;
            tries += 1;
            if recorded == Some(session) || tries == INSPECT_TRIES {
                let holder: Option<String> = row.try_get(1).map_err(get)?;
                let token: Option<u64> = row.try_get(2).map_err(get)?;
                let ttl_ms: Option<u64> = row.try_get(4).map_err(get)?;
                let idle_s: Option<i64> = row.try_get(5).map_err(get)?;
                break (session, holder, token, recorded, ttl_ms, idle_s);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        match holder {
            Some(holder) if recorded == Some(session) => {
                let (owner, label) = parse_holder_text(&holder)?;
                Ok(Some(HolderInfo {
                    owner,
                    label,
                    foreign: false,
                    token: token.map(FencingToken),
                    remaining: ttl_ms.and_then(|ttl| time_left(ttl, idle_s)),
                }))
            }
            _ => Ok(Some(foreign_holder(format!("mysql-connection:{session}")))),
        }
    }

    /// A session's named lock or row lock: expiry by the server ending an idle session
    /// (`wait_timeout`, counted on its monotonic timer), waiters in the server with no
    /// promised order, tokens from a committed counter.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "mysql",
            fencing: FencingKind::Sequence,
            expiry: ExpiryKind::ConnectionTransaction,
            replication: Replication::SingleNode,
            wait: WaitKind::Push,
            fairness: Fairness::None,
            failures_tolerated: 0,
            clock_dependent: false,
            labels: true,
            shared: false,
        }
    }
}

/// What a lock statement came to.
enum Locked {
    /// Granted on this connection.
    Granted(Dedicated),
    /// Held by another (or the wait ran out); the connection, if it is clean for reuse.
    Busy(Option<Dedicated>),
}

/// Whether a row lock's error says another transaction holds the row.
fn row_busy(error: &sqlx::Error) -> bool {
    matches!(
        error::number(error),
        Some(sql::LOCK_NOWAIT | sql::LOCK_WAIT_TIMEOUT)
    )
}

/// Rolls back the lock transaction a busy row left open: the connection, clean for
/// reuse, or `None` if the rollback failed (it is then closed).
///
/// # Cancel safety
/// Dropped midway, the connection is closed.
async fn busy(inner: &Inner, mut conn: Dedicated) -> Option<Dedicated> {
    (held::rollback(inner, &mut conn).await == held::Released::Yes).then_some(conn)
}

/// How many times `inspect` reads a holder whose record names another session.
const INSPECT_TRIES: u32 = 3;

/// Below this much of a wait left, a `GET_LOCK` that returned 0 ends the acquire.
const ROUNDING: Duration = Duration::from_millis(20);
