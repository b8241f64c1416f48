//! The lock and the work in one transaction: a grant whose lock transaction the caller
//! writes in, committed or rolled back with the lock.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use sqlx::postgres::PgConnection;
use sqlx::{Acquire, AssertSqlSafe, Connection, Executor};
use tenure_api::{AcquireOptions, FencingToken, LockError, LockKey, OwnerId};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::client::{discard, Dedicated};
use crate::held::{refresh, Request};
use crate::{Inner, PgLock};

/// A held lock whose transaction is the caller's: statements run on
/// [`connection`](Self::connection) commit or roll back together with the lock, so the
/// lock is the ground truth and the work needs no fencing (the token is still issued).
///
/// From [`PgLock::transaction`]. [`commit`](Self::commit) commits the work and ends the
/// lease in one `COMMIT`; [`rollback`](Self::rollback), or dropping it, rolls both back.
/// The lease's loss is the transaction's loss: the server ends a transaction idle (between
/// statements) for longer than its TTL ([`extend`](Self::extend) re-arms it), a terminated
/// backend or a closed connection ends it, and then the next statement or `commit` fails
/// with nothing committed. No loss is pushed while the caller holds the connection.
///
/// sqlx sees the connection inside a transaction: `connection().begin()` opens a
/// savepoint, whose `commit` releases it and whose drop rolls back to it — the lock's
/// transaction goes on. Do not run `COMMIT` or `ROLLBACK` yourself: that would end the
/// lock early, and `commit` refuses to commit a transaction that is no longer the lock's.
/// The connection is closed when the transaction ends, never reused, so nothing of its
/// session (settings, temporary tables, `LISTEN`s) outlives it.
pub struct LockedTransaction {
    inner: Arc<Inner>,
    /// `None` only once committed or rolled back.
    conn: Option<Dedicated>,
    /// The held-lock slot (`max_held`), given back with the connection.
    _slot: Option<OwnedSemaphorePermit>,
    key: LockKey,
    /// The key's row key (its holder record's key).
    row_key: String,
    owner: OwnerId,
    token: FencingToken,
    /// The lock transaction's id (digits only: it is written into the commit's check).
    xid: String,
    /// The lock connection's backend pid.
    pid: i64,
}

impl std::fmt::Debug for LockedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedTransaction")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .field("xid", &self.xid)
            .finish_non_exhaustive()
    }
}

impl PgLock {
    /// Waits up to `opts.wait` for `key` as [`acquire`](tenure_api::DistributedLock::acquire)
    /// does, and hands over the grant's open transaction, for the caller's work to commit
    /// or roll back with the lock (see [`LockedTransaction`]). Counts against `max_held`
    /// until it ends. With `locking=lease`, which holds no transaction,
    /// [`LockError::Config`].
    ///
    /// ```no_run
    /// # async fn order(lock: tenure_postgres::PgLock) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tenure_api::{AcquireOptions, LockKey};
    /// let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::ZERO);
    /// let mut tx = lock.transaction(&LockKey::new("orders/1001")?, &opts).await?;
    /// let conn = tx.connection()?;
    /// sqlx::query("UPDATE orders SET status = 'paid' WHERE id = 1001").execute(&mut *conn).await?;
    /// sqlx::query("INSERT INTO order_events (order_id, event) VALUES (1001, 'paid')")
    ///     .execute(&mut *conn)
    ///     .await?;
    /// tx.commit().await?; // the work and the lock's end, in one COMMIT
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// As `acquire`; a transaction dropped while it is handed over is rolled back.
    pub async fn transaction(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<LockedTransaction, LockError> {
        if self.leases() {
            return Err(LockError::Config(
                "PgLock::transaction needs locking=row or locking=advisory: a locking=lease \
                 lease holds no transaction"
                    .into(),
            ));
        }
        let lease = tenure_api::DistributedLock::acquire(self, key, opts).await?;
        let gone = || {
            LockError::lost(format!(
                "the lock transaction of `{key}` ended as it was granted"
            ))
        };
        let entry = self.inner.held.find(&lease, true).ok_or_else(gone)?;
        let (reply, answer) = oneshot::channel();
        entry
            .tasks
            .send(Request::HandOver(reply))
            .await
            .map_err(|_| gone())?;
        let xid = entry.xid.clone();
        drop(entry);
        let (conn, slot) = answer.await.map_err(|_| gone())?;
        // The lease's task has ended: dropping the lease now touches nothing.
        let (owner, token) = (lease.owner(), lease.token());
        let (row_key, pid) = (lease.handle().path.clone(), lease.handle().id);
        drop(lease);
        let mut locked = LockedTransaction {
            inner: self.inner.clone(),
            conn: Some(conn),
            _slot: slot,
            key: key.clone(),
            row_key,
            owner,
            token,
            xid,
            pid,
        };
        if locked.xid.is_empty() || !locked.xid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(LockError::backend(format!(
                "the server named the lock transaction {:?}",
                locked.xid
            )));
        }
        // sqlx sent none of the lock transaction's `BEGIN`: tell it the connection is in a
        // transaction (a savepoint it never ends), so that the caller's `begin()` nests as
        // a savepoint instead of ending the lock's transaction with its `COMMIT`.
        let config = &self.inner.config;
        let nested: Result<(), LockError> = {
            let conn = locked.connection()?;
            let begun = tokio::time::timeout(
                config.request_timeout,
                conn.begin_with("SAVEPOINT tenure_lock"),
            )
            .await;
            match begun {
                Ok(Ok(savepoint)) => {
                    std::mem::forget(savepoint);
                    Ok(())
                }
                Ok(Err(e)) => Err(LockError::lost(format!("the lock transaction ended: {e}"))),
                Err(_) => Err(LockError::no_reply(
                    "savepoint",
                    &config.endpoint(),
                    config.request_timeout,
                )),
            }
        };
        nested.map(|()| locked)
    }
}

impl LockedTransaction {
    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The holder's owner id, as `inspect` reports it.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// The grant's fencing token, for stores outside this transaction.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The connection whose open transaction holds the lock: run the work on it
    /// (`sqlx::query(…).execute(&mut *conn)`). A connection the server closed fails the
    /// statement; it is never replaced by another (which would run outside the lock).
    pub fn connection(&mut self) -> Result<&mut PgConnection, LockError> {
        let conn = self.conn.as_mut().ok_or_else(ended)?;
        // The listener has its connection (only a notification read could drop it, and
        // none is made): acquiring it is ready at once.
        match conn.listener().acquire().now_or_never() {
            Some(Ok(conn)) => Ok(conn),
            _ => Err(LockError::lost("the lock transaction's connection is gone")),
        }
    }

    /// Locks, in this transaction, the row of the caller's own `table` (`name` or
    /// `schema.name`, plain identifiers) whose `column` equals `value`: `SELECT 1 FROM
    /// table WHERE column = $1 FOR UPDATE NOWAIT` — the seed's "row lock as the ground
    /// truth" — held until the transaction ends. `Ok(false)` when no row matches;
    /// [`LockError::Timeout`] when another transaction holds the row; the statement runs
    /// in a savepoint, so neither ends this transaction. A name that is not a plain
    /// identifier is [`LockError::InvalidInput`].
    ///
    /// # Cancel safety
    /// Dropped, the row may or may not be locked (held until the transaction ends, as it
    /// would be anyway) and a savepoint of its may be left open, which changes nothing the
    /// transaction commits. A statement that gets no reply within the request timeout
    /// ends the transaction (its connection is closed): [`LockError::LeaseLost`].
    pub async fn lock_row<V>(
        &mut self,
        table: &str,
        column: &str,
        value: V,
    ) -> Result<bool, LockError>
    where
        V: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        let mut parts = table.splitn(2, '.').collect::<Vec<_>>();
        let name = parts.pop().unwrap_or_default();
        let mut quoted = Vec::new();
        for (what, ident) in parts
            .iter()
            .map(|s| ("schema", *s))
            .chain([("table", name), ("column", column)])
        {
            crate::validate_ident(what, ident, 63).map_err(|e| match e {
                LockError::Config(m) => LockError::InvalidInput(m),
                e => e,
            })?;
            quoted.push(format!("\"{ident}\""));
        }
        let column = quoted.pop().unwrap_or_default();
        let table = quoted.join(".");
        let sql = format!("SELECT 1 FROM {table} WHERE {column} = $1 FOR UPDATE NOWAIT");
        let config = self.inner.config.clone();
        let limit = config.request_timeout;
        // A savepoint of its own name, in raw statements sqlx does not track, so that no
        // later savepoint of sqlx's can be confused with it.
        let conn = self.connection()?;
        let tried = tokio::time::timeout(limit, async {
            conn.execute("SAVEPOINT tenure_row").await?;
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(value)
                .fetch_optional(&mut *conn)
                .await;
            let end = match row {
                Ok(_) => "RELEASE SAVEPOINT tenure_row",
                Err(_) => "ROLLBACK TO SAVEPOINT tenure_row; RELEASE SAVEPOINT tenure_row",
            };
            conn.execute(sqlx::raw_sql(end)).await?;
            Ok::<_, sqlx::Error>(row)
        })
        .await;
        let key = self.key.clone();
        let lost = |e: &dyn std::fmt::Display| {
            LockError::lost(format!("the lock transaction of `{key}` ended: {e}"))
        };
        match tried {
            Ok(Ok(Ok(row))) => Ok(row.is_some()),
            Ok(Ok(Err(e))) => match crate::error::sqlstate(&e).as_deref() {
                Some(crate::error::LOCK_NOT_AVAILABLE) => Err(LockError::Timeout {
                    waited: Duration::ZERO,
                }),
                _ => Err(crate::error::map_err(&config, "lock row", e)),
            },
            // The savepoint or its end failed: the transaction is not usable any more.
            Ok(Err(e)) => {
                self.end();
                Err(lost(&e))
            }
            Err(_) => {
                self.end();
                Err(lost(&format!("no reply within {limit:?}")))
            }
        }
    }

    /// Closes the connection (the server rolls back and frees the lock): what a
    /// transaction left in an unknown state gets.
    fn end(&mut self) {
        if let Some(conn) = self.conn.take() {
            discard(conn);
        }
    }

    /// Re-arms the server's idle timer with `ttl` (the longest pause between statements
    /// before the server ends the transaction and the lock), checking the transaction is
    /// still the lock's. [`LockError::LeaseLost`] when it is not.
    ///
    /// # Cancel safety
    /// Cancel-safe: the timer is re-armed or not.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), LockError> {
        tenure_api::validate_ttl(ttl)?;
        let conn = self.conn.as_mut().ok_or_else(ended)?;
        refresh(conn, ttl, &self.xid, &self.inner.config).await?;
        // Keep inspect's time left (and the doctor's idea of stale) right.
        let lock = PgLock {
            inner: self.inner.clone(),
        };
        lock.record_ttl(&self.row_key, ttl, &self.xid).await;
        Ok(())
    }

    /// Commits the work and ends the lease, in one `COMMIT` after a check that the
    /// transaction is still the lock's. [`LockError::LeaseLost`] when the server refused:
    /// the transaction had ended (idle past its TTL, terminated) or failed (an earlier
    /// statement's error), and nothing of it is committed. [`LockError::Unavailable`]
    /// when no answer came: the work may or may not be committed.
    ///
    /// # Cancel safety
    /// Dropped, the connection closes: committed or not, as the server got the `COMMIT`.
    pub async fn commit(mut self) -> Result<(), LockError> {
        let mut conn = self.conn.take().ok_or_else(ended)?;
        let config = &self.inner.config;
        // `xid` is digits only. In one simple query: an error in the check skips the
        // `COMMIT`, also in a transaction already ended (the check then runs alone).
        let sql = format!(
            "DO $$ BEGIN IF pg_current_xact_id_if_assigned()::text IS DISTINCT FROM '{}' THEN \
             RAISE EXCEPTION USING ERRCODE = 'TN001', MESSAGE = 'not the lock transaction {}'; \
             END IF; END $$; COMMIT",
            self.xid, self.xid
        );
        let committed = tokio::time::timeout(
            config.request_timeout,
            conn.listener().execute(sqlx::raw_sql(AssertSqlSafe(sql))),
        )
        .await;
        // Never reused: the caller may have changed its session.
        discard(conn);
        match committed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(sqlx::Error::Database(refused))) if lock_ended(refused.code().as_deref()) => {
                Err(LockError::lost(format!(
                    "the lock transaction of `{}` was not committed (nothing of it was): {}",
                    self.key,
                    refused.message()
                )))
            }
            Ok(Err(e @ sqlx::Error::Database(_))) => Err(LockError::Backend {
                message: format!(
                    "the work under `{}` was not committed (nor was anything of it), and \
                     the lock is free",
                    self.key
                ),
                source: Some(Box::new(e)),
            }),
            Ok(Err(e)) => Err(LockError::Unavailable {
                message: format!(
                    "commit on {}: the connection failed ({e}); the work may or may not \
                         be committed",
                    config.endpoint()
                ),
                source: None,
            }),
            Err(_) => Err(LockError::Unavailable {
                message: format!(
                    "commit on {}: no reply within {:?}; the work may or may not be \
                         committed",
                    config.endpoint(),
                    config.request_timeout
                ),
                source: None,
            }),
        }
    }

    /// Rolls the work back and ends the lease.
    ///
    /// # Cancel safety
    /// Dropped, the connection closes, which rolls back too.
    pub async fn rollback(mut self) -> Result<(), LockError> {
        let mut conn = self.conn.take().ok_or_else(ended)?;
        let limit = self.inner.config.request_timeout;
        let _ = tokio::time::timeout(limit, conn.listener().execute("ROLLBACK")).await;
        // Closed, never reused (see `LockedTransaction`): a failed `ROLLBACK` ends it too.
        discard(conn);
        Ok(())
    }
}

impl Drop for LockedTransaction {
    /// Neither committed nor rolled back: the connection closes, and the server rolls the
    /// transaction back and frees the lock — at once, also while a statement of the
    /// caller's still runs on it (cancelled through the pool). Without a Tokio runtime
    /// the socket cannot be closed, and the server frees the lock at the idle timeout.
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        discard(conn);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (lock, pid, xid) = (
            PgLock {
                inner: self.inner.clone(),
            },
            self.pid,
            self.xid.clone(),
        );
        runtime.spawn(async move {
            // Only while the transaction is still ours: its backend is then ours too.
            let cancel = "SELECT pg_cancel_backend($1::int) \
                          WHERE pg_xact_status($2::text::xid8) = 'in progress'";
            if let Ok(mut conn) = lock.pooled().await {
                let sent = sqlx::query(cancel).bind(pid).bind(xid).execute(&mut *conn);
                let _ = tokio::time::timeout(lock.inner.config.request_timeout, sent).await;
            }
        });
    }
}

/// Whether a refused commit means the lock's transaction had ended or failed: the
/// commit's own check (`TN001`, a code of its own, so a caller's `RAISE` in a deferred
/// trigger is not taken for it), a transaction aborted by an earlier error (`25P02`), the
/// idle timeout (`25P03`), a terminated session (class `57`) or a broken connection
/// (class `08`). Anything else is the work's own failure at commit (a deferred
/// constraint, a serialization failure).
fn lock_ended(code: Option<&str>) -> bool {
    code.is_some_and(|c| {
        matches!(c, "TN001" | "25P02" | "25P03") || c.starts_with("57") || c.starts_with("08")
    })
}

fn ended() -> LockError {
    LockError::lost("the lock transaction was already committed or rolled back")
}
