//! Curator, whose node names tenure's follow by default: the mixed-fleet fault's other
//! recipe, and a client of the interop tests.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{LockError, LockKey};
use tenure_conformance::foreign::{ForeignClient, ForeignLock, ForeignRecipe};
use tenure_conformance::testbed::BoxFuture;
use tokio::process::Command;

use crate::names::encode_key;
use crate::ZkConfig;

/// Curator's jars as Debian installs them (`libcurator-recipes-java`).
const CURATOR_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

/// The lock driver of Curator's `InterProcessMutex` (see `tenure_conformance::foreign`).
const CURATOR_LOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lab/CuratorLock.java");

/// Curator's `InterProcessMutex` on `path` of the ensemble at `hosts`, in a session
/// `session` long: the lock driver `CuratorLock.java`, run by Java's single-file source
/// launcher (which needs a JDK), once it is ready.
pub async fn curator(hosts: &str, session: Duration, path: &str) -> Result<ForeignClient, String> {
    let classpath: Vec<String> = CURATOR_JARS
        .iter()
        .map(|jar| format!("/usr/share/java/{jar}.jar"))
        .collect();
    let mut command = Command::new("java");
    command
        .arg("-cp")
        .arg(classpath.join(":"))
        .arg(CURATOR_LOCK)
        .arg(hosts)
        .arg(session.as_millis().to_string())
        .arg(path);
    ForeignClient::lock_driver(format!("curator {path}"), command).await
}

/// The testbed's other recipe: Curator on the directory of tenure's lock of a key.
pub(super) fn recipe(
    url: String,
) -> BoxFuture<'static, Result<(&'static str, ForeignRecipe), LockError>> {
    Box::pin(async move {
        let config = ZkConfig::from_url(&url)?;
        let (hosts, root) = (config.connect_string(), config.lock_root());
        let session = config.session_timeout;
        let recipe: ForeignRecipe = Arc::new(move |key: LockKey| {
            let hosts = hosts.clone();
            let dir = format!("{root}/{}", encode_key(key.as_str()));
            Box::pin(async move {
                let curator = curator(&hosts, session, &dir).await?;
                Ok(Box::new(curator) as Box<dyn ForeignLock>)
            })
        });
        Ok(("curator", recipe))
    })
}
