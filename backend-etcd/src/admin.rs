//! [`LockAdmin`] for etcd: reads the queued lock keys under the prefix in pages, all at
//! one revision, and asks the leader about each key's lease.
//!
//! A queue key is `<prefix>/<escaped key>/<owner>-<lease hex>-<attempt>` (a reader's
//! `…/shared-<owner>-…`); the head of a queue (smallest create revision) holds the lock,
//! with the readers after it up to the first writer when it is a reader's. Keys live on leases, so etcd deletes them when the
//! lease ends: a lock key **without a lease** never goes away (`NoExpiry`), and one whose
//! lease is already gone outlived it (`Stale`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use tenure_api::admin::{percent_decode, undecodable};
use tenure_api::{FencingToken, Finding, HolderInfo, LockAdmin, LockError, LockKey, Problem};

use crate::rpc::is_lease_gone;
use crate::{entry, EtcdLock};

/// Keys read per range request.
const PAGE: i64 = 500;

/// One lock queue: its key (if the name decodes) and its entries, oldest first.
struct Queue {
    key: Option<LockKey>,
    name: String,
    entries: Vec<KeyValue>,
}

impl EtcdLock {
    /// `<prefix>/<text>` with `%` written `%25` and `/` written `%2F`: the start of every
    /// queue of a key beginning with `text`.
    pub(crate) fn escaped_prefix(&self, text: &str) -> String {
        self.rpc.config.escaped_prefix(text)
    }

    /// The lease's remaining seconds as the leader sees them; 0 when it is gone.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub(crate) async fn lease_left(&self, lease_id: i64) -> Result<i64, LockError> {
        match self.rpc.time_to_live(lease_id).await {
            Err(e) if is_lease_gone(&e) => Ok(0),
            other => other,
        }
    }

    /// The queues of every key starting with `prefix`, read in pages at one revision.
    async fn queues(&self, prefix: &str) -> Result<Vec<Queue>, LockError> {
        let start = self.escaped_prefix(prefix);
        let mut end = start.clone().into_bytes();
        // The prefix is non-empty UTF-8, so its last byte is below 0xff.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let namespace = self.rpc.config.key_prefix();
        let (mut from, mut revision) = (start, 0);
        let mut queues: BTreeMap<String, Queue> = BTreeMap::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(PAGE)
                .with_revision(revision);
            let reply = self.rpc.get("admin range", &from, options).await?;
            if revision == 0 {
                revision = reply.header().map_or(0, |h| h.revision());
            }
            let Some(last) = reply.kvs().last() else {
                break;
            };
            let last = std::str::from_utf8(last.key()).map_err(|_| {
                LockError::backend("a key in the lock namespace is not UTF-8; cannot page on")
            })?;
            from = format!("{last}\0");
            for kv in reply.kvs() {
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                let name = full.rsplit_once('/').map_or(full.as_str(), |(dir, _)| dir);
                queues
                    .entry(name.to_string())
                    .or_insert_with(|| Queue {
                        // One component below the namespace, as tenure's queues are
                        // (another recipe's `<prefix>/a/b/<lease>` is no key's queue).
                        key: name
                            .strip_prefix(&namespace)
                            .filter(|escaped| !escaped.contains('/'))
                            .and_then(percent_decode)
                            .and_then(|k| LockKey::new(k).ok()),
                        name: name.to_string(),
                        entries: Vec::new(),
                    })
                    .entries
                    .push(kv.clone());
            }
            if !reply.more() {
                break;
            }
        }
        let mut queues: Vec<Queue> = queues.into_values().collect();
        for queue in &mut queues {
            queue.entries.sort_by_key(KeyValue::create_revision);
        }
        Ok(queues)
    }
}

/// `holders` reports each queue's head; `doctor` checks every queued key's lease.
#[async_trait]
impl LockAdmin for EtcdLock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let mut holders = Vec::new();
        for queue in self.queues(prefix).await? {
            let (Some(key), Some(head)) = (queue.key, queue.entries.first()) else {
                continue;
            };
            let Ok(holder) = entry::recorded(head.key(), head.value()) else {
                continue;
            };
            let remaining = match head.lease() {
                0 => None,
                lease => {
                    let left = self.lease_left(lease).await?;
                    Some(Duration::from_secs(u64::try_from(left).unwrap_or(0)))
                }
            };
            holders.push((
                key,
                HolderInfo {
                    owner: holder.owner,
                    token: u64::try_from(head.create_revision()).ok().map(FencingToken),
                    remaining,
                    label: holder.label,
                    foreign: holder.foreign,
                },
            ));
        }
        Ok(holders)
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        let mut findings = Vec::new();
        let mut leases: HashMap<i64, i64> = HashMap::new();
        for queue in self.queues("").await? {
            for kv in &queue.entries {
                let location = format!("etcd key {}", String::from_utf8_lossy(kv.key()));
                let Some(key) = &queue.key else {
                    findings.push(undecodable(&queue.name, location));
                    continue;
                };
                let left = match (kv.lease(), leases.get(&kv.lease())) {
                    (0, _) => None,
                    (_, Some(left)) => Some(*left),
                    (lease, None) => {
                        let left = self.lease_left(lease).await?;
                        leases.insert(lease, left);
                        Some(left)
                    }
                };
                let (problem, detail) = match left {
                    None => (
                        Problem::NoExpiry,
                        "the lock key has no lease, so nothing will ever delete it".to_string(),
                    ),
                    Some(left) if left <= 0 => (
                        Problem::Stale,
                        format!(
                            "its lease {:x} has expired or was revoked, yet the key remains",
                            kv.lease()
                        ),
                    ),
                    Some(_) if entry::recorded(kv.key(), kv.value()).is_err() => (
                        Problem::Malformed,
                        "named as tenure's, its value is not the owner id its name carries"
                            .to_string(),
                    ),
                    Some(_) => continue,
                };
                findings.push(Finding {
                    key: key.to_string(),
                    problem,
                    location,
                    detail,
                });
            }
        }
        Ok(findings)
    }

    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        EtcdLock::queued(self, key).await.map(Some)
    }
}
