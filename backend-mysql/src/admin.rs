//! Who holds what: the lock table's records whose session holds the key's named lock.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};
use tenure_api::admin::{Finding, Problem};
use tenure_api::backend::parse_holder_text;
use tenure_api::{FencingToken, HolderInfo, LockAdmin, LockError, LockKey};

use crate::error::{bounded_for, map_err};
use crate::names::lock_name;
use crate::sql::wait_timeout;
use crate::{Locking, MySqlLock};

/// Records read per statement.
const PAGE: usize = 200;

/// A held lock with tenure's record: its name, holder, and how long its session has been
/// idle (where the server shows it).
struct Held {
    name: String,
    holder: HolderInfo,
    ttl: Duration,
    idle: Option<Duration>,
}

impl MySqlLock {
    /// Every held lock whose name starts with `prefix`, in name order: the table's records
    /// a page at a time, each kept if its recorded session holds the named lock now.
    async fn held(&self, prefix: &str) -> Result<Vec<Held>, LockError> {
        let config = self.config();
        let table = config.table();
        let page_sql = format!(
            "SELECT name, holder, token, conn, ttl_ms, \
               (SELECT p.TIME FROM information_schema.PROCESSLIST p WHERE p.ID = t.conn) \
             FROM `{table}` t WHERE name > ? ORDER BY name LIMIT {PAGE}"
        );
        let mut after: Vec<u8> = Vec::new();
        let mut held = Vec::new();
        loop {
            let rows = bounded_for(
                config,
                config.request_timeout,
                "list holders",
                sqlx::query(AssertSqlSafe(page_sql.as_str()))
                    .bind(&after)
                    .fetch_all(&self.inner.pool),
            )
            .await?;
            let get = |e| map_err(config, "list holders", e);
            let mut page: Page = Vec::new();
            for row in &rows {
                let name: Vec<u8> = row.try_get(0).map_err(get)?;
                after.clone_from(&name);
                // Another program's rows, or names that are not UTF-8, are not tenure's.
                let Ok(name) = String::from_utf8(name) else {
                    continue;
                };
                if !name.starts_with(prefix) {
                    continue;
                }
                let holder: String = row.try_get(1).map_err(get)?;
                let token: u64 = row.try_get(2).map_err(get)?;
                let conn: u64 = row.try_get(3).map_err(get)?;
                let ttl_ms: u64 = row.try_get(4).map_err(get)?;
                let idle: Option<i64> = row.try_get(5).map_err(get)?;
                page.push((name, holder, token, conn, ttl_ms, idle));
            }
            if !page.is_empty() {
                let holding = self.holding(&page).await?;
                for ((name, holder, token, _, ttl_ms, idle), holds) in page.into_iter().zip(holding)
                {
                    if !holds {
                        continue;
                    }
                    let Ok((owner, label)) = parse_holder_text(&holder) else {
                        continue;
                    };
                    let remaining = crate::time_left(ttl_ms, idle);
                    let idle = idle
                        .and_then(|s| u64::try_from(s).ok())
                        .map(Duration::from_secs);
                    let ttl = Duration::from_millis(ttl_ms);
                    held.push(Held {
                        name,
                        holder: HolderInfo {
                            owner,
                            label,
                            foreign: false,
                            token: Some(FencingToken(token)),
                            remaining,
                        },
                        ttl,
                        idle,
                    });
                }
            }
            if rows.len() < PAGE {
                return Ok(held);
            }
        }
    }
}

/// A page of the table's records: name, holder, token, session, TTL (ms), idle (s).
type Page = Vec<(String, String, u64, u64, u64, Option<i64>)>;

impl MySqlLock {
    /// Whether each record's grant holds its lock now: its session holds the named lock
    /// (`GET_LOCK`), or its row is locked (row locks).
    async fn holding(&self, page: &Page) -> Result<Vec<bool>, LockError> {
        let config = self.config();
        if config.locking == Locking::Row {
            let names: Vec<&[u8]> = page.iter().map(|(name, ..)| name.as_bytes()).collect();
            let held = self.rows_held(&names).await?;
            return Ok(names
                .iter()
                .map(|name| held.iter().any(|h| h == name))
                .collect());
        }
        let asks = vec!["CAST(IS_USED_LOCK(?) AS UNSIGNED)"; page.len()].join(", ");
        let mut query = sqlx::query(AssertSqlSafe(format!("SELECT {asks}")));
        for (name, ..) in page {
            query = query.bind(lock_name(name));
        }
        let sessions = bounded_for(
            config,
            config.request_timeout,
            "list holders",
            query.fetch_one(&self.inner.pool),
        )
        .await?;
        let get = |e| map_err(config, "list holders", e);
        page.iter()
            .enumerate()
            .map(|(i, (.., conn, _, _))| {
                let session: Option<u64> = sessions.try_get(i).map_err(get)?;
                Ok(session == Some(*conn))
            })
            .collect()
    }
}

#[async_trait]
impl LockAdmin for MySqlLock {
    /// Locks held with tenure's record, under this client's prefix. Another program's
    /// `GET_LOCK` names are not listed (the server cannot list them; `inspect` shows one).
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let namespace = &self.config().prefix;
        let held = self.held(&format!("{namespace}{prefix}")).await?;
        Ok(held
            .into_iter()
            .filter_map(|h| {
                let key = LockKey::new(&h.name[namespace.len()..]).ok()?;
                Some((key, h.holder))
            })
            .collect())
    }

    /// A lock whose session has been idle longer than its `wait_timeout` (the server
    /// should have ended it: a server whose idle timeout is not enforced) is `Stale`.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        let namespace = &self.config().prefix;
        let mut findings = Vec::new();
        for held in self.held(namespace).await? {
            let limit = Duration::from_secs(wait_timeout(held.ttl)) + Duration::from_secs(2);
            if let Some(idle) = held.idle.filter(|idle| *idle > limit) {
                findings.push(Finding {
                    key: held.name[namespace.len()..].to_owned(),
                    problem: Problem::Stale,
                    location: match self.config().locking {
                        Locking::GetLock => format!("GET_LOCK name {}", lock_name(&held.name)),
                        Locking::Row => {
                            format!("row {:?} of {}", held.name, self.config().rows_table())
                        }
                    },
                    detail: format!(
                        "its session has been idle {}s, past the {}s its TTL allows",
                        idle.as_secs(),
                        limit.as_secs()
                    ),
                });
            }
        }
        Ok(findings)
    }

    /// `None`: the server does not show who waits for a named lock.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn queued(&self, _key: &LockKey) -> Result<Option<usize>, LockError> {
        Ok(None)
    }
}
