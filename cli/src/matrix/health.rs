//! Before each fault cell (and the performance run), the backend's servers are brought
//! back to health, so a cell's trials never inherit the previous cell's fault: every
//! node running and not stopped, clocks at offset 0, member links healed, every node
//! answering its readiness probe, and the backend granting a lock.

use std::time::{Duration, Instant};

use tenure_api::{LockError, LockKey};
use tenure_conformance::retrying;
use tenure_conformance::servers::Node;

use super::Target;

/// How long a node may take to answer again (a restarted member rejoining its cluster on
/// a loaded machine), and the backend to grant a lock.
const RECOVERY: Duration = Duration::from_secs(30);

/// Checks `target` and repairs what a previous fault left behind. Returns what was
/// repaired (empty when all was well), or exactly what is still wrong.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, a node may be left restarting.
pub(crate) async fn ensure(target: &Target) -> Result<Vec<String>, String> {
    let mut repairs = Vec::new();
    if let Some(links) = &target.peer_links {
        links.heal();
    }
    for (i, node) in target.nodes.iter().enumerate() {
        let name = format!("node {i} ({})", node.label());
        if node.is_running() && (node.is_paused() || node.state() == Some('T')) {
            node.resume()
                .map_err(|e| format!("{name} is stopped and could not be resumed: {e}"))?;
            wait_for(|| node.state() != Some('T'))
                .await
                .map_err(|()| format!("{name} is still stopped after SIGCONT"))?;
            repairs.push(format!("{name} was stopped: resumed"));
        }
        if !node.is_running() {
            node.restart()
                .await
                .map_err(|e| format!("{name} was down and did not restart: {e}"))?;
            repairs.push(format!("{name} was down: restarted"));
        }
        if target.clock_shim {
            let off = node.clock_applied().map_or(0, |(off, _)| off);
            node.set_clock_offset(0)
                .map_err(|e| format!("{name}: cannot reset its clock: {e}"))?;
            if off != 0 {
                wait_for(|| node.clock_applied().is_some_and(|(o, _)| o == 0))
                    .await
                    .map_err(|()| format!("{name}: its clock stays shifted by {off} ms"))?;
                repairs.push(format!("{name} had its clock shifted by {off} ms: reset"));
            }
        }
    }
    for (i, node) in target.nodes.iter().enumerate() {
        if answers(node.as_ref()).await.is_ok() {
            continue;
        }
        let name = format!("node {i} ({})", node.label());
        node.restart()
            .await
            .map_err(|e| format!("{name} did not answer and did not restart: {e}"))?;
        answers(node.as_ref())
            .await
            .map_err(|e| format!("{name} does not answer even after a restart: {e}"))?;
        repairs.push(format!("{name} did not answer: restarted"));
    }
    grants(target)
        .await
        .map_err(|e| format!("no lock granted within {}s: {e}", RECOVERY.as_secs()))?;
    Ok(repairs)
}

/// Polls `cond` every 10 ms for up to 10 s.
async fn wait_for(mut cond: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        if Instant::now() >= deadline {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Whether the node answers its readiness probe within [`RECOVERY`].
async fn answers(node: &dyn Node) -> Result<(), String> {
    let deadline = Instant::now() + RECOVERY;
    loop {
        match node.probe().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A fresh client takes and releases a lock of its own within [`RECOVERY`].
async fn grants(target: &Target) -> Result<(), LockError> {
    let key = LockKey::new(format!(
        "tenure-matrix/{:08x}/health/{:08x}",
        target.run_id,
        rand::random::<u32>()
    ))
    .expect("ascii key well under the length limit");
    let (result, _) = retrying(RECOVERY, || async {
        let client = target.client().await?;
        match client.try_acquire(&key, target.ttl * 4).await? {
            Some(lease) => {
                let _ = client.release(lease).await;
                Ok(())
            }
            None => Err(LockError::backend("a fresh key was reported held")),
        }
    })
    .await;
    result
}

#[cfg(test)]
mod tests {
    use super::super::{cell, target, Cell, Fault, MatrixOptions, Source};
    use super::*;

    /// What a fault can leave behind on a node is repaired, and said.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn repairs_a_stopped_a_dead_and_a_shifted_server() {
        let target = target("redis", &Source::Local { secured: false }, 1)
            .await
            .unwrap();
        let node = &target.nodes[0];
        assert_eq!(ensure(&target).await, Ok(vec![]), "healthy at start");

        node.pause().unwrap();
        let repairs = ensure(&target).await.unwrap();
        assert!(repairs[0].ends_with("was stopped: resumed"), "{repairs:?}");
        assert_ne!(node.state(), Some('T'));

        let pid = node.pid().unwrap();
        node.kill().await.unwrap();
        let repairs = ensure(&target).await.unwrap();
        assert!(repairs[0].ends_with("was down: restarted"), "{repairs:?}");
        assert_ne!(node.pid(), Some(pid));

        node.set_clock_offset(60_000).unwrap();
        wait_for(|| node.clock_applied().is_some_and(|(o, _)| o == 60_000))
            .await
            .expect("the shifted server read its offset");
        let repairs = ensure(&target).await.unwrap();
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
        target.nodes[0].kill().await.unwrap();
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
        let node = &target.nodes[1];
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
}
