//! Connections: the autocommit pool, and the dedicated connections that hold locks
//! (opened, cached for reuse, closed).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor};
use tenure_api::LockError;

use crate::error::{bounded_for, client_check_rejected, map_err};
use crate::sql::SESSION_SETTINGS;
use crate::{Inner, PgConfig, PgLock};
use tenure_api::backend::Socket;

/// A pool connection idle for longer is pinged before use. sqlx pings every connection as
/// it goes back to the pool, so one used moments ago needs no second round trip.
const POOL_PING_AFTER_IDLE: Duration = Duration::from_secs(1);
/// For how long after a pool connection failed every pool connection is pinged before use.
const POOL_PING_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// When something last failed, readable from the pool's `before_acquire` hook.
#[derive(Debug)]
pub(crate) struct RecentFailure {
    epoch: Instant,
    /// Milliseconds after `epoch` plus one; 0 = never.
    at: AtomicU64,
}

impl RecentFailure {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            at: AtomicU64::new(0),
        }
    }

    pub(crate) fn mark(&self) {
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

/// The autocommit pool (row insert, fence + holder record, inspect, migration). Its
/// connections are pinged before use only when idle for a while or after a recent failure.
pub(crate) fn autocommit_pool(
    config: &PgConfig,
    options: PgConnectOptions,
    failed: Arc<RecentFailure>,
) -> PgPool {
    PgPoolOptions::new()
        .max_connections(config.pool_size)
        .min_connections(0)
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Some(Duration::from_secs(60)))
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let ping = meta.idle_for >= POOL_PING_AFTER_IDLE || failed.is_recent();
            Box::pin(async move {
                if ping {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(options)
}

/// A dedicated connection. A [`PgListener`] (on a one-connection pool of its own) rather
/// than a bare connection, because its `try_recv` reads the socket while the transaction
/// sits idle: that is how a held lease learns at once that the server closed it.
pub(crate) struct Dedicated {
    listener: PgListener,
    /// Its socket, where it can be found: peeked at to tell a message from the server
    /// from a stale wake-up (see `held::Watch`).
    pub(crate) socket: Option<Socket>,
}

impl Dedicated {
    /// The connection, to run statements on.
    pub(crate) fn listener(&mut self) -> &mut PgListener {
        &mut self.listener
    }
}

/// Why a pool found no connection within `connect_timeout`. The pool retries refusals
/// that may pass ("too many connections", a server starting up, a refused port) quietly
/// until it times out: one direct attempt tells what the server says — or, if it
/// connects, that connecting took too long (an overloaded client or server).
pub(crate) async fn no_connection(config: &PgConfig, options: &PgConnectOptions) -> LockError {
    let started = Instant::now();
    let probe = bounded_for(
        config,
        config.connect_timeout,
        "connect",
        PgConnection::connect_with(options),
    )
    .await;
    match probe {
        Err(refused) => refused,
        Ok(probe) => {
            let took = started.elapsed();
            let _ = tokio::time::timeout(config.request_timeout, probe.close()).await;
            LockError::Unavailable {
                message: format!(
                    "connect on {}: none within {:?}, a direct one took {took:.1?}",
                    config.endpoint(),
                    config.connect_timeout
                ),
                source: None,
            }
        }
    }
}

/// The server's view of where the connection comes from, which is this end's local
/// address unless something (a proxy, NAT) sits between.
const CLIENT_ADDRESS: &str = "SELECT host(inet_client_addr()), inet_client_port()";

impl PgLock {
    /// Runs `future` for at most `request_timeout`, mapping errors.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, LockError> {
        bounded_for(
            &self.inner.config,
            self.inner.config.request_timeout,
            what,
            future,
        )
        .await
    }

    /// Opens a dedicated connection: a listener on a one-connection pool of its own that
    /// never reconnects behind our back. A server that refuses
    /// `client_connection_check_interval` (one that cannot detect closed sockets) is asked
    /// without it from then on.
    pub(crate) async fn open(&self) -> Result<Dedicated, LockError> {
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
                drop(pool.close());
                return Err((no_connection(config, options).await, false));
            }
        };
        conn.eager_reconnect(false);
        conn.ignore_pool_close_event(true);
        // Closing the pool now makes the connection close (not wait in the pool) once the
        // listener lets go of it.
        drop(pool.close());
        let settings = bounded_for(
            config,
            config.request_timeout,
            "connect",
            // To the end of the reply (see `lock_row`).
            sqlx::query(SESSION_SETTINGS).fetch_all(&mut conn),
        );
        settings.await.map_err(|e| (e, false))?;
        let seen = tokio::time::timeout(
            config.request_timeout,
            // To the end of the reply (see `lock_row`).
            sqlx::query_as::<_, (Option<String>, Option<i32>)>(CLIENT_ADDRESS).fetch_all(&mut conn),
        )
        .await
        .map(|rows| rows.map(|rows| rows.into_iter().next()));
        let socket = match seen {
            Ok(Ok(Some((Some(host), Some(port))))) => {
                let local = host.parse::<std::net::IpAddr>().ok();
                match local.zip(u16::try_from(port).ok()) {
                    Some(local) => {
                        let dialled = options.get_port();
                        let (ip, port) = local;
                        let find = move || Socket::find(Some(ip), port, dialled);
                        tokio::task::spawn_blocking(find).await.ok().flatten()
                    }
                    None => None,
                }
            }
            // A Unix-domain socket has no address; a server refusing the query only
            // leaves the watch without its socket.
            Ok(Ok(_)) => None,
            Ok(Err(e)) if e.as_database_error().is_some() => None,
            Ok(Err(e)) => return Err((map_err(config, "connect", e), false)),
            Err(_) => {
                let limit = config.request_timeout;
                return Err((
                    LockError::no_reply("connect", &config.endpoint(), limit),
                    false,
                ));
            }
        };
        Ok(Dedicated {
            listener: conn,
            socket,
        })
    }

    /// The most recently used cached connection, if it was used recently enough.
    pub(crate) fn pop_idle(&self) -> Option<Dedicated> {
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
    pub(crate) fn recycle(inner: &Inner, conn: Dedicated) {
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
    pub(crate) async fn abandon(&self, conn: Dedicated) {
        rollback_and_recycle(&self.inner, conn).await;
    }
}

/// Closes a dedicated connection; the server rolls back whatever transaction it had.
pub(crate) fn discard(conn: Dedicated) {
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
    pub(crate) fn close_idle(&self, close: impl Fn(Instant) -> bool) {
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
pub(crate) async fn close_unused(inner: Weak<Inner>) {
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
pub(crate) async fn rollback_and_recycle(inner: &Inner, mut conn: Dedicated) {
    let limit = inner.config.request_timeout;
    match tokio::time::timeout(limit, conn.listener().execute("ROLLBACK")).await {
        Ok(Ok(_)) => PgLock::recycle(inner, conn),
        _ => discard(conn),
    }
}
