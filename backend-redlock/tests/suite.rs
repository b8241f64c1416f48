//! The Redlock backend's shared suite and fault suite on live Redis nodes the harness
//! starts (`harness = false`; see `tenure_conformance::runner::Suites`): one group of
//! named tests per setup, each group's servers started only if one of its tests is selected.
//!
//! - `fenced::`: The shared suite against Redlock on five live redis-servers.
//! - `unfenced::`: The shared suite against Redlock with `fencing=false` (no fence counter,
//!   one round trip per acquire) on five live redis-servers.
//! - `secured::`: The shared suite against Redlock on five redis-servers that each require
//!   TLS with client certificates and a password, as an ACL user limited to
//!   [`tenure_redis::ACL_COMMANDS`] on its own prefix: Redlock's nodes read the same
//!   `ca_file`, `cert_file` and `key_file` as single Redis.
//! - `faults::`: The fault suite (`tenure_conformance::faults`, the matrix's) against five
//!   live masters under the clock shim: every fault, checked against the table's row for
//!   Redlock (with its quorum fence, the default).
//! - `faults_unfenced::`: The same fault suite with `fencing=false`, checked against
//!   Redlock's row for it: the faults a fence contains are violations nothing is sure to
//!   contain.

use tenure_conformance::faults::expect;
use tenure_conformance::runner;
use tenure_conformance::testbed::TestbedOptions;

fn main() {
    runner::Suites::new()
        .suite("fenced", || async {
            Ok(tenure_redlock::TESTBED
                .start(TestbedOptions::PLAIN)
                .await?
                .harness)
        })
        .suite("unfenced", || async {
            let lab = tenure_redlock::TESTBED.start(TestbedOptions::PLAIN).await?;
            Ok(lab.harness.query("fencing=false"))
        })
        .suite("secured", || async {
            Ok(tenure_redlock::TESTBED
                .start(TestbedOptions::SECURED)
                .await?
                .harness)
        })
        .faults("faults", || async {
            let lab = tenure_redlock::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .faults("faults_unfenced", || async {
            let mut lab = tenure_redlock::TESTBED
                .start(TestbedOptions::FAULTS)
                .await?;
            lab.harness = lab.harness.query("fencing=false");
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
