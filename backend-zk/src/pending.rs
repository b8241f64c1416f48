//! Cleaning up after an acquisition that did not finish: its nodes are swept in the
//! background, so a cancelled or failed acquire never leaves a stray node in the queue.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tenure_api::OwnerId;
use zookeeper_client::Error as ZkError;

use crate::error::{bounded, reply_lost, session_gone};
use crate::names::queue;
use crate::queue::Created;
use crate::session::Session;

/// An acquisition in progress in one session. Unless finished, dropping it (error,
/// timeout, or a cancelled future) removes every node of its owner in the background.
pub(crate) struct Pending {
    pub(crate) session: Weak<Session>,
    pub(crate) session_id: i64,
    pub(crate) dir: String,
    pub(crate) owner: OwnerId,
    /// The grant's label: the node's data.
    pub(crate) label: Option<String>,
    /// A reader's acquisition: its node is named as a reader's.
    pub(crate) shared: bool,
    request_timeout: Duration,
    /// Our node, once known: a retry in this session checks it is still there and
    /// waits on it rather than queueing again.
    pub(crate) node: Option<Created>,
    /// A create's reply was lost: a stray node of ours may appear later.
    pub(crate) uncertain: bool,
    armed: bool,
}

impl Pending {
    pub(crate) fn new(
        session: &Arc<Session>,
        dir: String,
        owner: OwnerId,
        (label, shared): (Option<&str>, bool),
        request_timeout: Duration,
    ) -> Self {
        Self {
            session: Arc::downgrade(session),
            session_id: session.id(),
            dir,
            owner,
            label: label.map(str::to_owned),
            shared,
            request_timeout,
            node: None,
            uncertain: false,
            armed: true,
        }
    }

    /// Done: keep `keep` (our held node), or nothing. A lost reply earlier may still leave
    /// a stray node of ours, so sweep for others in the background then.
    pub(crate) fn finish(&mut self, keep: Option<String>) {
        self.armed = false;
        if self.uncertain {
            self.sweep(keep);
        }
    }

    fn sweep(&self, keep: Option<String>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the session's end frees the node
        };
        runtime.spawn(sweep(
            self.session.clone(),
            self.dir.clone(),
            self.owner,
            keep,
            self.request_timeout,
        ));
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed {
            self.sweep(None);
        }
    }
}

/// Failed passes of [`sweep`] at the request-timeout pace, before it backs off and warns.
const QUICK_SWEEPS: u32 = 8;
/// The longest pause between two passes of [`sweep`] once it backs off.
const MAX_SWEEP_PAUSE: Duration = Duration::from_secs(5);

/// Deletes `owner`'s nodes in `dir` except `keep`: passes until two passes succeed (every
/// listing and deletion answered), one `request_timeout` apart (a create still in flight at
/// the first pass lands before the second). Stops when the session is gone — its nodes go
/// with it. While the server does not answer it keeps trying, backing off up to
/// [`MAX_SWEEP_PAUSE`]: a stray node would otherwise hold its place in the queue (or the
/// lock itself) for the session's whole life. After [`QUICK_SWEEPS`] failed passes it
/// logs a warning (target `tenure_zk`), and again once the strays are gone.
async fn sweep(
    session: Weak<Session>,
    dir: String,
    owner: OwnerId,
    keep: Option<String>,
    request_timeout: Duration,
) {
    let mut clean_passes = 0;
    let mut failed_passes = 0u32;
    loop {
        let Some(client) = session.upgrade().and_then(|s| s.client().ok()) else {
            return;
        };
        let pass = match bounded(request_timeout, client.list_children(&dir)).await {
            Ok(children) => {
                let mut clean = true;
                for node in queue(&children)
                    .into_iter()
                    .filter(|n| n.is_of(owner) && Some(&n.name) != keep.as_ref())
                {
                    let path = format!("{dir}/{}", node.name);
                    match bounded(request_timeout, client.delete(&path, None)).await {
                        Ok(()) | Err(ZkError::NoNode) => {}
                        Err(e) if session_gone(&e) => return,
                        Err(_) => clean = false,
                    }
                }
                Ok(clean)
            }
            Err(ZkError::NoNode) => Ok(true),
            Err(e) if session_gone(&e) => return,
            Err(e) if reply_lost(&e) => Ok(false),
            Err(e) => Err(e),
        };
        drop(client);
        match pass {
            Ok(true) => clean_passes += 1,
            Ok(false) => failed_passes += 1,
            Err(error) => {
                tracing::warn!(
                    %dir, %owner, %error,
                    "cannot remove stray lock nodes of an abandoned acquisition; they go \
                     when the session ends"
                );
                return;
            }
        }
        if clean_passes >= 2 {
            if failed_passes >= QUICK_SWEEPS {
                tracing::info!(%dir, %owner, failed_passes, "stray lock nodes removed");
            }
            return;
        }
        if failed_passes == QUICK_SWEEPS {
            tracing::warn!(
                %dir, %owner, failed_passes,
                "stray lock nodes of an abandoned acquisition may hold the key until the \
                 server answers again (or the session ends); still retrying"
            );
        }
        let backoff = failed_passes.saturating_sub(QUICK_SWEEPS).min(16);
        let pause = request_timeout
            .saturating_mul(1 << backoff)
            .min(MAX_SWEEP_PAUSE.max(request_timeout));
        tokio::time::sleep(pause).await;
    }
}
