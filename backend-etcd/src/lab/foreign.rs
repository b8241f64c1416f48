//! `etcdctl lock`, Go's `concurrency.Mutex` behind a command: the mixed-fleet fault's
//! other recipe, and a client of the interop tests.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{async_trait, LockError, LockKey};
use tenure_conformance::foreign::{ForeignClient, ForeignLock, ForeignRecipe};
use tenure_conformance::testbed::BoxFuture;
use tokio::process::Command;

use crate::EtcdConfig;

/// `etcdctl lock NAME` on the member at `endpoint`, in a session of `ttl` (whole
/// seconds): it prints its key (then its empty value) once it holds the lock, and holds
/// it until SIGTERM, then unlocks and exits.
pub fn etcdctl_lock(endpoint: &str, name: &str, ttl: Duration) -> Result<ForeignClient, String> {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("lock")
        .arg(format!("--ttl={}", ttl.as_secs().max(1)))
        .arg(name);
    ForeignClient::try_spawn(format!("etcdctl lock {name}"), command)
}

/// `etcdctl lock` as a [`ForeignLock`]: one `etcdctl` per acquisition, stopped to let go
/// (and when its acquisition gives up: it then deletes its queue key and its session).
#[derive(Debug)]
struct EtcdctlLock {
    endpoint: String,
    name: String,
    ttl: Duration,
    held: Option<ForeignClient>,
}

#[async_trait]
impl ForeignLock for EtcdctlLock {
    fn what(&self) -> String {
        format!("etcdctl lock {}", self.name)
    }

    async fn acquire(&mut self, wait: Duration) -> bool {
        let mut etcdctl = match etcdctl_lock(&self.endpoint, &self.name, self.ttl) {
            Ok(etcdctl) => etcdctl,
            Err(why) => panic!("{why}"),
        };
        if etcdctl.line_within(wait).await.is_some() {
            self.held = Some(etcdctl);
            return true;
        }
        etcdctl.terminate();
        etcdctl.exited(Duration::from_secs(30)).await;
        false
    }

    async fn release(&mut self) {
        if let Some(etcdctl) = self.held.take() {
            etcdctl.terminate();
            etcdctl.exited(Duration::from_secs(30)).await;
        }
    }
}

/// The testbed's other recipe: `etcdctl lock` on the name of tenure's lock of a key.
pub(super) fn recipe(
    url: String,
) -> BoxFuture<'static, Result<(&'static str, ForeignRecipe), LockError>> {
    Box::pin(async move {
        let config = EtcdConfig::from_url(&url)?;
        let endpoint = config.endpoints().join(",");
        let recipe: ForeignRecipe = Arc::new(move |key: LockKey| {
            let lock = EtcdctlLock {
                endpoint: endpoint.clone(),
                name: config.escaped_prefix(key.as_str()),
                ttl: Duration::from_secs(6),
                held: None,
            };
            Box::pin(async move { Ok(Box::new(lock) as Box<dyn ForeignLock>) })
        });
        Ok(("etcdctl lock", recipe))
    })
}
