//! redis-py's `Lock`: the mixed-fleet fault's other recipe, and a client of the interop
//! tests.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{LockError, LockKey};
use tenure_conformance::foreign::{ForeignClient, ForeignLock, ForeignRecipe};
use tenure_conformance::testbed::BoxFuture;

use crate::RedisConfig;

/// redis-py's `Lock(name, timeout=…)` (no expiry for `None`) on the server at
/// `redis_url` (`redis://host:port[/db]`, no query): a lock driver, once it is ready.
pub async fn redis_py(
    redis_url: &str,
    name: &str,
    timeout: Option<Duration>,
) -> Result<ForeignClient, String> {
    let timeout_ms = timeout.map_or(0, |t| t.as_millis()).to_string();
    ForeignClient::python_lock("redis-py", &[redis_url, name, &timeout_ms]).await
}

/// The testbed's other recipe: redis-py on tenure's lock key of a key, with a timeout
/// as long as the trials hold.
pub(super) fn recipe(
    url: String,
) -> BoxFuture<'static, Result<(&'static str, ForeignRecipe), LockError>> {
    Box::pin(async move {
        let config = RedisConfig::from_url(&url)?;
        let server = url.split('?').next().unwrap_or(&url).to_string();
        let recipe: ForeignRecipe = Arc::new(move |key: LockKey| {
            let (server, name) = (server.clone(), config.lock_key(&key));
            Box::pin(async move {
                let timeout = Some(Duration::from_secs(30));
                let redis_py = redis_py(&server, &name, timeout).await?;
                Ok(Box::new(redis_py) as Box<dyn ForeignLock>)
            })
        });
        Ok(("redis-py", recipe))
    })
}
