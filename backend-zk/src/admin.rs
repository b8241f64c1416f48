//! [`LockAdmin`] for ZooKeeper: lists the key directories under the lock root, then each
//! directory's lock nodes.
//!
//! Lock nodes are ephemeral: the ensemble deletes them when their session ends, so a
//! holder's lock cannot outlive its session (ZooKeeper offers clients no way to ask
//! whether another session is alive; it needs none here). What can leak is a lock node
//! that is **not** ephemeral (`ephemeralOwner` 0) — created by hand or by another tool:
//! nothing will ever delete it, and it blocks its key for good.

use async_trait::async_trait;
use tenure_api::admin::{percent_decode, undecodable};
use tenure_api::{DistributedLock, Finding, HolderInfo, LockAdmin, LockError, LockKey, Problem};
use zookeeper_client::Error as ZkError;

use crate::error::bounded;
use crate::ZkLock;

/// A key's directory under the lock root.
struct KeyDir {
    path: String,
    name: String,
    key: Option<LockKey>,
}

impl ZkLock {
    /// The key directories whose key starts with `prefix` (undecodable names only when
    /// `prefix` is empty), sorted by name.
    async fn key_dirs(&self, prefix: &str) -> Result<Vec<KeyDir>, LockError> {
        let client = self.session().await?.client()?;
        let root = self.inner.config.lock_root();
        let mut names = match bounded(self.request_timeout(), client.list_children(&root)).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(self.zk_error("list lock root", e)),
        };
        names.sort();
        Ok(names
            .into_iter()
            .map(|name| KeyDir {
                path: format!("{root}/{name}"),
                key: percent_decode(&name).and_then(|k| LockKey::new(k).ok()),
                name,
            })
            .filter(|dir| match &dir.key {
                Some(key) => key.as_str().starts_with(prefix),
                None => prefix.is_empty(),
            })
            .collect())
    }
}

/// `holders` reports each queue's head (`remaining` is `None`: a ZooKeeper lock lasts as
/// long as its holder's session); `doctor` reports lock nodes that are not ephemeral.
#[async_trait]
impl LockAdmin for ZkLock {
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let mut holders = Vec::new();
        for key in self
            .key_dirs(prefix)
            .await?
            .into_iter()
            .filter_map(|d| d.key)
        {
            if let Some(holder) = self.inspect(&key).await? {
                holders.push((key, holder));
            }
        }
        Ok(holders)
    }

    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        let client = self.session().await?.client()?;
        let mut findings = Vec::new();
        for dir in self.key_dirs("").await? {
            let Some(key) = &dir.key else {
                findings.push(undecodable(&dir.name, format!("znode {}", dir.path)));
                continue;
            };
            for node in self.children(&client, &dir.path).await? {
                let path = format!("{}/{}", dir.path, node.name);
                let stat = match bounded(self.request_timeout(), client.check_stat(&path)).await {
                    Ok(stat) => stat,
                    Err(e) => return Err(self.zk_error("stat lock node", e)),
                };
                if stat.is_some_and(|s| s.ephemeral_owner == 0) {
                    findings.push(Finding {
                        key: key.to_string(),
                        problem: Problem::NoExpiry,
                        location: format!("znode {path}"),
                        detail: "the lock node is not ephemeral, so no session end will ever \
                                 delete it"
                            .into(),
                    });
                }
            }
        }
        Ok(findings)
    }

    /// The server read from is first synced with the leader, as in `inspect`: a
    /// follower's plain reads may lag behind a grant or a release.
    async fn queued(&self, key: &LockKey) -> Result<Option<usize>, LockError> {
        let client = self.session().await?.client()?;
        bounded(self.request_timeout(), client.sync("/"))
            .await
            .map_err(|e| self.zk_error("queue sync", e))?;
        Ok(Some(self.queue(key).await?.len()))
    }
}
