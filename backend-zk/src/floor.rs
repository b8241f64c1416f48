//! The floors on ZooKeeper (feature `testbed`, for `tenure bench --floor`), both with the
//! plain `zookeeper-client` crate:
//!
//! - the *protocol floor* (`floor`, `ZkFloor`): an ephemeral sequential node created
//!   under one parent, then deleted;
//! - the *same-work floor* (`same_work`, `ZkSameWork`): the requests tenure's
//!   `try_acquire` of a fresh key and its `release` send, in the same order, to the same
//!   paths, with the same modes and ACLs, and none of tenure's client-side work.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};
use zookeeper_client::{Acls, Client, Connector, CreateMode, Error as ZkError};

use crate::names::{encode_key, NodeNames};
use crate::ZkConfig;

/// Ephemeral sequential create under one parent, then delete.
pub(crate) struct ZkFloor {
    client: Client,
    parent: String,
}

impl ZkFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        let (client, parent) = zk_connect(url, "tenure-floor").await?;
        Ok(Self { client, parent })
    }
}

/// A plain client session for the server of a `zk://` URL, and the persistent node
/// `name` under its chroot (created if missing).
pub async fn zk_connect(url: &str, name: &str) -> Result<(Client, String), LockError> {
    let config = ZkConfig::from_url(url)?;
    let client = plain_connect(&config, Client::connector()).await?;
    let parent = format!("{}/{name}", config.chroot());
    make_persistent(&client, &parent, Acls::anyone_all()).await?;
    Ok((client, parent))
}

/// `connector`, given `config`'s digest credentials if it has any, connected to its
/// servers over plain TCP, without a chroot (paths are absolute, as tenure's are).
async fn plain_connect(config: &ZkConfig, mut connector: Connector) -> Result<Client, LockError> {
    if let Some(digest) = config.digest() {
        connector = connector.with_auth("digest", &digest);
    }
    connector
        .connect(&config.connect_string())
        .await
        .map_err(|e| LockError::unavailable("bench connect", e))
}

/// Creates the persistent node `path` and those of its ancestors that are missing, with
/// `acls`, one `create` per path component.
async fn make_persistent(client: &Client, path: &str, acls: Acls<'_>) -> Result<(), LockError> {
    let persistent = CreateMode::Persistent.with_acls(acls);
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        match client.create(&at, &[], &persistent).await {
            Ok(_) | Err(ZkError::NodeExists) => {}
            Err(e) => return Err(LockError::unavailable("bench parent node", e)),
        }
    }
    Ok(())
}

#[async_trait]
impl Locker for ZkFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let prefix = format!("{}/{}-", self.parent, key.replace('/', "_"));
        let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (_, sequence) = self
            .client
            .create(&prefix, &[], &mode)
            .await
            .map_err(|e| cycle_failed("create", e))?;
        held();
        self.client
            .delete(&format!("{prefix}{sequence}"), None)
            .await
            .map_err(|e| cycle_failed("delete", e))
    }
}

/// The floor for a `zk://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(ZkFloor::connect(url))
}

/// tenure's server work for one bench cycle — `try_acquire` of a fresh key with the
/// default URL options, then `release` — sent by a bare client. Per cycle, in this order,
/// each request answered before the next is sent (as tenure awaits each):
///
/// 1. `create` (`Create2`) of `<dir>/<node prefix>` (`_c_<owner as UUID>-lock-` by
///    default), ephemeral sequential, no data:
///    `NoNode`, as the fresh key has no node yet;
/// 2. `create` (`CreateContainer`) of `<dir>`, the key's node, a container (persistent
///    with `node_names=kazoo`, as tenure makes it then);
/// 3. the same `create` as in 1, now the contender node `<dir>/<node prefix><sequence>`;
///    its `czxid`, in the reply's stat, is tenure's fencing token (no separate read);
/// 4. `getChildren` (`GetChildren2`, no watch) of `<dir>`: the queue, where the contender
///    is alone, so first. No `sync` before it: the create just answered went through the
///    leader and stands for one (tenure syncs before a listing only when no such create
///    does: after a lost create reply, or for a waiter woken long after its last proof;
///    and before the reads of `extend` and `inspect`, never in this cycle);
/// 5. `delete` of the contender node, at version 0: the `release` (after `held`).
///
/// `<dir>` is `<lock root>/<encoded key>` and the node named in the URL's
/// `node_names` layout with a random owner id, built with tenure's own helpers; every node gets tenure's ACLs
/// (`creator_all` with credentials, else `anyone_all`). The lock root (`<chroot>/<prefix>`,
/// or the chroot with an empty prefix) is made once, on connecting, with those ACLs (tenure makes it within the first cycle
/// that finds it missing, then never again). The session is asked for the URL's session
/// timeout, as tenure's is. Not sent: the `sync` tenure's session sends every quarter
/// session timeout, whatever the cycles (session upkeep, not cycle work); and nothing of
/// tenure's client side — no owner id check, retry, deadline or watch.
#[derive(Debug)]
pub(crate) struct ZkSameWork {
    client: Client,
    /// `<chroot>/<prefix>`, under which each key has its node.
    lock_root: String,
    /// The ACLs tenure gives the nodes it creates.
    acls: Acls<'static>,
    /// The layout tenure names its nodes in.
    node_names: NodeNames,
}

impl ZkSameWork {
    pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
        let config = ZkConfig::from_url(url)?;
        if config.tls {
            return Err(LockError::Config(format!(
                "{}: the ZooKeeper same-work floor connects over plain TCP only, not zks://",
                config.connect_string()
            )));
        }
        // As `ZkLock::with_config` chooses them.
        let acls = match config.user() {
            Some(_) => Acls::creator_all(),
            None => Acls::anyone_all(),
        };
        let connector = Client::connector().with_session_timeout(config.session_timeout);
        let client = plain_connect(&config, connector).await?;
        let lock_root = config.lock_root();
        make_persistent(&client, &lock_root, acls).await?;
        Ok(Self {
            client,
            lock_root,
            acls,
            node_names: config.node_names,
        })
    }
}

#[async_trait]
impl Locker for ZkSameWork {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let dir = format!("{}/{}", self.lock_root, encode_key(key));
        let prefix = self.node_names.prefix(OwnerId::random());
        let contender = format!("{dir}/{prefix}");
        let ephemeral = CreateMode::EphemeralSequential.with_acls(self.acls);
        let created = match self.client.create(&contender, &[], &ephemeral).await {
            // The fresh key has no node yet: make it, then create the contender again.
            Err(ZkError::NoNode) => {
                let container = match self.node_names.persistent_dirs() {
                    true => CreateMode::Persistent,
                    false => CreateMode::Container,
                }
                .with_acls(self.acls);
                match self.client.create(&dir, &[], &container).await {
                    Ok(_) | Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(cycle_failed("create key node", e)),
                }
                self.client.create(&contender, &[], &ephemeral).await
            }
            other => other,
        };
        let (_, sequence) = created.map_err(|e| cycle_failed("create contender node", e))?;
        let name = format!("{prefix}{sequence}");
        let (children, _) = self
            .client
            .get_children(&dir)
            .await
            .map_err(|e| cycle_failed("list key node", e))?;
        if children.len() != 1 || children[0] != name {
            return Err(format!("the fresh key's node {dir} holds {children:?}"));
        }
        held();
        self.client
            .delete(&format!("{dir}/{name}"), Some(0))
            .await
            .map_err(|e| cycle_failed("delete contender node", e))
    }
}

/// The same-work floor for a `zk://` URL.
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(ZkSameWork::connect(url))
}
