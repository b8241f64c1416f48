//! A fault counts as fired only on evidence observed from the system (issue 17, item 8).

use tenure_conformance::faults::{clock_jump_offset_ms, heal, inject, Fault};
use tenure_conformance::servers::pid_alive;

use super::{target, Source};

/// A stopped server cannot read its clock: writing the offset file is no evidence that
/// the jump reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_the_server_never_read_did_not_fire() {
    let target = target("redis", &Source::Local { secured: false }, 11)
        .await
        .unwrap();
    let node = &target.nodes()[0];
    node.pause().unwrap();
    let injected = inject(Fault::ClockJump, &target, 0).await;
    node.resume().unwrap();
    let error = injected.expect_err("no evidence while the server was stopped");
    assert!(
        error.contains("the server's last read is Some((0,"),
        "{error}"
    );
    // Running, the server reads it, and says so with its own pid.
    let evidence = inject(Fault::ClockJump, &target, 0).await.unwrap();
    assert!(evidence
        .to_string()
        .starts_with("fired: the server read its"));
    let jump = clock_jump_offset_ms(&target);
    assert!(jump >= 7_000, "past a lease of at least 3 s: {jump} ms");
    assert_eq!(node.clock_applied(), Some((jump, node.pid().unwrap())));
    heal(Fault::ClockJump, &target, 0).await.unwrap();
    assert_eq!(node.clock_applied().map(|(o, _)| o), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_and_pause_evidence_is_observed() {
    let target = target("postgres", &Source::Local { secured: false }, 12)
        .await
        .unwrap();
    let node = &target.nodes()[0];
    let before = node.pid().unwrap();
    let evidence = inject(Fault::Restart, &target, 0).await.unwrap();
    assert_eq!(evidence.0, "a new server process");
    assert_ne!(node.pid(), Some(before));
    assert!(!pid_alive(before));

    let evidence = inject(Fault::ServerPause, &target, 0).await.unwrap();
    assert_eq!(evidence.0, "the server process is stopped (state T)");
    assert_eq!(node.state(), Some('T'));
    heal(Fault::ServerPause, &target, 0).await.unwrap();
    assert_ne!(node.state(), Some('T'));

    // A restart that cannot happen is no evidence: the server was not running.
    node.kill().await.unwrap();
    let error = inject(Fault::Restart, &target, 0).await.unwrap_err();
    assert_eq!(error, "the server was not running");
}
