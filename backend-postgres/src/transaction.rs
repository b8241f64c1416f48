//! The lock and the work in one transaction: a grant whose lock transaction the caller
//! writes in, committed or rolled back with the lock.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use sqlx::postgres::PgConnection;
use sqlx::{Acquire, AssertSqlSafe, Executor};
use tenure_api::{AcquireOptions, FencingToken, LockError, LockKey, OwnerId};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::client::{discard, rollback_and_recycle, Dedicated};
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
/// Do not run `COMMIT` or `ROLLBACK` on the connection yourself (savepoints are fine):
/// that would end the lock early, and `commit` refuses to commit a transaction that is no
/// longer the lock's.
pub struct LockedTransaction {
    inner: Arc<Inner>,
    /// `None` only once committed or rolled back.
    conn: Option<Dedicated>,
    /// The held-lock slot (`max_held`), given back with the connection.
    _slot: Option<OwnedSemaphorePermit>,
    key: LockKey,
    owner: OwnerId,
    token: FencingToken,
    /// The lock transaction's id (digits only: it is written into the commit's check).
    xid: String,
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
        let entry = self.entry(&lease, true).ok_or_else(gone)?;
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
        drop(lease);
        if xid.is_empty() || !xid.bytes().all(|b| b.is_ascii_digit()) {
            discard(conn);
            return Err(LockError::backend(format!(
                "the server named the lock transaction {xid:?}"
            )));
        }
        Ok(LockedTransaction {
            inner: self.inner.clone(),
            conn: Some(conn),
            _slot: slot,
            key: key.clone(),
            owner,
            token,
            xid,
        })
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

    /// Re-arms the server's idle timer with `ttl` (the longest pause between statements
    /// before the server ends the transaction and the lock), checking the transaction is
    /// still the lock's. [`LockError::LeaseLost`] when it is not.
    ///
    /// # Cancel safety
    /// Cancel-safe: the timer is re-armed or not.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), LockError> {
        tenure_api::validate_ttl(ttl)?;
        let conn = self.conn.as_mut().ok_or_else(ended)?;
        refresh(conn, ttl, &self.xid, &self.inner.config).await
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
             RAISE EXCEPTION 'not the lock transaction {}'; END IF; END $$; COMMIT",
            self.xid, self.xid
        );
        let committed = tokio::time::timeout(
            config.request_timeout,
            conn.listener().execute(sqlx::raw_sql(AssertSqlSafe(sql))),
        )
        .await;
        match committed {
            Ok(Ok(_)) => {
                PgLock::recycle(&self.inner, conn);
                Ok(())
            }
            Ok(Err(sqlx::Error::Database(refused))) => {
                discard(conn);
                Err(LockError::lost(format!(
                    "the lock transaction of `{}` was not committed (nothing of it was): {}",
                    self.key,
                    refused.message()
                )))
            }
            Ok(Err(e)) => {
                discard(conn);
                Err(LockError::Unavailable {
                    message: format!(
                        "commit on {}: the connection failed ({e}); the work may or may not \
                         be committed",
                        config.endpoint()
                    ),
                    source: None,
                })
            }
            Err(_) => {
                discard(conn);
                Err(LockError::Unavailable {
                    message: format!(
                        "commit on {}: no reply within {:?}; the work may or may not be \
                         committed",
                        config.endpoint(),
                        config.request_timeout
                    ),
                    source: None,
                })
            }
        }
    }

    /// Rolls the work back and ends the lease.
    ///
    /// # Cancel safety
    /// Dropped, the connection closes, which rolls back too.
    pub async fn rollback(mut self) -> Result<(), LockError> {
        let conn = self.conn.take().ok_or_else(ended)?;
        rollback_and_recycle(&self.inner, conn).await;
        Ok(())
    }
}

impl Drop for LockedTransaction {
    /// Neither committed nor rolled back: the connection closes, and the server rolls the
    /// transaction back and frees the lock.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            discard(conn);
        }
    }
}

fn ended() -> LockError {
    LockError::lost("the lock transaction was already committed or rolled back")
}
