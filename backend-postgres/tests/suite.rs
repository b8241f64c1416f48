//! The Postgres backend's shared suite and fault suite on live servers the harness starts
//! (`harness = false`; see `tenure_conformance::runner::Suites`): one group of named
//! tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `rows::`: The shared suite against a live PostgreSQL server started by the harness
//!   (row locks).
//! - `advisory::`: The shared suite against a live PostgreSQL server, with
//!   `locking=advisory`.
//! - `secured::`: The shared suite against a Postgres server that requires TLS with a
//!   client certificate and a SCRAM password, as a role with only the privileges of
//!   [`PgConfig::grant_sql`] (`migrate` left on: it finds the objects and creates nothing).
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against a
//!   live Postgres server: every fault, checked against the table's row for Postgres.

mod harness;
mod secured;

use tenure_conformance::faults::expect;
use tenure_conformance::testbed::TestbedOptions;
use tenure_conformance::{runner, UrlHarness};
use tenure_postgres::PgLock;

fn main() {
    runner::Suites::new()
        .suite("rows", || harness::suite_harness(""))
        .suite("advisory", || harness::suite_harness("&locking=advisory"))
        .suite("secured", || async {
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
        .faults("faults", || async {
            let lab = tenure_postgres::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
