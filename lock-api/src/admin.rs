//! [`LockAdmin`]: listing the holders of a lock service, finding leaked locks and counting
//! a key's queue, for operators (and the conformance suite's FIFO scenario). Deliberately a separate trait from [`DistributedLock`](crate::DistributedLock),
//! so wrappers (tracing, metrics, drift margins) never inherit it silently.

use std::fmt::{self, Debug};
use std::sync::Arc;

use async_trait::async_trait;

use crate::{HolderInfo, LockError, LockKey, MemoryLock};

/// Inspection of a whole lock namespace: who holds what, which locks leaked, and how many
/// wait for a key.
///
/// Every method only reads. Scans walk the backend's own namespace (under its configured
/// prefix) incrementally (`SCAN`, paged ranges, directory listings), never with one
/// blocking whole-keyspace command. (Postgres's [`queued`](Self::queued) reads
/// `pg_locks`, which takes the server's lock-table partition locks for a moment.)
#[async_trait]
pub trait LockAdmin: Send + Sync + Debug {
    /// Every lock held now whose key starts with `prefix` (`""`: all of them), with its
    /// holder, sorted by key.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError>;

    /// Locks that will not be freed the way the protocol expects (see [`Problem`]). Empty
    /// when the namespace is clean.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn doctor(&self) -> Result<Vec<Finding>, LockError>;

    /// How many clients — the holder and its waiters — the servers have queued for `key`
    /// now, on a backend whose servers queue waiters (etcd's queue keys, ZooKeeper's
    /// sequential nodes, Postgres's `pg_locks`, the memory lock's table); `None` on one
    /// that keeps no queue (Redis and Redlock waiters retry when woken).
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError>;
}

#[async_trait]
impl<A: LockAdmin + ?Sized> LockAdmin for Arc<A> {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        (**self).holders(prefix).await
    }
    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        (**self).doctor().await
    }
    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        (**self).queued(key).await
    }
}

/// What is wrong with a lock [`LockAdmin::doctor`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Problem {
    /// Nothing will ever free it: a Redis lock key without a TTL, an etcd lock key
    /// without a lease, a ZooKeeper lock node that is not ephemeral.
    NoExpiry,
    /// It outlived its lease: an etcd key whose lease is gone, a Postgres holder idle in
    /// its transaction longer than its TTL (the server's idle timeout did not end it).
    Stale,
    /// An entry in the lock namespace that tenure cannot read (it may block its key).
    Malformed,
}

impl Problem {
    /// A short stable name: `no_expiry`, `stale`, `malformed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoExpiry => "no_expiry",
            Self::Stale => "stale",
            Self::Malformed => "malformed",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One leaked or suspicious lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The lock key as callers name it, or the raw stored name when it cannot be decoded.
    pub key: String,
    /// What is wrong.
    pub problem: Problem,
    /// Where it is, in the backend's terms (node and Redis key, etcd key, znode path,
    /// table row), so an operator can remove it.
    pub location: String,
    /// What was observed.
    pub detail: String,
}

/// Decodes a `%XX`-escaped name (as the etcd and ZooKeeper backends store keys); `None`
/// on a malformed escape or bytes that are not UTF-8.
///
/// ```
/// use tenure_api::admin::percent_decode;
/// assert_eq!(percent_decode("jobs%2Fnightly%25").as_deref(), Some("jobs/nightly%"));
/// assert_eq!(percent_decode("bad%2"), None);
/// assert_eq!(percent_decode("%+1"), None);
/// ```
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let digit = |b: u8| char::from(b).to_digit(16);
            out.push((digit(hex[0])? * 16 + digit(hex[1])?) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `Malformed` finding for a stored name that does not decode to a [`LockKey`].
pub fn undecodable(name: &str, location: impl Into<String>) -> Finding {
    Finding {
        key: name.to_string(),
        problem: Problem::Malformed,
        location: location.into(),
        detail: "the stored name does not decode to a valid lock key".into(),
    }
}

/// Memory locks cannot leak beyond their TTL: the doctor finds nothing.
#[async_trait]
impl LockAdmin for MemoryLock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        Ok(self.holders_with_prefix(prefix))
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        Ok(Vec::new())
    }

    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        Ok(Some(MemoryLock::queued(self, key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DistributedLock;
    use std::time::Duration;

    #[tokio::test]
    async fn memory_lists_holders_by_prefix_sorted_and_counts_queues() {
        let lock = MemoryLock::new();
        let ttl = Duration::from_secs(5);
        for key in ["jobs/b", "jobs/a", "other"] {
            lock.try_acquire(&LockKey::new(key).unwrap(), ttl)
                .await
                .unwrap()
                .unwrap();
        }
        let admin: Arc<dyn LockAdmin> = Arc::new(lock.clone());
        let listed = admin.holders("jobs/").await.unwrap();
        let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["jobs/a", "jobs/b"]);
        assert!(listed.iter().all(|(_, h)| h.remaining <= Some(ttl)));
        assert_eq!(admin.holders("").await.unwrap().len(), 3);
        assert!(admin.doctor().await.unwrap().is_empty());
        let (held, unused) = (LockKey::new("jobs/a").unwrap(), LockKey::new("u").unwrap());
        assert_eq!(admin.queued(&held).await.unwrap(), Some(1), "the holder");
        assert_eq!(admin.queued(&unused).await.unwrap(), Some(0));
    }

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%C3").as_deref(), None, "not UTF-8");
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%"), None);
        assert_eq!(Problem::NoExpiry.to_string(), "no_expiry");
    }
}
