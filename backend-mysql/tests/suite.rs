//! The MySQL backend's shared suite and fault suite on a live MariaDB server the harness
//! starts (`harness = false`; see `tenure_conformance::runner::Suites`):
//!
//! - `get_lock::`: the shared suite, named locks (`GET_LOCK`).
//! - `rows::`: the same with `locking=row` (`SELECT … FOR UPDATE NOWAIT` in an open
//!   transaction).
//! - `secured::`: the same against a server that requires TLS with a client certificate
//!   and a password, as a user with only the privileges of `MySqlConfig::grant_sql`.
//! - `faults::`: the fault suite (the matrix's), checked against the table's row for MySQL.
//! - `row-faults::`: the same with `locking=row`.

use tenure_conformance::faults::expect;
use tenure_conformance::runner;
use tenure_conformance::testbed::TestbedOptions;

fn main() {
    runner::Suites::new()
        .suite("get_lock", || async {
            let lab = tenure_mysql::TESTBED.start(TestbedOptions::PLAIN).await?;
            Ok(lab.harness)
        })
        .suite("rows", || async {
            let lab = tenure_mysql::TESTBED
                .start(TestbedOptions::PLAIN)
                .await?
                .configured(&tenure_mysql::lab::ROW)
                .await?;
            Ok(lab.harness)
        })
        .suite("secured", || async {
            let lab = tenure_mysql::TESTBED.start(TestbedOptions::SECURED).await?;
            Ok(lab.harness)
        })
        .faults("faults", || async {
            let lab = tenure_mysql::TESTBED.start(TestbedOptions::FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .faults("row-faults", || async {
            let lab = tenure_mysql::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?
                .configured(&tenure_mysql::lab::ROW)
                .await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
