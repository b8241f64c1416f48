//! The shared suite against a live PostgreSQL server started by the harness (row locks).

mod harness;

use tenure_conformance::runner;

fn main() {
    runner::run_suite(|| harness::suite_harness("")).exit()
}
