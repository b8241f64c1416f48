//! `tenure matrix --quick` end to end on plain local servers (see [`quick_matrix`]): the
//! shared suite, the performance runs, and the cells the report's own sections read
//! (every cell runs in its backend's fault suite).

#![cfg(feature = "lab")]

mod quick_matrix;

use tenure_cli::matrix::Fault;

#[test]
fn quick_matrix_covers_every_backend_with_the_suite_and_perf() {
    let cells = [Fault::PausedHolder, Fault::ReplicaFailover, Fault::Restart];
    let written = quick_matrix::run_and_check(false, &cells, true);
    assert_eq!(written.json["options"]["tls"], false);
}
