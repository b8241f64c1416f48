//! [`LockAdmin`] for Postgres: one query over the holder table joined with
//! `pg_stat_activity`, for the holders whose transaction is still running; a key's queue
//! is counted in `pg_locks` ([`PgLock::queued`]).
//!
//! With `locking=lease` the holders are the live rows of the lease table, and the doctor
//! has nothing to find: the server's clock ends every lease.
//!
//! A lock is held by an open transaction; the server ends it when the holder stays idle
//! in it for its TTL (`idle_in_transaction_session_timeout`). A holder whose session has
//! been **idle in transaction longer than its recorded TTL** (plus [`STALE_GRACE`]) is
//! therefore one the server is not going to free — the timeout was overridden (`SET
//! idle_in_transaction_session_timeout = 0`, a pooler resetting session settings, a
//! hand-written holder) — and it blocks its key until someone terminates the session.
//! Seeing other roles' sessions needs `pg_read_all_stats` (or the same role); holders
//! whose session is not visible are listed without a remaining time and never reported.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};
use tenure_api::backend::parse_holder_text;
use tenure_api::{FencingToken, Finding, HolderInfo, LockAdmin, LockError, LockKey, Problem};

use crate::error::map_err;
use crate::PgLock;

/// How far past its TTL an idle holder must be before the doctor reports it, so a holder
/// the server is about to cut off is not reported.
pub(crate) const STALE_GRACE: Duration = Duration::from_secs(1);

/// A running holder as the admin query sees it.
struct Holding {
    row_key: String,
    owner: String,
    token: i64,
    ttl_ms: i64,
    pid: i32,
    /// `pg_stat_activity.state` of the holder's session, if visible.
    state: Option<String>,
    /// Milliseconds since that state began.
    idle_ms: Option<i64>,
}

impl Holding {
    fn idle_in_transaction(&self) -> Option<i64> {
        (self.state.as_deref() == Some("idle in transaction"))
            .then_some(self.idle_ms)
            .flatten()
    }

    /// Time before the server's idle timer frees the lock: the TTL less the idle time
    /// while idle, the whole TTL while a statement runs, unknown otherwise.
    fn remaining(&self) -> Option<Duration> {
        let left = match self.state.as_deref() {
            Some("idle in transaction") => self.ttl_ms - self.idle_ms?,
            Some("active") => self.ttl_ms,
            _ => return None,
        };
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    fn is_stale(&self) -> bool {
        let grace = i64::try_from(STALE_GRACE.as_millis()).unwrap_or(i64::MAX);
        self.idle_in_transaction()
            .is_some_and(|idle| idle > self.ttl_ms.saturating_add(grace))
    }
}

impl PgLock {
    /// The holders whose row key starts with the configured prefix and `prefix`, and
    /// whose transaction is still running, sorted by key.
    async fn holdings(&self, prefix: &str) -> Result<Vec<Holding>, LockError> {
        let config = &self.inner.config;
        let sql = format!(
            "SELECT h.key, h.owner, h.token, h.ttl_ms, h.pid, a.state::text, \
             (EXTRACT(EPOCH FROM clock_timestamp() - a.state_change) * 1000)::bigint \
             FROM {} h LEFT JOIN pg_stat_activity a ON a.pid = h.pid \
             WHERE starts_with(h.key, $1) AND pg_xact_status(h.xid) = 'in progress' \
             ORDER BY h.key",
            config.holder_table()
        );
        let mut conn = self.pooled().await?;
        let rows = self
            .bounded(
                "list holders",
                sqlx::query(AssertSqlSafe(sql))
                    .bind(format!("{}{prefix}", config.prefix))
                    .fetch_all(&mut *conn),
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(Holding {
                    row_key: row.try_get(0)?,
                    owner: row.try_get(1)?,
                    token: row.try_get(2)?,
                    ttl_ms: row.try_get(3)?,
                    pid: row.try_get(4)?,
                    state: row.try_get(5)?,
                    idle_ms: row.try_get(6)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| map_err(config, "list holders", e))
    }

    /// The lock key of a row key, if it is under the configured prefix and valid.
    fn lock_key_of(&self, row_key: &str) -> Option<LockKey> {
        let key = row_key.strip_prefix(&self.inner.config.prefix)?;
        LockKey::new(key).ok()
    }
}

/// `holders` lists running holders; `doctor` reports holders idle in their transaction
/// past their TTL (see the module docs).
#[async_trait]
impl LockAdmin for PgLock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        if self.leases() {
            let row_prefix = format!("{}{prefix}", self.inner.config.prefix);
            return Ok(self
                .lease_holders(&row_prefix)
                .await?
                .into_iter()
                .filter_map(|(row_key, holder)| Some((self.lock_key_of(&row_key)?, holder)))
                .collect());
        }
        Ok(self
            .holdings(prefix)
            .await?
            .iter()
            .filter_map(|h| {
                let (owner, label) = parse_holder_text(&h.owner).ok()?;
                Some((
                    self.lock_key_of(&h.row_key)?,
                    HolderInfo {
                        owner,
                        token: u64::try_from(h.token).ok().map(FencingToken),
                        remaining: h.remaining(),
                        label,
                        foreign: false,
                    },
                ))
            })
            .collect())
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        if self.leases() {
            // Every lease ends at its expiry by the server's clock: none can outlive it.
            return Ok(Vec::new());
        }
        let holders = self.inner.config.holder_table();
        Ok(self
            .holdings("")
            .await?
            .iter()
            .filter(|h| h.is_stale())
            .map(|h| Finding {
                key: self
                    .lock_key_of(&h.row_key)
                    .map_or_else(|| h.row_key.clone(), |k| k.to_string()),
                problem: Problem::Stale,
                location: format!("{holders} key {:?}, backend pid {}", h.row_key, h.pid),
                detail: format!(
                    "the holding session has been idle in transaction for {} ms, past its \
                     ttl of {} ms: the server's idle timeout is not going to free it \
                     (pg_terminate_backend({}) would)",
                    h.idle_ms.unwrap_or_default(),
                    h.ttl_ms,
                    h.pid
                ),
            })
            .collect())
    }

    /// The key's queue in `pg_locks`; `None` with `locking=lease`, which has none.
    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        if self.leases() {
            return Ok(None);
        }
        PgLock::queued(self, key).await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(state: Option<&str>, idle_ms: i64, ttl_ms: i64) -> Holding {
        Holding {
            row_key: "k".into(),
            owner: String::new(),
            token: 1,
            ttl_ms,
            pid: 7,
            state: state.map(Into::into),
            idle_ms: Some(idle_ms),
        }
    }

    #[test]
    fn stale_means_idle_in_transaction_past_ttl_and_grace() {
        let idle = Some("idle in transaction");
        assert!(holding(idle, 2_600, 1_500).is_stale());
        assert!(!holding(idle, 2_400, 1_500).is_stale(), "within the grace");
        assert!(!holding(Some("active"), 99_000, 1_500).is_stale());
        assert!(
            !holding(None, 99_000, 1_500).is_stale(),
            "session not visible"
        );
        assert_eq!(
            holding(idle, 400, 1_500).remaining(),
            Some(Duration::from_millis(1_100))
        );
        assert_eq!(
            holding(idle, 4_000, 1_500).remaining(),
            Some(Duration::ZERO)
        );
        assert_eq!(holding(None, 0, 1_500).remaining(), None);
    }
}
