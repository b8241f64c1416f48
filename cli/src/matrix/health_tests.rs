//! Each cell runs on servers brought back to health ([`faults::ensure`]).

use std::time::Duration;

use tenure_conformance::faults;
use tenure_conformance::servers::poll_until;

use super::{cell, target, Cell, Fault, MatrixOptions, Source};

/// What a fault can leave behind on a node is repaired, and said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repairs_a_stopped_a_dead_and_a_shifted_server() {
    let target = target("redis", &Source::Local { secured: false }, 1)
        .await
        .unwrap();
    let node = &target.nodes()[0];
    assert_eq!(
        faults::ensure(&target).await,
        Ok(vec![]),
        "healthy at start"
    );

    node.pause().unwrap();
    let repairs = faults::ensure(&target).await.unwrap();
    assert!(repairs[0].ends_with("was stopped: resumed"), "{repairs:?}");
    assert_ne!(node.state(), Some('T'));

    let pid = node.pid().unwrap();
    node.kill().await.unwrap();
    let repairs = faults::ensure(&target).await.unwrap();
    assert!(repairs[0].ends_with("was down: restarted"), "{repairs:?}");
    assert_ne!(node.pid(), Some(pid));

    node.set_clock_offset(60_000).unwrap();
    let read = || async {
        match node.clock_applied() {
            Some((60_000, _)) => Ok(()),
            other => Err(other),
        }
    };
    let every = Duration::from_millis(10);
    poll_until(Duration::from_secs(10), every, read, |last| {
        format!("{last:?}")
    })
    .await
    .expect("the shifted server read its offset");
    let repairs = faults::ensure(&target).await.unwrap();
    assert!(
        repairs[0].ends_with("had its clock shifted by 60000 ms: reset"),
        "{repairs:?}"
    );
    assert_eq!(node.clock_applied().map(|(o, _)| o), Some(0));
}

/// The matrix's symptom: a fault left the Postgres server down, and every later cell
/// read "not fired" ("connection refused"). Now the next cell runs on a restarted
/// server, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_after_a_server_was_left_down_runs_on_a_repaired_one() {
    let target = target("postgres", &Source::Local { secured: false }, 2)
        .await
        .unwrap();
    target.nodes()[0].kill().await.unwrap();
    let options = MatrixOptions {
        trials: 2,
        rounds: 1,
        ..MatrixOptions::quick()
    };
    let cell = cell(Fault::ServerPause, &target, &options).await;
    let Cell::Ran {
        counts,
        not_fired,
        notes,
        ..
    } = &cell
    else {
        panic!("{cell:?}")
    };
    assert_eq!(*not_fired, 0, "{cell:?}");
    assert_eq!(counts.values().sum::<usize>(), 2, "{cell:?}");
    assert!(
        notes[0].starts_with("before this cell, node 0") && notes[0].ends_with("restarted"),
        "{notes:?}"
    );
}

/// A backend that cannot be repaired gives a cell that says exactly what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrepairable_backend_says_what_is_wrong() {
    let target = target("etcd", &Source::Local { secured: false }, 3)
        .await
        .unwrap();
    let node = &target.nodes()[1];
    let addr = node.addr();
    node.kill().await.unwrap();
    // etcd members keep their ports (peers know them): a squatter keeps it down.
    let _squatter = std::net::TcpListener::bind(addr).unwrap();
    let options = MatrixOptions::quick();
    match cell(Fault::ServerPause, &target, &options).await {
        Cell::Unhealthy { reason } => {
            assert!(
                reason.starts_with("node 1 (etcd") && reason.contains("did not restart"),
                "{reason}"
            );
            assert!(
                reason
                    .to_ascii_lowercase()
                    .contains("address already in use"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}
