//! The shared suite against a live PostgreSQL server, with `locking=advisory`.

mod harness;

use tenure_conformance::runner;

fn main() {
    runner::run_suite(|| harness::suite_harness("&locking=advisory")).exit()
}
