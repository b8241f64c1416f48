//! [`LockAdmin`] for Redlock: every node is scanned like a single Redis server, at once.
//!
//! `holders` lists the keys any node knows and reports the holder a majority agrees on
//! (as [`DistributedLock::inspect`] does), so a minority's stray grant is not shown as
//! held. `doctor` reports each node's findings, naming the node; if a node cannot be
//! scanned the doctor fails rather than call the namespace clean.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use tenure_api::{DistributedLock, Finding, HolderInfo, LockAdmin, LockError, LockKey};

use crate::Redlock;

/// Bound on one node's scan (a scan is many requests, each bounded by the node's own
/// request timeout).
const NODE_SCAN_LIMIT: Duration = Duration::from_secs(60);

impl Redlock {
    /// Runs `scan` on every node; the first failure, if any node failed.
    async fn on_every_node<'a, T: 'a, F, Fut>(&'a self, scan: F) -> Result<Vec<T>, LockError>
    where
        F: Fn(&'a tenure_redis::RedisLock) -> Fut + Copy,
        Fut: std::future::Future<Output = Result<T, LockError>> + 'a,
    {
        self.inner
            .fan_out(NODE_SCAN_LIMIT, |node, limit| {
                crate::within("scan", node, limit, scan(node))
            })
            .await
            .into_iter()
            .collect()
    }
}

#[async_trait]
impl LockAdmin for Redlock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let keys: BTreeSet<LockKey> = self
            .on_every_node(|node| node.holders(prefix))
            .await?
            .into_iter()
            .flatten()
            .map(|(key, _)| key)
            .collect();
        let mut holders = Vec::new();
        for key in keys {
            if let Some(holder) = self.inspect(&key).await? {
                holders.push((key, holder));
            }
        }
        Ok(holders)
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        Ok(self
            .on_every_node(LockAdmin::doctor)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// Redlock keeps no queue: waiters retry when a release wakes them.
    async fn queued(&self, _key: &LockKey) -> Result<Option<usize>, LockError> {
        Ok(None)
    }
}
