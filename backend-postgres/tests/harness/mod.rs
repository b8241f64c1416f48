//! The shared suite against a live PostgreSQL server started by the harness, with extra
//! URL options (e.g. `locking=advisory`).

use tenure_conformance::servers::postgres::Postgres;
use tenure_conformance::{runner, UrlHarness};
use tenure_postgres::PgLock;

/// Runs the suite with `options` added to every client's URL; exits the process.
pub(crate) fn run_suite(options: &'static str) -> ! {
    runner::run_suite(move || async move {
        let server = Postgres::start().await?;
        let template = "postgres://postgres@{hosts}/postgres";
        Ok(UrlHarness::new(
            "postgres",
            template,
            vec![server.addr()],
            |url| async move { PgLock::connect(&url).await },
        )
        .query(&format!("pool_size=2{options}"))
        .cut_query(&format!("pool_size=2&command_timeout_ms=300{options}"))
        .owning(server))
    })
    .exit()
}
