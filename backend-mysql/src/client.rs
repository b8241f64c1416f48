//! Lock connections: opened with their session settings, found among the process's
//! sockets for the loss watch, cached for reuse while clean.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Executor, Row};
use tenure_api::backend::{Peeked, Socket};
use tenure_api::LockError;

use crate::error::{bounded_for, map_err};
use crate::sql::{session_settings, CLIENT_HOST, SHARED_SESSION};
use crate::MySqlConfig;

/// A connection that holds (or is about to hold) one lock: the session's locks live and
/// die with it.
#[derive(Debug)]
pub(crate) struct Dedicated {
    pub(crate) conn: MySqlConnection,
    /// The session's id (`CONNECTION_ID()`), which the grant's record names.
    pub(crate) id: u64,
    /// Its socket, where it can be found: peeked at to see the server end the session.
    pub(crate) socket: Option<Socket>,
    /// The session's `wait_timeout` now (seconds).
    pub(crate) wait_timeout: u64,
}

impl Dedicated {
    /// Whether the server has already ended this session (as far as can be seen without
    /// a round trip).
    pub(crate) fn ended(&self) -> bool {
        self.socket.is_some_and(|s| s.peek() != Peeked::Nothing)
    }

    /// Sets the session's `wait_timeout` if it differs.
    ///
    /// # Cancel safety
    /// Dropped midway, the setting may or may not have changed: discard the connection.
    pub(crate) async fn set_wait_timeout(
        &mut self,
        config: &MySqlConfig,
        seconds: u64,
    ) -> Result<(), LockError> {
        if self.wait_timeout == seconds {
            return Ok(());
        }
        // Only this setting: the session may hold a row lock's open transaction.
        let set = format!("SET SESSION wait_timeout = {seconds}");
        bounded_for(
            config,
            config.request_timeout,
            "set wait_timeout",
            self.conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(set))),
        )
        .await?;
        self.wait_timeout = seconds;
        Ok(())
    }
}

/// The shared pool: `inspect`, the migration, and for row locks the grants' records, the
/// rows' inserts and the holders' probes. A statement waits at most a second for a row
/// lock (a key's first use, when another client inserted and locked its row meanwhile,
/// is then busy at once, not stuck behind the holder).
pub(crate) fn shared_pool(config: &MySqlConfig) -> MySqlPool {
    session_pool(config.pool_size, SHARED_SESSION)
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Some(Duration::from_secs(60)))
        .connect_lazy_with(config.connect_options().clone())
}

/// Pool options for up to `max` connections, each of which runs `settings` first.
pub(crate) fn session_pool(max: u32, settings: &'static str) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(sqlx::raw_sql(settings)).await?;
                Ok(())
            })
        })
}

/// Opens a lock connection with its session settings, and finds its socket.
///
/// # Cancel safety
/// Cancel-safe: a connection opened so far is closed when dropped.
pub(crate) async fn open(
    config: &MySqlConfig,
    mariadb: bool,
    wait_timeout: u64,
) -> Result<Dedicated, LockError> {
    let dialled = config.connect_options().get_port();
    let scan = move || Socket::connected_to(dialled);
    let before = tokio::task::spawn_blocking(scan).await.unwrap_or_default();
    let mut conn = bounded_for(
        config,
        config.connect_timeout,
        "connect",
        MySqlConnection::connect_with(config.connect_options()),
    )
    .await?;
    let after = tokio::task::spawn_blocking(scan).await.unwrap_or_default();
    let batch = format!("{}; {CLIENT_HOST}", session_settings(mariadb, wait_timeout));
    let rows = bounded_for(
        config,
        config.request_timeout,
        "connect",
        sqlx::raw_sql(sqlx::AssertSqlSafe(batch)).fetch_all(&mut conn),
    )
    .await?;
    let get = |e| map_err(config, "connect", e);
    let row = rows
        .first()
        .ok_or_else(|| LockError::backend("the server did not name this session"))?;
    let id: u64 = row.try_get(0).map_err(get)?;
    let host: Option<String> = row.try_get(1).map_err(get)?;
    // The one new socket to the dialled port; or, when others connected meanwhile, the
    // one whose local address and port the server saw (`host:port` with a literal
    // address: none for a name, a Unix socket, or a proxy's address).
    let seen = host.as_deref().and_then(|h| {
        let (ip, port) = h.rsplit_once(':')?;
        let ip = ip.trim_start_matches('[').trim_end_matches(']');
        Some((
            ip.parse::<IpAddr>().ok()?.to_canonical(),
            port.parse::<u16>().ok()?,
        ))
    });
    let socket = Socket::new_since(&before, &after).or_else(|| {
        let (ip, port) = seen?;
        let mut found = after.iter().filter(|(_, a, p)| *a == ip && *p == port);
        match (found.next(), found.next()) {
            (Some((socket, _, _)), None) => Some(*socket),
            _ => None,
        }
    });
    Ok(Dedicated {
        conn,
        id,
        socket,
        wait_timeout,
    })
}

/// Clean lock connections (holding nothing), newest last, with when each was last used.
#[derive(Debug, Default)]
pub(crate) struct IdleConnections(Mutex<VecDeque<(Dedicated, Instant)>>);

impl IdleConnections {
    /// The newest cached connection the server has not ended (by its socket, or by its
    /// `wait_timeout` having passed).
    pub(crate) fn pop(&self) -> Option<Dedicated> {
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, since)) = idle.pop_back() {
            let limit =
                Duration::from_secs(conn.wait_timeout).saturating_sub(Duration::from_millis(200));
            if since.elapsed() < limit && !conn.ended() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for reuse, up to `max` connections.
    pub(crate) fn push(&self, conn: Dedicated, max: usize) {
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= max {
            idle.pop_front();
        }
        if max > 0 {
            idle.push_back((conn, Instant::now()));
        }
    }

    /// Drops every cached connection (after one of them failed).
    pub(crate) fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}
