//! `locking=lease`: a row per key with its holder, token and an expiry the server computes
//! (`clock_timestamp() + ttl`). Each call is one autocommit statement on the pool; no
//! connection is held between calls, so a client can hold many thousands of leases.
//! Waiters are woken by `NOTIFY` on release (one listening connection per client) and
//! otherwise try again when the holder's lease runs out.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgListener, PgRow, Postgres};
use sqlx::{AssertSqlSafe, Row};
use tenure_api::backend::default_drift;
use tenure_api::{
    AcquireOptions, FencingToken, HolderInfo, Lease, LockError, LockKey, OwnerId, ReleaseOutcome,
};
use tokio::sync::broadcast;

use crate::error::map_err;
use crate::{Inner, PgLock};

/// The most a waiter sleeps between tries when neither a release nor the holder's expiry
/// wakes it sooner (the listening connection may be down; the holder may have extended).
const RECHECK: Duration = Duration::from_secs(5);

/// The released keys this client hears of, from its one listening connection (started
/// by the first wait, stopped with the client).
#[derive(Default)]
pub(crate) struct Releases {
    sender: Mutex<Option<broadcast::Sender<String>>>,
    /// The listening task, aborted when the client goes.
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// When starting to listen last failed: waiters do without it for [`RECHECK`].
    failed: Mutex<Option<Instant>>,
}

impl Drop for Releases {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// A try under way: if it is dropped before its reply was read and understood, the
/// grant it may have taken is given back (by its owner id, the attempt's own) from a task
/// of its own, on the try's own connection, so the give-back lands after the try.
struct Attempt {
    lock: Option<PgLock>,
    conn: Option<PoolConnection<Postgres>>,
    row_key: String,
    owner: OwnerId,
}

impl Attempt {
    /// The reply was read and understood: nothing to give back.
    fn settled(mut self) {
        self.lock = None;
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let armed = (self.lock.take(), self.conn.take());
        let ((Some(lock), Some(mut conn)), Ok(runtime)) =
            (armed, tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let (row_key, owner) = (std::mem::take(&mut self.row_key), self.owner.to_string());
        runtime.spawn(async move {
            let abandon = sqlx::query(AssertSqlSafe(lock.inner.sql.lease.abandon.as_str()))
                .bind(row_key)
                .bind(owner)
                .fetch_optional(&mut *conn);
            let _ = tokio::time::timeout(lock.inner.config.request_timeout, abandon).await;
        });
    }
}

/// What one try found.
enum Tried {
    Granted(Lease),
    /// Held by another, for about this long still (by the server's clock).
    Busy(Option<Duration>),
}

impl PgLock {
    fn lease_error(&self, what: &str, e: sqlx::Error) -> LockError {
        map_err(&self.inner.config, what, e)
    }

    /// One try with a fresh owner: the row is taken if it is free or its lease has run
    /// out, with a new token from the fence sequence, in one statement.
    async fn lease_try(
        &self,
        key: &LockKey,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<Tried, LockError> {
        let owner = OwnerId::random();
        let sent = Instant::now();
        let mut attempt = Attempt {
            lock: Some(self.clone()),
            conn: Some(self.pooled().await?),
            row_key: self.row_key(key),
            owner,
        };
        let Some(conn) = attempt.conn.as_mut() else {
            return Err(LockError::backend("an attempt without its connection"));
        };
        let row = self
            .bounded(
                "acquire",
                sqlx::query(AssertSqlSafe(self.inner.sql.lease.acquire.as_str()))
                    .bind(&attempt.row_key)
                    .bind(owner.to_string())
                    .bind(label)
                    .bind(ttl_ms(ttl))
                    .fetch_one(&mut **conn),
            )
            .await?;
        // Any error until `settled` (no reply within the bound, a broken connection, a
        // reply not understood) may hide a grant: `attempt` gives it back as it goes.
        let tried = self.read_try(&row, key, owner, sent, ttl)?;
        attempt.settled();
        Ok(tried)
    }

    /// What a try's reply says: granted (its lease counted from `sent`) or busy.
    fn read_try(
        &self,
        row: &PgRow,
        key: &LockKey,
        owner: OwnerId,
        sent: Instant,
        ttl: Duration,
    ) -> Result<Tried, LockError> {
        let token: Option<i64> = row.try_get(0).map_err(|e| self.lease_error("acquire", e))?;
        let Some(token) = token else {
            let left: Option<i64> = row.try_get(1).map_err(|e| self.lease_error("acquire", e))?;
            return Ok(Tried::Busy(left.map(millis)));
        };
        let token = u64::try_from(token)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| LockError::backend(format!("fence sequence returned {token}")))?;
        let lease = Lease::new(
            key.clone(),
            owner,
            FencingToken(token),
            sent,
            ttl,
            default_drift(ttl),
        );
        Ok(Tried::Granted(lease))
    }

    pub(crate) async fn lease_try_acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<Option<Lease>, LockError> {
        match self.lease_try(key, ttl, label).await? {
            Tried::Granted(lease) => Ok(Some(lease)),
            Tried::Busy(_) => Ok(None),
        }
    }

    /// Tries until granted or `opts.wait` ends: after a busy try, sleeps until a release
    /// of the key is announced, the holder's lease runs out, or [`RECHECK`]; after a
    /// retryable error, per the backoff.
    pub(crate) async fn lease_acquire(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let started = Instant::now();
        let deadline = opts.wait_deadline(started);
        let row_key = self.row_key(key);
        let mut failures = 0u32;
        loop {
            // Subscribed before the try, so a release right after it is heard.
            let left = deadline.saturating_duration_since(Instant::now());
            let mut released = match left.is_zero() {
                true => None,
                false => Some(self.releases(left).await),
            };
            let tried = self.lease_try(key, opts.ttl, opts.label.as_deref()).await;
            let left = deadline.saturating_duration_since(Instant::now());
            let pause = match tried {
                Ok(Tried::Granted(lease)) => return Ok(lease),
                Ok(Tried::Busy(_)) if left.is_zero() => {
                    return Err(LockError::Timeout {
                        waited: started.elapsed(),
                    })
                }
                Ok(Tried::Busy(holder_left)) => {
                    failures = 0;
                    holder_left.map_or(RECHECK, |l| l + Duration::from_millis(1))
                }
                Err(e) if e.is_retryable() && !left.is_zero() => {
                    failures = failures.saturating_add(1);
                    opts.backoff.delay(failures)
                }
                Err(e) => return Err(e),
            };
            let pause = pause.min(RECHECK).min(left);
            match released.as_mut() {
                Some(Some(heard)) => {
                    let heard = async {
                        loop {
                            match heard.recv().await {
                                Ok(k) if k == row_key => return,
                                Ok(_) => {}
                                // Releases were missed, maybe ours: try now.
                                Err(broadcast::error::RecvError::Lagged(_)) => return,
                                Err(broadcast::error::RecvError::Closed) => {
                                    std::future::pending::<()>().await
                                }
                            }
                        }
                    };
                    let _ = tokio::time::timeout(pause, heard).await;
                }
                _ => tokio::time::sleep(pause).await,
            }
        }
    }

    /// A receiver of the keys released on the server, from this client's listening
    /// connection (started now, within `within`, if it is not running); `None` if it
    /// cannot listen (the waiter then tries again when the holder's lease runs out; no
    /// new start is tried for [`RECHECK`] after a failed one).
    async fn releases(&self, within: Duration) -> Option<broadcast::Receiver<String>> {
        let releases = &self.inner.releases;
        if let Some(sender) = releases
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            return Some(sender.subscribe());
        }
        let failed = *releases
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if failed.is_some_and(|at| at.elapsed() < RECHECK) {
            return None;
        }
        match tokio::time::timeout(within, self.listen()).await {
            Ok(Some(receiver)) => Some(receiver),
            Ok(None) => {
                *releases
                    .failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                None
            }
            // Only the caller's wait ran out: the next waiter starts it again.
            Err(_) => None,
        }
    }

    /// Starts this client's listening connection and task; a receiver of what it hears.
    async fn listen(&self) -> Option<broadcast::Receiver<String>> {
        let releases = &self.inner.releases;
        // A pool of its own (one connection, kept open), so that listening takes nothing
        // from the statements' pool and reconnects after a failure.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.inner.config.connect_timeout)
            .connect_lazy_with(self.inner.unchecked.clone());
        let connect = PgListener::connect_with(&pool);
        let mut listener = tokio::time::timeout(self.inner.config.connect_timeout, connect)
            .await
            .ok()?
            .ok()?;
        let subscribe = listener.listen(&self.inner.sql.lease.channel);
        tokio::time::timeout(self.inner.config.request_timeout, subscribe)
            .await
            .ok()?
            .ok()?;
        let mut slot = releases
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = slot.as_ref() {
            return Some(sender.subscribe()); // another waiter started one meanwhile
        }
        let (sender, receiver) = broadcast::channel(1024);
        *slot = Some(sender.clone());
        drop(slot);
        let task = tokio::spawn(listen(Arc::downgrade(&self.inner), listener, sender));
        *releases.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task.abort_handle());
        Some(receiver)
    }

    /// Pushes the lease's expiry to now + `ttl` (the server's clock) if it is still ours.
    pub(crate) async fn lease_extend(
        &self,
        lease: &mut Lease,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let sent = Instant::now();
        let mut conn = self.pooled().await?;
        let extended = self
            .bounded(
                "extend",
                sqlx::query(AssertSqlSafe(self.inner.sql.lease.extend.as_str()))
                    .bind(self.row_key(lease.key()))
                    .bind(lease.owner().to_string())
                    .bind(token_of(lease))
                    .bind(ttl_ms(ttl))
                    .fetch_optional(&mut *conn),
            )
            .await?;
        if extended.is_none() {
            return Err(LockError::lost(format!(
                "`{}` is no longer held by {}: its lease ran out or was taken over",
                lease.key(),
                lease.owner()
            )));
        }
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    /// Ends the lease if it is still ours, and announces the release to waiters.
    pub(crate) async fn lease_release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let mut conn = self.pooled().await?;
        let released = self
            .bounded(
                "release",
                sqlx::query(AssertSqlSafe(self.inner.sql.lease.release.as_str()))
                    .bind(self.row_key(lease.key()))
                    .bind(lease.owner().to_string())
                    .bind(token_of(&lease))
                    .fetch_optional(&mut *conn),
            )
            .await?;
        Ok(match released {
            Some(_) => ReleaseOutcome::Released,
            None => ReleaseOutcome::NotHeld,
        })
    }

    /// The live holder of each row key, in order.
    pub(crate) async fn lease_inspect_each(
        &self,
        keys: &[LockKey],
    ) -> Result<Vec<Option<HolderInfo>>, LockError> {
        let row_keys: Vec<String> = keys.iter().map(|key| self.row_key(key)).collect();
        let mut conn = self.pooled().await?;
        let rows = self
            .bounded(
                "inspect",
                sqlx::query(AssertSqlSafe(self.inner.sql.lease.inspect_each.as_str()))
                    .bind(&row_keys)
                    .fetch_all(&mut *conn),
            )
            .await?;
        let mut holders = std::collections::HashMap::new();
        for row in rows {
            let key: String = row.try_get(4).map_err(|e| self.lease_error("inspect", e))?;
            holders.insert(key, self.lease_holder(&row)?);
        }
        Ok(row_keys.iter().map(|key| holders.remove(key)).collect())
    }

    /// Every live lease whose row key starts with `row_prefix`, by row key.
    pub(crate) async fn lease_holders(
        &self,
        row_prefix: &str,
    ) -> Result<Vec<(String, HolderInfo)>, LockError> {
        let mut conn = self.pooled().await?;
        let rows = self
            .bounded(
                "list holders",
                sqlx::query(AssertSqlSafe(self.inner.sql.lease.holders.as_str()))
                    .bind(row_prefix)
                    .fetch_all(&mut *conn),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let key = row
                    .try_get(4)
                    .map_err(|e| self.lease_error("list holders", e))?;
                Ok((key, self.lease_holder(row)?))
            })
            .collect()
    }

    /// A holder from a lease row: owner, label, token, milliseconds left.
    fn lease_holder(&self, row: &PgRow) -> Result<HolderInfo, LockError> {
        let get_err = |e| self.lease_error("inspect", e);
        let owner: String = row.try_get(0).map_err(get_err)?;
        let label: Option<String> = row.try_get(1).map_err(get_err)?;
        let token: i64 = row.try_get(2).map_err(get_err)?;
        let left: i64 = row.try_get(3).map_err(get_err)?;
        Ok(HolderInfo {
            owner: OwnerId::parse(&owner)?,
            token: u64::try_from(token).ok().map(FencingToken),
            remaining: Some(millis(left)),
            label,
            foreign: false,
        })
    }
}

/// Forwards the released keys the listening connection hears to the waiters, until the
/// client is gone. The listener reconnects by itself after a failure (announcements
/// made meanwhile are missed; waiters then wake at the holder's expiry or [`RECHECK`]).
async fn listen(
    inner: std::sync::Weak<Inner>,
    mut listener: PgListener,
    sender: broadcast::Sender<String>,
) {
    loop {
        let heard = tokio::time::timeout(RECHECK * 10, listener.recv()).await;
        if inner.strong_count() == 0 {
            return;
        }
        match heard {
            Ok(Ok(notice)) => {
                let _ = sender.send(notice.payload().to_owned());
            }
            Ok(Err(_)) => tokio::time::sleep(RECHECK).await,
            Err(_) => {}
        }
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn token_of(lease: &Lease) -> i64 {
    i64::try_from(lease.token().0).unwrap_or(i64::MAX)
}
