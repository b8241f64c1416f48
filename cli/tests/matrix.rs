//! `tenure matrix --quick` end to end on plain local servers (see [`quick_matrix`]).

mod quick_matrix;

#[test]
fn quick_matrix_covers_every_backend_and_scenario() {
    let written = quick_matrix::run_and_check(false);
    assert_eq!(written.json["options"]["tls"], false);
}
