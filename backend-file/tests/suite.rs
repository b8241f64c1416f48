//! The file backend's shared suite and fault suite (`harness = false`; see
//! `tenure_conformance::runner::Suites`), each on a fresh lock directory of the testbed's:
//!
//! - `files::`: the shared suite, every client a `FileLock` of its own on the directory (so
//!   clients exclude each other as processes do: each opens the lock files itself).
//! - `faults::`: the fault suite (the matrix's), checked against the file backend's row:
//!   the paused and suspended holders run; faults of a network or a server do not apply.

use tenure_conformance::faults::expect;
use tenure_conformance::runner;
use tenure_conformance::testbed::TestbedOptions;

fn main() {
    runner::Suites::new()
        .suite("files", || async {
            let lab = tenure_file::TESTBED.start(TestbedOptions::PLAIN).await?;
            Ok(lab.harness)
        })
        .faults("faults", || async {
            let lab = tenure_file::TESTBED.start(TestbedOptions::FAULTS).await?;
            let (target, config) = lab.fault_suite().await?;
            Ok((target, move |fault| expect::expect(&config, fault)))
        })
        .run()
        .exit();
}
