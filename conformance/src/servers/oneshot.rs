//! A command a server needs run before it starts (`mariadb-install-db`): to its end, in a
//! process group of its own, so that the helpers it forks (the bootstrap server) are
//! killed with it if it is abandoned.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::process::{log_tail_since, register_spawned, CommandSpec, LOG_TAIL_BYTES};
use super::{Result, ServerError};

/// Runs `spec` to its end, its stdout and stderr appended to `log`, in a process group of
/// its own that is killed (`SIGKILL`, helpers it forked included) if it runs longer than
/// `limit` or the future is dropped. A failure, or a non-zero exit, is a
/// [`ServerError::Start`] of `what` with the tail of what it wrote.
///
/// # Cancel safety
/// Cancel safe: the command's process group is killed when the future is dropped.
pub async fn run_once(what: &str, spec: &CommandSpec, log: &Path, limit: Duration) -> Result<()> {
    let mut file = OpenOptions::new().create(true).append(true).open(log)?;
    let since = file.metadata()?.len();
    writeln!(file, "==== tenure: running {what}: {}", spec.display())?;
    let failed = |detail: String| ServerError::Start {
        what: what.to_owned(),
        detail: format!(
            "{detail}\n--- last lines of {} ---\n{}",
            log.display(),
            log_tail_since(log, since, LOG_TAIL_BYTES)
        ),
    };
    let mut child = spec
        .command(file)?
        .spawn()
        .map_err(|e| failed(format!("spawning {}: {e}", spec.display())))?;
    let pid = child
        .id()
        .ok_or_else(|| failed("spawned process has no pid".into()))?;
    register_spawned(pid);
    // Until the leader is reaped its pid names the group, so the kill cannot hit another.
    let group = KillGroupOnDrop(Some(pid));
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => {
            group.disarm();
            status?
        }
        Err(_) => {
            drop(group);
            child.wait().await?;
            return Err(failed(format!("still running after {limit:?}")));
        }
    };
    match status.success() {
        true => Ok(()),
        false => Err(failed(format!("exited with {status}"))),
    }
}

/// `SIGKILL`s the process group it names when dropped, unless disarmed.
struct KillGroupOnDrop(Option<u32>);

impl KillGroupOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(raw) = self.0.and_then(|pid| i32::try_from(pid).ok()) {
            let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
}
