//! Before each fault cell (and the performance run), the backend's servers are brought
//! back to health, so a cell's trials never inherit the previous cell's fault: every
//! node running and not stopped, clocks at offset 0, member links healed, every node
//! answering its readiness probe, and the backend granting a lock.

use std::time::{Duration, Instant};

use super::Target;
use crate::retrying;
use crate::servers::Node;
use tenure_api::{LockError, LockKey};

/// How long a node may take to answer again (a restarted member rejoining its cluster on
/// a loaded machine), and the backend to grant a lock.
const RECOVERY: Duration = Duration::from_secs(30);

/// Checks `target` and repairs what a previous fault left behind. Returns what was
/// repaired (empty when all was well), or exactly what is still wrong.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, a node may be left restarting.
pub async fn ensure(target: &Target) -> Result<Vec<String>, String> {
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
