//! Held locks: the task that owns a lock's connection, runs its extensions and its
//! release, and watches the socket in between.

use std::sync::Weak;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Executor};
use tenure_api::backend::{HeldEntry, LossNotice};
use tenure_api::{FencingToken, LeaseDropped, LockError, LockKey, OwnerId, ReleaseOutcome};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::client::Dedicated;
use crate::error::{bounded_for, map_err};
use crate::sql::{relock_row, wait_timeout, CHECK_SAVEPOINT, HOLDS, RELEASE_LOCK};
use crate::{Inner, Locking};

/// How often an idle held connection's socket is peeked at: the longest a session the
/// server ended goes unnoticed (one system call, no round trip).
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// A held lock: what identifies the grant, and the channel to the task that owns its
/// connection.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) key: LockKey,
    pub(crate) token: FencingToken,
    /// Requests to the lock's task; dropping the entry ends the task (and the lock).
    pub(crate) tasks: mpsc::Sender<Request>,
    /// Fired by the task when the session is lost.
    pub(crate) lost: LossNotice,
}

impl HeldEntry for Entry {
    fn key(&self) -> &LockKey {
        &self.key
    }
    fn token(&self) -> FencingToken {
        self.token
    }
}

/// What a held lock's task is asked to do on its connection.
#[derive(Debug)]
pub(crate) enum Request {
    /// Checks the session still holds the lock, with a new `wait_timeout` for a TTL.
    Extend(Duration, oneshot::Sender<Result<(), LockError>>),
    /// `RELEASE_LOCK`, and the connection back to the cache.
    Release(oneshot::Sender<Result<ReleaseOutcome, LockError>>),
}

/// The task that owns a held lock's connection (see the module docs). A session the
/// server ended (its `wait_timeout`, a `KILL`, a restart) fires the lease's
/// [`LossNotice`] within [`WATCH_EVERY`] where the socket was found, else at the next
/// extension; a lease dropped without release frees its lock at once.
pub(crate) struct HeldTask {
    pub(crate) inner: Weak<Inner>,
    pub(crate) owner: OwnerId,
    pub(crate) entry: Weak<Entry>,
    /// The lock's name (the table's key) and its `GET_LOCK` name.
    pub(crate) name: String,
    pub(crate) lock_name: String,
    /// The TTL of the grant or of the last extension (recorded for `inspect`).
    pub(crate) ttl: Duration,
    /// The latest deadline a copy of the lease may hold (a grant's or an extension's,
    /// even one whose caller went away): the session's `wait_timeout` never ends it
    /// sooner.
    pub(crate) promised: Instant,
    /// How the lock is held (what releases and checks it).
    pub(crate) locking: Locking,
    pub(crate) lost: LossNotice,
    /// Given back before a release is answered, so the caller can use it at once.
    pub(crate) slot: Option<OwnedSemaphorePermit>,
}

impl HeldTask {
    pub(crate) async fn run(
        mut self,
        mut conn: Dedicated,
        mut requests: mpsc::Receiver<Request>,
        dropped: LeaseDropped,
    ) {
        let mut watch = tokio::time::interval(WATCH_EVERY);
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                request = requests.recv() => match request {
                    Some(Request::Extend(ttl, reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        let result = self.refresh(&inner, &mut conn, ttl).await;
                        if let Err(e) = &result {
                            self.lose(e.to_string());
                            let _ = reply.send(result);
                            break;
                        }
                        let _ = reply.send(result);
                    }
                    Some(Request::Release(reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        drop(self.slot.take());
                        let outcome = match self.release(&inner, &mut conn).await {
                            Released::Yes => {
                                inner.idle.push(conn, inner.config.idle_connections);
                                let _ = reply.send(Ok(ReleaseOutcome::Released));
                                return;
                            }
                            Released::NotHeld => Ok(ReleaseOutcome::NotHeld),
                            Released::NoReply => Err(LockError::Unavailable {
                                message: format!(
                                    "release on {}: no reply within {:?}; the connection was \
                                     closed, so the server frees the lock when it notices",
                                    inner.config.endpoint(),
                                    inner.config.request_timeout
                                ),
                                source: None,
                            }),
                        };
                        let _ = reply.send(outcome);
                        break;
                    }
                    // The entry is gone: the lease was given up (a release dropped before
                    // it reached this task), or its client was dropped.
                    None => {
                        self.lost.fire(
                            LockError::lost(
                                "the lease was given up (released, or its client dropped): \
                                 its session was closed",
                            )
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
                        if self.release(&inner, &mut conn).await == Released::Yes {
                            inner.idle.push(conn, inner.config.idle_connections);
                            return;
                        }
                    }
                    break;
                }
                _ = watch.tick() => {
                    if conn.ended() {
                        self.lose(LockError::lost(
                            "the server ended the holding session (its wait_timeout ran out, \
                             it was killed, or the server stopped): the lock was freed",
                        ).to_string());
                        break;
                    }
                }
            }
        }
        // Whatever ended the task, the connection closes now: the lock goes with it.
        self.lost
            .fire(LockError::lost("the lock's connection was closed").to_string());
        drop(conn);
    }

    /// Checks that the session still holds the lock, with `wait_timeout` set for `ttl` —
    /// or longer, for a deadline promised before (an extension to a shorter TTL, whose
    /// caller may have gone away, or another copy of the lease). Any failure means the
    /// lock is gone.
    async fn refresh(
        &mut self,
        inner: &Inner,
        conn: &mut Dedicated,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let config = &inner.config;
        let gone = |e: LockError| {
            LockError::lost(format!(
                "the holding session on {} is gone: {e}",
                config.endpoint()
            ))
        };
        let now = Instant::now();
        let keep = ttl.max(self.promised.saturating_duration_since(now));
        conn.set_wait_timeout(config, wait_timeout(keep))
            .await
            .map_err(gone)?;
        match self.locking {
            Locking::GetLock => {
                let holds = bounded_for(
                    config,
                    config.request_timeout,
                    "extend",
                    sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(HOLDS))
                        .bind(&self.lock_name)
                        .fetch_one(&mut conn.conn),
                )
                .await
                .map_err(gone)?;
                if holds != Some(1) {
                    return Err(LockError::lost(format!(
                        "the session no longer holds `{}`",
                        self.lock_name
                    )));
                }
            }
            Locking::Row => check_row(inner, conn).await?,
        }
        self.promised = self.promised.max(now + ttl);
        if ttl != self.ttl {
            // For `inspect`'s time left only: the lock is extended either way.
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            let record = sqlx::query(AssertSqlSafe(inner.sql.record_ttl.as_str()))
                .bind(ttl_ms)
                .bind(self.name.as_bytes())
                .bind(conn.id);
            let recorded = match self.locking {
                Locking::GetLock => record.execute(&mut conn.conn).await,
                // Not in the lock's transaction, which never commits.
                Locking::Row => record.execute(&inner.pool).await,
            };
            // Best effort: a record that could not be written leaves `inspect` the old TTL.
            drop(recorded);
            self.ttl = ttl;
        }
        Ok(())
    }

    /// Gives the lock up on its session: `RELEASE_LOCK`, or the row lock's `ROLLBACK`.
    ///
    /// # Cancel safety
    /// Dropped midway, the lock may or may not be released: close the connection.
    async fn release(&self, inner: &Inner, conn: &mut Dedicated) -> Released {
        match self.locking {
            Locking::GetLock => release_lock(inner, conn, &self.lock_name).await,
            Locking::Row => rollback(inner, conn).await,
        }
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
        if let (Some(inner), Some(entry)) = (self.inner.upgrade(), self.entry.upgrade()) {
            inner.held.forget(self.owner, &entry);
        }
    }
}

/// What `RELEASE_LOCK` or `ROLLBACK` on a lock session came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Released: the connection holds nothing now.
    Yes,
    /// Not this session's, or the session had ended (its locks went with it).
    NotHeld,
    /// No reply in time: the connection must be closed (which frees the lock).
    NoReply,
}

/// `RELEASE_LOCK(name)` on `conn`, bounded by the request timeout.
///
/// # Cancel safety
/// Dropped midway, the lock may or may not be released: close the connection.
async fn release_lock(inner: &Inner, conn: &mut Dedicated, name: &str) -> Released {
    let released = tokio::time::timeout(
        inner.config.request_timeout,
        sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(RELEASE_LOCK))
            .bind(name)
            .fetch_one(&mut conn.conn),
    )
    .await;
    match released {
        Ok(Ok(Some(1))) => Released::Yes,
        Ok(_) => Released::NotHeld,
        Err(_) => Released::NoReply,
    }
}

/// Locks a key's row just inserted, in the lock session's open transaction (a key's
/// first use): `true` locked, `false` busy (another client inserted and locked it first)
/// or gone again.
///
/// # Cancel safety
/// Dropped midway, the outcome is unknown: close the connection.
pub(crate) async fn relock(
    inner: &Inner,
    conn: &mut Dedicated,
    name: &[u8],
) -> Result<bool, LockError> {
    let config = &inner.config;
    let batch = relock_row(&config.rows_table(), name);
    let limit = config.request_timeout;
    let rows = sqlx::raw_sql(AssertSqlSafe(batch)).fetch_all(&mut conn.conn);
    match tokio::time::timeout(limit, rows).await {
        Ok(Ok(rows)) => Ok(rows.len() == 1),
        Ok(Err(e)) if crate::row_busy(&e) => Ok(false),
        Ok(Err(e)) => Err(map_err(config, "lock", e)),
        Err(_) => Err(LockError::no_reply("lock", config.endpoint(), limit)),
    }
}

/// Checks that the row lock's transaction still runs (rolling back to its savepoint keeps
/// the row locked), which also restarts the session's idle timer. Any failure means the
/// lock is gone.
///
/// # Cancel safety
/// Dropped midway, the outcome is unknown: close the connection.
pub(crate) async fn check_row(inner: &Inner, conn: &mut Dedicated) -> Result<(), LockError> {
    let config = &inner.config;
    let checked = bounded_for(
        config,
        config.request_timeout,
        "extend",
        conn.conn.execute(CHECK_SAVEPOINT),
    );
    checked.await.map(drop).map_err(|e| {
        LockError::lost(format!(
            "the lock's transaction on {} has ended: {e}",
            config.endpoint()
        ))
    })
}

/// `ROLLBACK` of the lock session's transaction (a row lock's release, or a busy row's
/// attempt), bounded by the request timeout.
///
/// # Cancel safety
/// Dropped midway, the transaction may or may not be rolled back: close the connection.
pub(crate) async fn rollback(inner: &Inner, conn: &mut Dedicated) -> Released {
    let rolled =
        tokio::time::timeout(inner.config.request_timeout, conn.conn.execute("ROLLBACK")).await;
    match rolled {
        Ok(Ok(_)) => Released::Yes,
        Ok(Err(_)) => Released::NotHeld,
        Err(_) => Released::NoReply,
    }
}
