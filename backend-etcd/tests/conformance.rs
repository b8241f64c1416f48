//! The shared suite against a live 3-member etcd cluster, with session leases (the default).

mod harness;

fn main() {
    harness::run_suite("")
}
