//! The shared suite against a live PostgreSQL server started by the harness (row locks).

mod harness;

fn main() {
    harness::run_suite("")
}
