//! The shared suite's harness on the testbed's live PostgreSQL server (the server the
//! matrix and the fault suite run on), with extra URL options (e.g. `locking=advisory`).

use std::error::Error;

use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::UrlHarness;
use tenure_postgres::PgLock;

/// Starts a server (plain, or secured as `servers` says) and returns the suite's harness
/// for it: clients with `options` added to their URL (`&`-prefixed), each with a pool of
/// two connections.
pub(crate) async fn suite_harness(
    options: &str,
    servers: TestbedOptions,
) -> Result<UrlHarness, Box<dyn Error + Send + Sync>> {
    let lab = tenure_postgres::TESTBED.start(servers).await?;
    let harness = lab
        .harness
        .query(&format!("pool_size=2{options}"))
        .cut_query(&format!(
            "pool_size=2&request_timeout_ms=300&migrate=false{options}"
        ));
    // The FIFO scenario counts a key's queue through a client of its own, configured as
    // the suite's (an advisory lock's queue is not a row lock's).
    let observer = PgLock::connect(&harness.url()).await?;
    Ok(harness.with_queue_admin(observer))
}
