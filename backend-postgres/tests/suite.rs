//! The Postgres backend's shared suite and fault suite on live servers the harness starts
//! (`harness = false`; see `tenure_conformance::runner::Suites`): one group of named
//! tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `rows::`: The shared suite against a live PostgreSQL server started by the harness
//!   (row locks).
//! - `advisory::`: The shared suite against a live PostgreSQL server, with
//!   `locking=advisory`.
//! - `lease::`: The shared suite against a live PostgreSQL server, with `locking=lease`
//!   (a row per key with a server-computed expiry; no connection held).
//! - `secured::`: The shared suite against a Postgres server that requires TLS with a
//!   client certificate and a SCRAM password, as a role with only the privileges of
//!   `PgConfig::grant_sql` (`migrate` left on for every client but the link-cut ones: it
//!   finds the objects and creates nothing).
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against a
//!   live Postgres server: every fault, checked against the table's row for Postgres.
//! - `lease-faults::`: The same with `locking=lease`, against the lease mode's row.

mod harness;

use tenure_conformance::faults::expect;
use tenure_conformance::runner;
use tenure_conformance::testbed::TestbedOptions;

fn main() {
    runner::Suites::new()
        .suite("rows", || harness::suite_harness("", TestbedOptions::PLAIN))
        .suite("advisory", || {
            harness::suite_harness("&locking=advisory", TestbedOptions::PLAIN)
        })
        .suite("lease", || {
            harness::suite_harness("&locking=lease", TestbedOptions::PLAIN)
        })
        .suite("secured", || {
            harness::suite_harness("", TestbedOptions::SECURED)
        })
        .faults("faults", || async {
            let lab = tenure_postgres::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .faults("lease-faults", || async {
            let lab = tenure_postgres::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?
                .configured(&tenure_postgres::lab::LEASE)
                .await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
