//! The shared suite against a live 3-member etcd cluster, with `lease=per-lock`.

mod harness;

fn main() {
    harness::run_suite("lease=per-lock")
}
