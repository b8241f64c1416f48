//! One acquire attempt: the begin batch, the lock (`NOWAIT` or queued under
//! `lock_timeout`), the fence record, and the hand-over to the lease's task.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Executor, Row};
use tenure_api::backend::{
    default_drift, held_slot, holder_text, too_many_held, waiting_slot, LeaseTie, LossNotice,
};
use tenure_api::{FencingToken, Lease, LeaseHandle, LockError, LockKey, OwnerId};
use tokio::sync::mpsc;

use crate::client::{discard, Dedicated};
use crate::error::{map_err, sqlstate, LOCK_NOT_AVAILABLE};
use crate::held::{refresh, Entry, HeldTask};
use crate::records::Record;
use crate::sql::{begin_batch, timeout_ms, LOCKED_INDEX, LOCKED_XID};
use crate::{Locking, PgLock};

/// What the locking `SELECT` found.
pub(crate) enum Locked {
    /// The row is ours: the transaction id and backend pid, and which of the keys tried
    /// it is (0 for a single key).
    Granted { xid: String, pid: i32, index: usize },
    /// Another transaction holds it (`NOWAIT`), or `lock_timeout` ran out.
    Busy,
}

impl PgLock {
    /// A dedicated connection with an open lock transaction whose idle timeout is `ttl`
    /// and, when `lock_timeout` is given, whose lock waits are bounded by it; nothing else
    /// the server could use to end the transaction earlier stays armed. Without
    /// `lock_timeout` the `NOWAIT` lock has been tried too, and its outcome is returned
    /// (`None`: the row was gone again, see [`lock_row`](Self::lock_row)); with it, the
    /// caller locks. See [`begin_batch`]; several `row_keys` are for a single attempt
    /// only, which takes the first one free.
    async fn begin(
        &self,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        row_keys: &[String],
    ) -> Result<(Dedicated, Option<Locked>), LockError> {
        let batch = begin_batch(&self.inner.sql, ttl, lock_timeout, row_keys);
        let config = &self.inner.config;
        let mut cached = self.pop_idle();
        loop {
            let fresh = cached.is_none();
            let mut conn = match cached.take() {
                Some(conn) => conn,
                None => self.open().await?,
            };
            let started = tokio::time::timeout(
                config.request_timeout,
                // To the end of the reply (see `lock_row`).
                sqlx::raw_sql(AssertSqlSafe(batch.clone())).fetch_all(conn.listener()),
            )
            .await;
            let error = match started {
                Ok(Ok(_)) if lock_timeout.is_some() => return Ok((conn, None)),
                Ok(Ok(rows)) => match self.read_locked(&rows, row_keys) {
                    Ok(locked) => return Ok((conn, locked)),
                    Err(e) => {
                        discard(conn);
                        return Err(e);
                    }
                },
                Ok(Err(e))
                    if lock_timeout.is_none()
                        && sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                {
                    return Ok((conn, Some(Locked::Busy)))
                }
                Ok(Err(e)) => map_err(config, "begin", e),
                Err(_) => LockError::no_reply("begin", &config.endpoint(), config.request_timeout),
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

    /// What a reply that ran a lock statement on `row_keys` says: granted (which key),
    /// busy, or `None` when a single key's row is missing (see
    /// [`lock_row`](Self::lock_row)).
    fn read_locked(
        &self,
        rows: &[PgRow],
        row_keys: &[String],
    ) -> Result<Option<Locked>, LockError> {
        let config = &self.inner.config;
        let Some(row) = rows.iter().rev().find(|r| r.try_column(LOCKED_XID).is_ok()) else {
            // No row: held (advisory `NOWAIT`; `SKIP LOCKED` over every key's row, which
            // the batch inserted), or a single key's row was deleted again.
            return Ok(match (self.inner.sql.locking, row_keys.len()) {
                (Locking::Row, 1) => None,
                _ => Some(Locked::Busy),
            });
        };
        // Several keys: which one (advisory: `NULL` when none was free).
        let index = match row.try_column(LOCKED_INDEX) {
            Err(_) => Some(0),
            Ok(_) => row
                .try_get::<Option<i32>, _>(LOCKED_INDEX)
                .map_err(|e| map_err(config, "lock", e))?,
        };
        let Some(index) = index else {
            return Ok(Some(Locked::Busy));
        };
        let index = usize::try_from(index)
            .ok()
            .filter(|i| *i < row_keys.len())
            .ok_or_else(|| {
                LockError::backend(format!(
                    "the lock statement named key {index} of {}",
                    row_keys.len()
                ))
            })?;
        let xid = row.try_get(0).map_err(|e| map_err(config, "lock", e))?;
        let pid = row.try_get(1).map_err(|e| map_err(config, "lock", e))?;
        Ok(Some(Locked::Granted { xid, pid, index }))
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
                + config.request_timeout;
            let result = tokio::time::timeout(
                limit,
                // `fetch_all` reads the reply to its end, so nothing of it is left for the
                // held lease's socket watch to mistake for an unsolicited message.
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(row_key)
                    .fetch_all(conn.listener()),
            )
            .await
            .map(|rows| rows.map(|rows| rows.into_iter().next()));
            match result {
                Err(_) => return Err(LockError::no_reply("lock", &config.endpoint(), limit)),
                Ok(Ok(Some(row))) => {
                    let xid: String = row.try_get(0).map_err(|e| map_err(config, "lock", e))?;
                    let pid: i32 = row.try_get(1).map_err(|e| map_err(config, "lock", e))?;
                    return Ok(Locked::Granted { xid, pid, index: 0 });
                }
                Ok(Ok(None)) if self.inner.sql.locking == Locking::Advisory => {
                    return Ok(Locked::Busy)
                }
                Ok(Ok(None)) if attempt == 0 => {
                    // First use of this key: create its row in autocommit, outside our
                    // transaction, then look again (a new statement sees the new row).
                    let mut pooled = self.pooled().await?;
                    self.bounded(
                        "insert lock row",
                        sqlx::query(AssertSqlSafe(self.inner.sql.ensure_row.as_str()))
                            .bind(row_key)
                            .execute(&mut *pooled),
                    )
                    .await?;
                    drop(pooled);
                    if let Some(_wait) = wait {
                        let remaining = deadline.saturating_duration_since(Instant::now());
                        let set = format!("SET LOCAL lock_timeout = {}", timeout_ms(remaining));
                        self.bounded(
                            "set lock_timeout",
                            conn.listener().execute(sqlx::raw_sql(AssertSqlSafe(set))),
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
    /// to `w`. `Ok(None)`: held by another (or the wait ran out). The holder's record
    /// keeps `label` with the owner id ([`holder_text`]). Several `keys` (with `wait =
    /// None` only): the first of them that is free, in one statement.
    pub(crate) async fn attempt(
        &self,
        keys: &[LockKey],
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        wait: Option<Duration>,
    ) -> Result<Option<Lease>, LockError> {
        let config = &self.inner.config;
        // A blocking acquire queues under its own bound and takes a held slot only once
        // granted, so waiters on one hot key never starve acquires of other keys.
        let queued = match wait {
            Some(_) => Some(waiting_slot(&self.inner.waiting, config.max_waiting)?),
            None => None,
        };
        let mut slot = match queued {
            Some(_) => None,
            None => Some(held_slot(&self.inner.slots, config.max_held)?),
        };
        if slot.is_none() && self.inner.slots.available_permits() == 0 {
            return Err(too_many_held(config.max_held));
        }
        debug_assert!(!keys.is_empty() && (keys.len() == 1 || wait.is_none()));
        let row_keys: Vec<String> = keys.iter().map(|key| self.row_key(key)).collect();
        let started = Instant::now();
        let deadline = started + wait.unwrap_or_default();
        let (mut conn, tried) = self.begin(ttl, wait, &row_keys).await?;
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
            None => self.lock_row(&mut conn, &row_keys[0], wait, deadline).await,
        };
        let (xid, pid, index) = match locked {
            Ok(Locked::Granted { xid, pid, index }) => (xid, pid, index),
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
        let (key, row_key) = (&keys[index], &row_keys[index]);
        let slot = match slot.take() {
            Some(slot) => slot,
            None => match held_slot(&self.inner.slots, config.max_held) {
                Ok(slot) => slot,
                Err(e) => {
                    self.abandon(conn).await;
                    return Err(e);
                }
            },
        };
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let holder = holder_text(owner, label);
        let record = || Record {
            row_key: row_key.clone(),
            holder: holder.clone(),
            xid: xid.clone(),
            pid,
            ttl_ms,
        };
        let mut token: Result<Option<i64>, LockError> = self.record(record()).await;
        if token.as_ref().is_err_and(LockError::is_retryable) {
            // Most likely a pool connection that died since its last use (they are not
            // pinged before every use): once more, with the pool's connections pinged
            // first. Safe whether or not the first statement took effect: the second
            // replaces a record of this transaction, with a newer token, and only that one
            // is handed out (the first never replaces one, so it cannot undo the second).
            self.inner.pool_failed.mark();
            token = self.record_again(record()).await;
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
            path: row_key.clone(),
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
            promised: sent + ttl,
        };
        // No await between here and the return: once in the map, the lease is ours.
        self.inner.held.insert(owner, entry);
        tokio::spawn(task.run(conn, requests, dropped));
        Ok(Some(lease))
    }
}
