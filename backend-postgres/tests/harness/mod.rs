//! The shared suite's harness for a live PostgreSQL server started by the harness, with
//! extra URL options (e.g. `locking=advisory`).

use std::error::Error;

use tenure_conformance::UrlHarness;
use tenure_postgres::lab::Postgres;
use tenure_postgres::PgLock;

/// Starts a server and returns the suite's harness for it: clients with `options` added to
/// their URL (`&`-prefixed).
pub(crate) async fn suite_harness(
    options: &str,
) -> Result<UrlHarness, Box<dyn Error + Send + Sync>> {
    let server = Postgres::start().await?;
    let template = "postgres://postgres@{hosts}/postgres";
    let harness = UrlHarness::new(
        "postgres",
        template,
        vec![server.addr()],
        |url| async move { PgLock::connect(&url).await },
    )
    .query(&format!("pool_size=2{options}"))
    .cut_query(&format!("pool_size=2&command_timeout_ms=300{options}"));
    let observer = PgLock::connect(&harness.url()).await?;
    Ok(harness.with_queue_admin(observer).owning(server))
}
