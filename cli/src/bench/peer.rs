//! Peers: another library's lock on the same servers, run with `--peers` interleaved with
//! tenure (and its floor), so that "as fast as the library users would otherwise pick" is
//! measured in the same run.
//!
//! - zk, `recipe`: zookeeper-client's lock recipe (`Client::lock`, a Curator-style node
//!   per contender under the key's directory, created as a container when missing); the
//!   release deletes the node and waits for the reply, as tenure's does.
//!
//! Other backends have no peer here yet (their Rust peers are separate crates this
//! project does not depend on). A peer is a lock: not with `--permits` or `--election`.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError};

use super::{Locker, Mode};

/// How long a peer's contender waits for the lock before its cycle counts as failed.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The peer lockers for `url` in `mode` (16 clients for `contended`, as for tenure, else
/// one) and the peer's name; `None` for a backend without a peer.
pub(super) async fn lockers(
    url: &str,
    mode: Mode,
) -> Result<Option<(Vec<Arc<dyn Locker>>, &'static str)>, LockError> {
    if tenure::driver_for(url)?.name != "zk" {
        return Ok(None);
    }
    let mut lockers: Vec<Arc<dyn Locker>> = Vec::with_capacity(mode.clients());
    for _ in 0..mode.clients() {
        lockers.push(Arc::new(zk_recipe::ZkRecipe::connect(url).await?));
    }
    Ok(Some((lockers, "recipe")))
}

mod zk_recipe {
    use super::*;
    use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

    /// zookeeper-client's lock recipe on one session.
    pub(crate) struct ZkRecipe {
        client: Client,
        /// The directory under which each key gets a directory of its own.
        root: String,
    }

    impl ZkRecipe {
        pub(crate) async fn connect(url: &str) -> Result<Self, LockError> {
            let (client, root) = tenure_zk::floor::zk_connect(url, "tenure-recipe").await?;
            Ok(Self { client, root })
        }
    }

    #[async_trait]
    impl Locker for ZkRecipe {
        async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
            let failed = |what: &str, e: zookeeper_client::Error| format!("{what}: {e}");
            let dir = format!("{}/{}", self.root, key.replace('/', "_"));
            let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(|e| failed("prefix", e))?;
            let options = LockOptions::new(Acls::anyone_all())
                .with_ancestor_options(CreateMode::Container.with_acls(Acls::anyone_all()))
                .map_err(|e| failed("options", e))?;
            // The recipe waits without a bound: a stuck contender fails its cycle instead
            // of holding up the whole run.
            let lock = tokio::time::timeout(LOCK_WAIT, self.client.lock(prefix, &[], options))
                .await
                .map_err(|_| format!("lock: not granted within {LOCK_WAIT:?}"))?
                .map_err(|e| failed("lock", e))?;
            held();
            // The recipe's own release (dropping the guard) deletes in the background,
            // unawaited; a cycle ends when the delete is done, as tenure's release does.
            // The guard is forgotten once its node is gone (which leaks its path, some 80
            // bytes a cycle: a second, background delete would add a request to every
            // cycle); if the delete failed, dropping the guard tries again.
            let path = lock.lock_path().to_owned();
            match self.client.delete(&path, None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {
                    std::mem::forget(lock);
                    Ok(())
                }
                Err(e) => {
                    drop(lock);
                    Err(failed("delete", e))
                }
            }
        }
    }
}
