//! [`LockAdmin`] for Redis: walks the lock keys under the prefix with `SCAN` (never
//! `KEYS`, which blocks the server), reading each key's type, value and PTTL with one
//! script call per page.
//!
//! A lock key is `{<prefix><key>}`; its fence counter `{<prefix><key>}:fence` is skipped
//! (it expires a day after its last use in clock-floored mode and is persistent by design
//! with `fence=counter`, see [`FenceMode`](crate::FenceMode)), and so are its readers'
//! records and its waiting writer's mark (both expire); a key readers hold is shown as
//! its reader whose lease ends last. A lock key whose PTTL is `-1` never expires: that is
//! the leak the doctor looks for (the `TTL = -1` check).

use std::sync::LazyLock;
use std::time::Instant;

use async_trait::async_trait;
use redis::Script;
use tenure_api::admin::undecodable;
use tenure_api::{
    DistributedLock as _, Finding, HolderInfo, LockAdmin, LockError, LockKey, Problem,
};

use crate::scripts::{holder_of, Call, READERS_MARK};
use crate::{bounded, classify, RedisLock};

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: usize = 500;

/// For each key in KEYS: `{type, value or false, pttl}` (the value only for strings).
const SURVEY: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  local kind = redis.call('TYPE', k).ok
  local value = false
  if kind == 'string' then value = redis.call('GET', k) end
  out[i] = {kind, value, redis.call('PTTL', k)}
end
return out
"#;

static SURVEY_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SURVEY));

/// One lock key a scan found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScannedLock {
    /// The Redis key.
    pub(crate) redis_key: String,
    /// The lock key it stands for, if the name decodes to one.
    pub(crate) key: Option<LockKey>,
    /// The Redis type (`string` for a lock; `none` if it vanished meanwhile).
    pub(crate) kind: String,
    /// The stored value, for strings.
    pub(crate) value: Option<String>,
    /// The PTTL: milliseconds left, `-1` without expiry, `-2` gone.
    pub(crate) pttl: i64,
}

impl ScannedLock {
    /// The holder this entry describes, if it is a live lock (another recipe's too).
    fn holder(&self) -> Option<(LockKey, HolderInfo)> {
        let value = self.value.as_deref()?;
        Some((
            self.key.clone()?,
            holder_of(&self.redis_key, value, self.pttl),
        ))
    }

    /// What is wrong with this entry, if anything.
    fn finding(&self, endpoint: &str) -> Option<Finding> {
        let location = format!("redis {endpoint} key {}", self.redis_key);
        let Some(key) = &self.key else {
            return Some(undecodable(&self.redis_key, location));
        };
        // A string that is not tenure's value is another recipe's lock (redis-py's
        // token): a holder, not a finding.
        let malformed = (self.kind != "string")
            .then(|| format!("a {} where a lock value was expected", self.kind));
        let (problem, detail) = match (self.pttl, malformed) {
            (-1, why) => (
                Problem::NoExpiry,
                format!(
                    "the lock key has no TTL (PTTL -1), so nothing will ever free it{}",
                    why.map(|w| format!("; also {w}")).unwrap_or_default()
                ),
            ),
            (_, Some(why)) => (Problem::Malformed, why),
            _ => return None,
        };
        Some(Finding {
            key: key.to_string(),
            problem,
            location,
            detail,
        })
    }
}

impl RedisLock {
    /// Every lock key whose lock key starts with `prefix`, with its type, value and PTTL,
    /// found with `SCAN … MATCH` (never `KEYS`). Each call is bounded by the command
    /// timeout; the walk ends when `SCAN` says so.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub(crate) async fn scan_locks(&self, prefix: &str) -> Result<Vec<ScannedLock>, LockError> {
        if matches!(self.config.topology, crate::Topology::Cluster(_)) {
            return Err(LockError::Config(format!(
                "{}: listing locks does not walk a Redis Cluster's primaries yet; ask each \
                 primary with its own redis:// URL",
                self.config.endpoint()
            )));
        }
        let namespace = format!("{{{}", self.config.prefix);
        let pattern = format!("{}*", glob_escape(&format!("{namespace}{prefix}")));
        let limit = self.config.request_timeout;
        let mut found = Vec::new();
        let mut cursor = 0u64;
        // One node for the whole walk (a cursor means nothing on another), taken as a
        // call takes it: a suspect one is replaced first. A connection that dropped
        // (closed by the server, or the server restarted) makes it suspect, and the walk
        // starts again once over a fresh one.
        let mut node = self.primary.node_for_call(Instant::now() + limit).await;
        let mut restarted = false;
        loop {
            let mut conn = node.conn.clone();
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<String>) =
                match bounded(limit, scan.query_async(&mut conn)).await {
                    Ok(reply) => reply,
                    Err(e) if e.is_unrecoverable_error() => {
                        node.suspect();
                        if restarted {
                            return Err(classify(&self.config, "scan", e));
                        }
                        restarted = true;
                        node = self.primary.node_for_call(Instant::now() + limit).await;
                        (found, cursor) = (Vec::new(), 0);
                        continue;
                    }
                    Err(e) => return Err(classify(&self.config, "scan", e)),
                };
            // Lock keys end with the closing brace; fence counters with `}:fence`.
            let locks: Vec<String> = keys.into_iter().filter(|k| k.ends_with('}')).collect();
            if !locks.is_empty() {
                let mut call = Call::script(&SURVEY_SCRIPT, locks.len());
                for key in &locks {
                    call.key(key);
                }
                let surveyed: Vec<(String, Option<String>, i64)> =
                    self.call("survey", call).await?;
                found.extend(locks.into_iter().zip(surveyed).map(
                    |(redis_key, (kind, value, pttl))| {
                        ScannedLock {
                            key: redis_key
                                .strip_prefix(&namespace)
                                .and_then(|k| k.strip_suffix('}'))
                                .and_then(|k| LockKey::new(k).ok()),
                            redis_key,
                            kind,
                            value,
                            pttl,
                        }
                    },
                ));
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        found.retain(|lock| lock.kind != "none");
        found.sort_by(|a, b| a.redis_key.cmp(&b.redis_key));
        Ok(found)
    }
}

/// Escapes the characters `SCAN … MATCH` treats as a pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `holders` lists the well-formed locks; `doctor` reports lock keys without a TTL and
/// values tenure cannot read.
#[async_trait]
impl LockAdmin for RedisLock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let scanned = self.scan_locks(prefix).await?;
        let mut holders = Vec::with_capacity(scanned.len());
        for lock in &scanned {
            match (lock.value.as_deref(), &lock.key) {
                // Read-held: the reader whose lease ends last, from the readers' records.
                (Some(READERS_MARK), Some(key)) => {
                    if let Some(holder) = self.inspect(key).await? {
                        holders.push((key.clone(), holder));
                    }
                }
                _ => holders.extend(lock.holder()),
            }
        }
        holders.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(holders)
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        let endpoint = self.config.endpoint();
        Ok(self
            .scan_locks("")
            .await?
            .iter()
            .filter_map(|lock| lock.finding(&endpoint))
            .collect())
    }

    /// A single Redis node keeps no queue: waiters retry when the release wakes them.
    async fn queued(&self, _key: &LockKey) -> Result<Option<usize>, LockError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(value: Option<&str>, kind: &str, pttl: i64) -> ScannedLock {
        ScannedLock {
            redis_key: "{tenure:jobs/a}".into(),
            key: Some(LockKey::new("jobs/a").unwrap()),
            kind: kind.into(),
            value: value.map(Into::into),
            pttl,
        }
    }

    /// Lock keys without a TTL and keys of another type are findings; a string that is
    /// not tenure's value is another recipe's lock (redis-py's token), a foreign holder.
    #[test]
    fn only_ttl_less_or_unreadable_locks_are_findings() {
        let good = "0123456789abcdef0123456789abcdef:7";
        assert_eq!(scanned(Some(good), "string", 900).finding("h:1"), None);
        let holder = scanned(Some(good), "string", 900).holder().unwrap();
        let owner = tenure_api::OwnerId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let token = crate::scripts::token_for(7, owner).unwrap();
        assert_eq!(
            holder.1.token,
            Some(token),
            "count 7 with the owner's low bits"
        );
        assert_eq!(holder.1.remaining.map(|r| r.as_millis()), Some(900));

        let leak = scanned(Some(good), "string", -1).finding("h:1").unwrap();
        assert_eq!(leak.problem, Problem::NoExpiry);
        assert_eq!(leak.key, "jobs/a");
        assert!(leak.location.contains("h:1") && leak.location.contains("{tenure:jobs/a}"));

        let redis_py = "5f1c0a2e9b7d11ef8c4d0242ac120002";
        assert_eq!(scanned(Some(redis_py), "string", 500).finding("h:1"), None);
        let (_, holder) = scanned(Some(redis_py), "string", 500).holder().unwrap();
        assert!(holder.foreign && holder.token.is_none(), "{holder:?}");
        assert_eq!(holder.label.as_deref(), Some(redis_py));
        let derived = tenure_api::OwnerId::derived(b"{tenure:jobs/a}");
        assert_eq!(holder.owner, derived);
        let hash = scanned(None, "hash", -1).finding("h:1").unwrap();
        assert_eq!(hash.problem, Problem::NoExpiry);
        assert!(hash.detail.contains("a hash"), "{}", hash.detail);
        let hash = scanned(None, "hash", 500).finding("h:1").unwrap();
        assert_eq!(hash.problem, Problem::Malformed);
        assert!(scanned(None, "hash", 500).holder().is_none());
    }

    #[test]
    fn match_patterns_are_escaped() {
        assert_eq!(glob_escape("{t:a*b?[c]\\"), "{t:a\\*b\\?\\[c\\]\\\\");
    }
}
