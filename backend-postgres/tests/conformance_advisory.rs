//! The shared suite against a live PostgreSQL server, with `locking=advisory`.

use tenure_conformance::servers::postgres::Postgres;
use tenure_conformance::{runner, UrlHarness};
use tenure_postgres::PgLock;

fn main() {
    runner::run_suite(|| async {
        let server = Postgres::start().await?;
        let template = "postgres://postgres@{hosts}/postgres";
        Ok(UrlHarness::new(
            "postgres",
            template,
            vec![server.addr()],
            |url| async move { PgLock::connect(&url).await },
        )
        .query("pool_size=2&locking=advisory")
        .cut_query("pool_size=2&locking=advisory&command_timeout_ms=300")
        .owning(server))
    })
    .exit();
}
