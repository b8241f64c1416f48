//! Grant records sent together: a client-side group commit.
//!
//! Every grant takes its fencing token and records its holder in one autocommit
//! statement whose commit is flushed before the reply (see the crate docs). Grants that
//! come while the pool's connections are busy wait in a queue, and whoever gets a
//! connection next sends every queued record in one statement: concurrent grants share
//! a round trip and a flushed commit instead of each paying its own. A grant alone is
//! sent at once, as before.
//!
//! Each record keeps its own guard: it is written only while its lock transaction runs,
//! and never over another holder whose transaction still runs, row by row. A statement
//! never names one key twice (`ON CONFLICT DO UPDATE` may touch a row once): a key queued
//! twice (a grant that died before its record, then the next one) goes out in a second
//! statement on the same connection, in queue order. A statement's rows are sorted by
//! key, so that statements under way at once lock holder rows in one order.

use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sqlx::pool::PoolConnection;
use sqlx::postgres::Postgres;
use sqlx::{AssertSqlSafe, Row};
use tenure_api::LockError;
use tokio::sync::{oneshot, Notify};

use crate::error::{bounded_for, map_err};
use crate::{Inner, PgLock};

/// One grant to record: the lock row's key, the holder text, and the lock transaction.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) row_key: String,
    pub(crate) holder: String,
    pub(crate) xid: String,
    pub(crate) pid: i32,
    pub(crate) ttl_ms: i64,
}

/// What a record's statement replied: its token, or `None` when it was not written (the
/// lock transaction no longer runs, or another live transaction is the recorded holder).
type Reply = Result<Option<i64>, LockError>;

struct Queued {
    id: u64,
    record: Record,
    reply: oneshot::Sender<Reply>,
}

/// The records waiting for a pool connection.
#[derive(Default)]
pub(crate) struct Records {
    queue: Mutex<Vec<Queued>>,
    next_id: AtomicU64,
    /// Woken when a statement takes records, so that their callers stop waiting for a
    /// connection of their own.
    taken: Notify,
}

impl Records {
    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every record still waiting, taken out of the queue; those whose caller gave up are
    /// dropped (their grant was never handed out).
    fn take_all(&self) -> Vec<Queued> {
        let mut taken = mem::take(&mut *self.queue());
        self.taken.notify_waiters();
        taken.retain(|queued| !queued.reply.is_closed());
        taken
    }

    /// Until a statement has taken record `id`.
    async fn taken(&self, id: u64) {
        loop {
            // Registered before the check, so no wake-up between the two is missed.
            let taken = self.taken.notified();
            if !self.queue().iter().any(|queued| queued.id == id) {
                return;
            }
            taken.await;
        }
    }

    /// Takes record `id` out of the queue; false when a statement already took it.
    fn withdraw(&self, id: u64) -> bool {
        let mut queue = self.queue();
        let before = queue.len();
        queue.retain(|queued| queued.id != id);
        queue.len() < before
    }
}

/// Takes a record back out of the queue if it is still there when dropped: a cancelled
/// or failed caller's record is never sent afterwards.
struct Withdraw<'a> {
    records: &'a Records,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.records.withdraw(self.id);
    }
}

impl PgLock {
    /// Takes `record`'s fencing token and records its holder, in a statement shared with
    /// every other record queued by the time a pool connection is free. Bounded by the
    /// wait for a pool connection (`connect_timeout`; another one to learn why, when none
    /// could be opened: see `PgLock::pooled`) and then one `request_timeout` per
    /// statement on it.
    ///
    /// # Cancel safety
    /// Cancel safe: a record not yet sent is withdrawn; one sent with others completes
    /// in a task of its own; one sent alone may or may not take effect. A record whose
    /// caller left is never handed out, and its token is skipped (tokens never repeat).
    pub(crate) async fn record(&self, record: Record) -> Reply {
        let records = &self.inner.records;
        let id = records.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, replied) = oneshot::channel();
        records.queue().push(Queued { id, record, reply });
        let _withdraw = Withdraw { records, id };
        let conn = tokio::select! {
            biased;
            // A statement someone else started took it: that statement's reply is ours.
            () = records.taken(id) => None,
            conn = self.pooled() => Some(conn),
        };
        match conn {
            None => {}
            Some(Err(e)) if records.withdraw(id) => return Err(e),
            // Taken meanwhile.
            Some(Err(_)) => {}
            Some(Ok(conn)) => {
                let batch = records.take_all();
                match batch.as_slice() {
                    [] => {}
                    [alone] if alone.id == id => send(self.inner.clone(), conn, batch, false).await,
                    // In a task of its own, so that no caller's cancellation cuts off the
                    // others.
                    _ => drop(tokio::spawn(send(self.inner.clone(), conn, batch, false))),
                }
            }
        }
        replied.await.unwrap_or_else(|_| Err(dropped()))
    }

    /// [`record`](Self::record) once more, after its reply was lost: alone, and replacing
    /// a record of the same transaction (the first statement may have committed; its
    /// token was never handed out).
    ///
    /// # Cancel safety
    /// As [`record`](Self::record)'s for a record sent alone.
    pub(crate) async fn record_again(&self, record: Record) -> Reply {
        let conn = self.pooled().await?;
        let id = self.inner.records.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, replied) = oneshot::channel();
        let alone = vec![Queued { id, record, reply }];
        send(self.inner.clone(), conn, alone, true).await;
        replied.await.unwrap_or_else(|_| Err(dropped()))
    }
}

/// The record's statement ended without a reply for it (its task panicked or the
/// runtime shut down).
fn dropped() -> LockError {
    LockError::Unavailable {
        message: "the grant's record was dropped before its statement replied".into(),
        source: None,
    }
}

/// Sends `batch` on `conn`: one statement per round of distinct keys (almost always
/// one), each record answered with its token, `None`, or the statement's error; `again`:
/// with the statement that replaces a record of the same transaction.
async fn send(
    inner: Arc<Inner>,
    mut conn: PoolConnection<Postgres>,
    mut batch: Vec<Queued>,
    again: bool,
) {
    let config = &inner.config;
    let sql = match again {
        false => inner.sql.record.as_str(),
        true => inner.sql.record_again.as_str(),
    };
    while !batch.is_empty() {
        let round = next_round(&mut batch);
        let column = |field: fn(&Record) -> &str| -> Vec<&str> {
            round.iter().map(|q| field(&q.record)).collect()
        };
        let statement = sqlx::query(AssertSqlSafe(sql))
            .bind(column(|r| &r.row_key))
            .bind(column(|r| &r.holder))
            .bind(column(|r| &r.xid))
            .bind(round.iter().map(|q| q.record.pid).collect::<Vec<i32>>())
            .bind(round.iter().map(|q| q.record.ttl_ms).collect::<Vec<i64>>())
            .fetch_all(&mut *conn);
        let rows = bounded_for(config, config.request_timeout, "take fence", statement)
            .await
            .and_then(|rows| {
                rows.iter()
                    .map(|row| Ok((row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?)))
                    .collect::<Result<Vec<_>, sqlx::Error>>()
                    .map_err(|e| map_err(config, "take fence", e))
            });
        match rows {
            Ok(tokens) => {
                for queued in round {
                    let token = tokens
                        .iter()
                        .find(|(key, _)| *key == queued.record.row_key)
                        .map(|(_, token)| *token);
                    let _ = queued.reply.send(Ok(token));
                }
            }
            Err(e) => {
                let mut failed = round.into_iter().chain(mem::take(&mut batch));
                let first = failed.next();
                for queued in failed {
                    let _ = queued.reply.send(Err(copy(&e)));
                }
                if let Some(first) = first {
                    let _ = first.reply.send(Err(e));
                }
            }
        }
    }
}

/// The first record of each key in `batch`, taken out: one statement's worth (a
/// statement may name a key once), sorted by key, so that two statements under way
/// (this client's or another's) lock holder rows in one order and never deadlock.
fn next_round(batch: &mut Vec<Queued>) -> Vec<Queued> {
    // A stable sort keeps each key's records in queue order: the first goes now.
    batch.sort_by(|a, b| a.record.row_key.cmp(&b.record.row_key));
    let mut round: Vec<Queued> = Vec::with_capacity(batch.len());
    let mut later = Vec::new();
    for queued in mem::take(batch) {
        match round.last() {
            Some(last) if last.record.row_key == queued.record.row_key => later.push(queued),
            _ => round.push(queued),
        }
    }
    *batch = later;
    round
}

/// The same error for another caller of one failed statement (the client library's
/// error, the source, goes to one of them; its text is in every message).
fn copy(error: &LockError) -> LockError {
    match error {
        LockError::Unavailable { message, .. } => LockError::Unavailable {
            message: message.clone(),
            source: None,
        },
        LockError::Backend { message, .. } => LockError::Backend {
            message: message.clone(),
            source: None,
        },
        LockError::Config(message) => LockError::Config(message.clone()),
        other => LockError::backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(records: &Records, key: &str) -> (u64, oneshot::Receiver<Reply>) {
        let id = records.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, replied) = oneshot::channel();
        let record = Record {
            row_key: key.into(),
            holder: format!("owner of {key}"),
            xid: id.to_string(),
            pid: 1,
            ttl_ms: 1000,
        };
        records.queue().push(Queued { id, record, reply });
        (id, replied)
    }

    fn keys(batch: &[Queued]) -> Vec<&str> {
        batch.iter().map(|q| q.record.row_key.as_str()).collect()
    }

    #[test]
    fn a_key_queued_twice_goes_out_in_a_later_statement_each_sorted_by_key() {
        let records = Records::default();
        let replies: Vec<_> = ["b", "a", "b", "c", "a", "b"]
            .into_iter()
            .map(|key| queue(&records, key))
            .collect();
        let mut batch = records.take_all();
        let rounds: Vec<Vec<Queued>> =
            std::iter::from_fn(|| (!batch.is_empty()).then(|| next_round(&mut batch))).collect();
        let names: Vec<Vec<&str>> = rounds.iter().map(|r| keys(r)).collect();
        assert_eq!(names, [vec!["a", "b", "c"], vec!["a", "b"], vec!["b"]]);
        // Each key's records go out in queue order.
        let ids_of = |key: &str| -> Vec<u64> {
            rounds
                .iter()
                .flatten()
                .filter(|q| q.record.row_key == key)
                .map(|q| q.id)
                .collect()
        };
        let queued_ids: Vec<u64> = replies.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids_of("b"), [queued_ids[0], queued_ids[2], queued_ids[5]]);
        assert_eq!(ids_of("a"), [queued_ids[1], queued_ids[4]]);
    }

    #[tokio::test]
    async fn a_caller_whose_record_was_taken_stops_waiting_for_a_connection() {
        let records = Arc::new(Records::default());
        let (id, _reply) = queue(&records, "k");
        let waiting = tokio::spawn({
            let records = records.clone();
            async move { records.taken(id).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "still queued");
        assert_eq!(keys(&records.take_all()), ["k"]);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("woken once taken")
            .unwrap();
    }

    #[test]
    fn a_record_whose_caller_left_is_never_sent() {
        let records = Records::default();
        let (_, kept) = queue(&records, "kept");
        let (_, gone) = queue(&records, "gave up");
        drop(gone);
        let (withdrawn, _reply) = queue(&records, "withdrawn");
        drop(Withdraw {
            records: &records,
            id: withdrawn,
        });
        assert_eq!(keys(&records.take_all()), ["kept"]);
        assert!(records.take_all().is_empty(), "taken once");
        drop(kept);
    }
}
