//! The shared suite against a Postgres server that requires TLS with a client certificate
//! and a SCRAM password, as a role with only the privileges of [`PgConfig::grant_sql`]
//! (`migrate` left on: it finds the objects and creates nothing).
//!
//! [`PgConfig::grant_sql`]: tenure_postgres::PgConfig::grant_sql

mod secured;

use tenure_conformance::{runner, UrlHarness};
use tenure_postgres::PgLock;

fn main() {
    runner::run_suite(|| async {
        let (server, secrets) = secured::start().await?;
        let harness = UrlHarness::new(
            "postgres",
            &secrets.url("{hosts}"),
            vec![server.addr()],
            |url| async move { PgLock::connect(&url).await },
        )
        .query("pool_size=2")
        .cut_query("pool_size=2&request_timeout_ms=300");
        let observer = PgLock::connect(&harness.url()).await?;
        Ok(harness.with_queue_admin(observer).owning(server))
    })
    .exit()
}
