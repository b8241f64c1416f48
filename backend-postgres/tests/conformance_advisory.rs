//! The shared suite against a live PostgreSQL server, with `locking=advisory`.

mod harness;

fn main() {
    harness::run_suite("&locking=advisory")
}
