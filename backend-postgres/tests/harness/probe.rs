//! The suite's queue probe for Postgres.

use tenure_api::LockError;
use tenure_conformance::UrlHarness;
use tenure_postgres::PgLock;

/// `harness` with a probe that counts a key's queue in the server
/// ([`PgLock::queued`]), through a client of its own.
pub(crate) async fn with_queue_probe(harness: UrlHarness) -> Result<UrlHarness, LockError> {
    let observer = PgLock::connect(&harness.url()).await?;
    Ok(harness.with_queue_probe(move |key| {
        let observer = observer.clone();
        async move { observer.queued(&key).await }
    }))
}
