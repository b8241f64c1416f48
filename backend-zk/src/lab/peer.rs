//! The peer `tenure bench --peers` measures tenure against on ZooKeeper: zookeeper-client's
//! own lock recipe (`Client::lock`, a Curator-style node per contender under the key's
//! directory, created as a container when missing); the release deletes the node and
//! waits for the reply, as tenure's does.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError};
use tenure_conformance::testbed::{BoxFuture, Locker};
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

/// How long a contender waits for the lock before its cycle counts as failed.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One recipe client of the server of `url`, on a session of its own.
pub(super) fn connect(url: &str) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    Box::pin(async move {
        let (client, root) = crate::floor::zk_connect(url, "tenure-recipe").await?;
        let recipe: Arc<dyn Locker> = Arc::new(Recipe { client, root });
        Ok(recipe)
    })
}

/// zookeeper-client's lock recipe on one session.
struct Recipe {
    client: Client,
    /// The directory under which each key gets a directory of its own.
    root: String,
}

#[async_trait]
impl Locker for Recipe {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let failed = |what: &str, e: zookeeper_client::Error| format!("{what}: {e}");
        let dir = format!("{}/{}", self.root, key.replace('/', "_"));
        let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(|e| failed("prefix", e))?;
        let options = LockOptions::new(Acls::anyone_all())
            .with_ancestor_options(CreateMode::Container.with_acls(Acls::anyone_all()))
            .map_err(|e| failed("options", e))?;
        // The recipe waits without a bound: a stuck contender fails its cycle instead of
        // holding up the whole run.
        let lock = tokio::time::timeout(LOCK_WAIT, self.client.lock(prefix, &[], options))
            .await
            .map_err(|_| format!("lock: not granted within {LOCK_WAIT:?}"))?
            .map_err(|e| failed("lock", e))?;
        held();
        // The recipe's own release (dropping the guard) deletes in the background,
        // unawaited; a cycle ends when the delete is done, as tenure's release does. The
        // guard is forgotten once its node is gone (which leaks its path, some 80 bytes a
        // cycle: a second, background delete would add a request to every cycle); if the
        // delete failed, dropping the guard tries again.
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
