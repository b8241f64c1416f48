//! `tenure matrix --quick --tls` end to end (see [`quick_matrix`]): every backend's
//! servers require TLS, client certificates and a password, the lab connects as users
//! with least privilege, and its faults go through the proxy over TLS. No password
//! reaches a report or the terminal. (The shared suite over TLS runs in each backend's
//! `tests/suite.rs`, group `secured`.)

#![cfg(feature = "lab")]

mod quick_matrix;

use tenure_cli::matrix::Fault;

#[test]
fn quick_matrix_over_tls_with_least_privilege() {
    let cells = [
        Fault::PausedHolder,
        Fault::ConnectionCut,
        Fault::ReplicaFailover,
    ];
    let written = quick_matrix::run_and_check(true, &cells, false);
    assert_eq!(written.json["options"]["tls"], true);
    for backend in written.json["backends"].as_array().unwrap() {
        let servers = backend["servers"].as_str().unwrap();
        assert!(
            servers.ends_with("requiring TLS, a client certificate and a password"),
            "{servers}"
        );
    }
    let (_, markdown) = &written.files[0];
    assert!(markdown.contains("Secured servers (`--tls`)"), "{markdown}");
    // Every local URL names user `tenure` with its password (32 hex digits): no
    // `tenure:<password>` may be shown (a redacted URL shows `tenure:***`).
    let texts = written
        .files
        .iter()
        .map(|(name, text)| (*name, text.as_str()));
    for (name, text) in texts.chain([("stdout", &*written.stdout), ("stderr", &*written.stderr)]) {
        let shown = text.match_indices("tenure:").any(|(at, found)| {
            text[at + found.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_hexdigit())
        });
        assert!(!shown, "{name} shows a password");
    }
}
