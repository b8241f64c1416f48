//! Injecting and healing a server fault, and the evidence that it really fired.

use std::time::{Duration, Instant};

use super::{Fault, Target};
use crate::servers::Node;

/// Observed evidence that an injected fault took effect: what the system showed (a new
/// pid, a stopped process, the offset the shimmed server read, dropped member traffic),
/// never that a call returned `Ok`. Its text goes into the cell's notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence(pub String);

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fired: {}", self.0)
    }
}

/// How long to wait for a fault's effect to show.
pub(super) const EVIDENCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `observe` every 10 ms until it returns `Some`, for up to [`EVIDENCE_TIMEOUT`].
pub(super) async fn observed<T>(mut observe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + EVIDENCE_TIMEOUT;
    loop {
        if let Some(seen) = observe() {
            return Some(seen);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the process `pid` is gone (or a zombie).
pub(super) fn exited(pid: u32) -> bool {
    !crate::servers::pid_alive(pid)
}

/// Injects a server fault on node `index` (into
/// [`FaultTarget::with_nodes`](super::FaultTarget::with_nodes)) and returns the evidence
/// that it took effect, or why there is none. [`run`](super::run) injects its server
/// faults with it; [`heal`] undoes it.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, the fault may be left injected
/// ([`ensure`](super::ensure) repairs).
pub async fn inject(fault: Fault, target: &Target, index: usize) -> Result<Evidence, String> {
    let node = &target.nodes[index];
    match fault {
        Fault::ClockJump => {
            let jump = clock_jump_offset_ms(target);
            set_clock(node.as_ref(), jump).await?;
            Ok(Evidence(format!(
                "the server read its +{} s clock offset",
                jump / 1000
            )))
        }
        Fault::Restart => {
            let before = node.pid().ok_or("the server was not running")?;
            let moved_from = node.addr();
            node.restart().await.map_err(|e| e.to_string())?;
            let after = node
                .pid()
                .ok_or("the server is not running after its restart")?;
            if after == before || !exited(before) {
                return Err(format!("pid {before} is still the server after a restart"));
            }
            let moved = match node.addr() {
                a if a == moved_from => String::new(),
                a => format!(" (its port was taken: moved to {})", a.port()),
            };
            Ok(Evidence(format!("a new server process{moved}")))
        }
        Fault::ServerPause => {
            node.pause().map_err(|e| e.to_string())?;
            observed(|| (node.state() == Some('T')).then_some(()))
                .await
                .ok_or_else(|| format!("SIGSTOP sent, but the state is {:?}", node.state()))?;
            Ok(Evidence("the server process is stopped (state T)".into()))
        }
        Fault::MinorityPartition => {
            let links = target
                .peer_links
                .as_ref()
                .ok_or("no control over the links between the members")?;
            let before = links.dropped(index);
            links.isolate(index)?;
            observed(|| (links.dropped(index) > before).then_some(()))
                .await
                .ok_or("the member's links were cut, but none of its traffic was dropped")?;
            Ok(Evidence(
                "the member's traffic with the others was dropped".into(),
            ))
        }
        other => Err(format!("{other:?} is not injected on one server")),
    }
}

/// The lease TTL of a clock-jump trial's holders: the trial TTL, but at least
/// [`CLOCK_JUMP_MIN_TTL`]. The jump is judged only where it lands while the holder still
/// believes it holds, and landing takes the server's reading its new offset plus its
/// cron's 100 ms: with Redis's 500 ms trial TTL a loaded machine (TLS handshakes, every
/// backend's trials on two cores) left too little of the lease for that.
pub fn clock_jump_ttl(target: &Target) -> Duration {
    target.ttl.max(CLOCK_JUMP_MIN_TTL)
}

/// See [`clock_jump_ttl`].
pub const CLOCK_JUMP_MIN_TTL: Duration = Duration::from_secs(3);

/// How far a clock jump moves the server's clock: past every holder's lease on the
/// server (twice the lease TTL, plus a second).
pub fn clock_jump_offset_ms(target: &Target) -> i64 {
    i64::try_from((clock_jump_ttl(target) * 2).as_millis()).unwrap_or(i64::MAX) + 1000
}

/// Shifts a node's clock and waits until the server has read the new offset (the shim's
/// record, with the server's pid) and redis-server has refreshed its cached clock (its
/// 100 ms cron).
pub(super) async fn set_clock(node: &dyn Node, offset_ms: i64) -> Result<(), String> {
    node.set_clock_offset(offset_ms)
        .map_err(|e| e.to_string())?;
    observed(|| (node.clock_applied()? == (offset_ms, node.pid()?)).then_some(()))
        .await
        .ok_or_else(|| {
            format!(
                "offset {offset_ms} ms written, but the server's last read is {:?}",
                node.clock_applied()
            )
        })?;
    tokio::time::sleep(Duration::from_millis(110)).await;
    Ok(())
}

/// Undoes [`inject`], and checks the undo took effect.
///
/// # Cancel safety
/// Not cancel safe: cancelled midway, the fault may be left half undone
/// ([`ensure`](super::ensure) repairs).
pub async fn heal(fault: Fault, target: &Target, node: usize) -> Result<(), String> {
    let node = &target.nodes[node];
    match fault {
        // Back to real time before the next round takes locks: a grant made on the
        // jumped clock would carry an expiry that far in the future.
        Fault::ClockJump => set_clock(node.as_ref(), 0).await,
        Fault::ServerPause => {
            node.resume().map_err(|e| e.to_string())?;
            observed(|| (node.state() != Some('T')).then_some(()))
                .await
                .ok_or_else(|| "SIGCONT sent, but the server is still stopped".to_string())
        }
        Fault::MinorityPartition => {
            if let Some(links) = &target.peer_links {
                links.heal();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
