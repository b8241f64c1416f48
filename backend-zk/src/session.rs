//! One ZooKeeper session, and a local watch over its health that does not wait for the
//! server to say the session is gone.
//!
//! ZooKeeper can only tell a client its session expired once the client reaches a server
//! again; a partitioned client hears nothing (the trap Curator fell into, CURATOR-460).
//! So the monitor here declares the session lost on its own once it has been
//! disconnected for longer than the negotiated session timeout, and then drops its
//! client, so that the library closes the session (deleting its ephemeral nodes) if it
//! ever gets through again. Leases additionally carry a deadline anchored on activity the
//! *leader* is known to have seen ([`Session::anchor`], see the crate docs), which is
//! tighter still.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tenure_api::LockError;
use tokio::sync::watch;
use zookeeper_client::{Client, SessionState, StateWatcher};

use crate::config::ZkConfig;
use crate::error::from_zk;

/// What the monitor knows about the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// Connected to a server.
    Connected,
    /// Reconnecting since this instant.
    Disconnected {
        /// When the disconnect was observed.
        since: Instant,
    },
    /// Expired, closed, refused, or disconnected for longer than the session timeout.
    /// Terminal: the session is never used again.
    Lost(String),
}

/// A ZooKeeper session. Dropping the last handle closes it.
pub(crate) struct Session {
    client: Arc<Mutex<Option<Client>>>,
    id: i64,
    timeout: Duration,
    health: watch::Receiver<Health>,
    monitor: tokio::task::JoinHandle<()>,
    /// When the request that created the session was sent: the leader created it later.
    established: Instant,
    /// When recent requests proven to have reached the leader were sent.
    proofs: Arc<Mutex<Proofs>>,
    /// Keeps `proofs` fresh while the session is idle.
    prover: tokio::task::JoinHandle<()>,
}

/// How many proofs [`Proofs`] keeps.
const PROOFS_KEPT: usize = 16;

/// When recent `sync`s that completed were sent (newest last), at least an eighth of a
/// server tick apart: whatever the request rate, the few kept reach back about two ticks,
/// so there is always one at least a tick old to anchor on.
#[derive(Debug)]
struct Proofs {
    tick: Duration,
    sent: VecDeque<Instant>,
}

impl Proofs {
    fn new(tick: Duration) -> Self {
        Self {
            tick,
            sent: VecDeque::with_capacity(PROOFS_KEPT),
        }
    }

    fn record(&mut self, sent: Instant) {
        if self
            .sent
            .back()
            .is_some_and(|last| sent < *last + self.tick / 8)
        {
            return;
        }
        if self.sent.len() == PROOFS_KEPT {
            self.sent.pop_front();
        }
        self.sent.push_back(sent);
    }

    /// The latest proof sent at least a tick before `sent`.
    fn a_tick_before(&self, sent: Instant) -> Option<Instant> {
        let cutoff = sent.checked_sub(self.tick)?;
        self.sent.iter().copied().filter(|p| *p <= cutoff).max()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:#x}", self.id))
            .field("timeout", &self.timeout)
            .field("health", &*self.health.borrow())
            .finish()
    }
}

impl Session {
    /// Establishes a new session, bounded by the configured connect timeout.
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-made session is dropped (and closed) with the future.
    pub(crate) async fn connect(config: &ZkConfig) -> Result<Arc<Self>, LockError> {
        let mut connector = Client::connector().with_session_timeout(config.session_timeout);
        if let Some(digest) = config.digest() {
            connector = connector.with_auth("digest", &digest);
        }
        let target = config.connect_string();
        let established = Instant::now();
        let client =
            match tokio::time::timeout(config.connect_timeout, connector.connect(&target)).await {
                Ok(Ok(client)) => client,
                Ok(Err(error)) => return Err(from_zk("connect", &target, error)),
                Err(_) => {
                    return Err(LockError::Unavailable {
                        message: format!(
                            "connect to {target}: no session within {:?}",
                            config.connect_timeout
                        ),
                        source: None,
                    })
                }
            };
        let id = client.session_id().0;
        let timeout = client.session_timeout();
        let states = client.state_watcher();
        let initial = states.peek_state();
        let slot = Arc::new(Mutex::new(Some(client)));
        let (sender, health) = watch::channel(Health::Connected);
        let monitor = tokio::spawn(monitor(
            states,
            initial,
            timeout,
            sender,
            Arc::downgrade(&slot),
        ));
        let proofs = Arc::new(Mutex::new(Proofs::new(config.server_tick)));
        let prover = tokio::spawn(prover(
            Arc::downgrade(&slot),
            Arc::downgrade(&proofs),
            timeout,
            config.op_timeout,
        ));
        Ok(Arc::new(Self {
            client: slot,
            id,
            timeout,
            health,
            monitor,
            established,
            proofs,
            prover,
        }))
    }

    /// Records that a request sent at `sent` through this session was answered by way of
    /// the leader (a `sync`), so the server this client talks to was then in touch with it.
    pub(crate) fn record(&self, sent: Instant) {
        locked(&self.proofs).record(sent);
    }

    /// The latest moment the leader is known to have seen this session active, as of a
    /// `sync` sent at `sent` that completed: the leader cannot expire the session before
    /// *anchor + session timeout*.
    ///
    /// A follower reports the sessions it saw to the leader once per leader ping (every
    /// half `tick`); a completed `sync` proves the follower was in touch with the leader
    /// when it forwarded it, so activity at least `tick` older than `sent` had been
    /// reported by then (ZooKeeper's own bound, as for `syncLimit`: pings arrive within a
    /// tick). Activity newer than that may never reach the leader. So the anchor is the
    /// latest recorded proof at least a tick (the configured `tick_ms`) before `sent` — or the session's creation,
    /// which the leader made itself. A background `sync` every quarter session timeout
    /// keeps proofs recent while the session is otherwise idle (e.g. waiting in a queue).
    pub(crate) fn anchor(&self, sent: Instant) -> Instant {
        locked(&self.proofs)
            .a_tick_before(sent)
            .map_or(self.established, |p| p.max(self.established))
    }

    /// The session id (the `ephemeral_owner` of its nodes).
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// The negotiated session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle for requests, unless the session is lost.
    pub(crate) fn client(&self) -> Result<Client, LockError> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| LockError::Unavailable {
                message: format!(
                    "ZooKeeper session {:#x} is gone: {}",
                    self.id,
                    self.lost_reason()
                ),
                source: None,
            })
    }

    /// The current health.
    pub(crate) fn health(&self) -> Health {
        self.health.borrow().clone()
    }

    /// Why the session was lost, or a generic text if it was not.
    pub(crate) fn lost_reason(&self) -> String {
        match self.health() {
            Health::Lost(reason) => reason,
            _ => "it was closed".into(),
        }
    }

    /// Whether the session is lost for good.
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self.health(), Health::Lost(_))
    }

    /// Completes (with the reason) once the session is lost.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub(crate) async fn lost(&self) -> String {
        let mut health = self.health.clone();
        let reason = match health.wait_for(|h| matches!(h, Health::Lost(_))).await {
            Ok(h) => match &*h {
                Health::Lost(reason) => reason.clone(),
                _ => String::new(),
            },
            Err(_) => "the session monitor stopped".into(),
        };
        reason
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.monitor.abort();
        self.prover.abort();
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every quarter session timeout, sends a `sync` and records it as a proof once it
/// completes (see [`Session::anchor`]). Stops with the session.
async fn prover(
    client: Weak<Mutex<Option<Client>>>,
    proofs: Weak<Mutex<Proofs>>,
    timeout: Duration,
    op_timeout: Duration,
) {
    let every = (timeout / 4).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let Some(client) = client
            .upgrade()
            .and_then(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner).clone())
        else {
            return;
        };
        let sent = Instant::now();
        if let Ok(Ok(())) = tokio::time::timeout(op_timeout, client.sync("/")).await {
            let Some(proofs) = proofs.upgrade() else {
                return;
            };
            locked(&proofs).record(sent);
        }
    }
}

/// Follows the library's session states; declares the session lost on expiry, close,
/// auth failure, or a disconnect longer than `timeout`, and then drops the client.
async fn monitor(
    mut states: StateWatcher,
    mut state: SessionState,
    timeout: Duration,
    health: watch::Sender<Health>,
    client: Weak<Mutex<Option<Client>>>,
) {
    let mut since: Option<Instant> = None;
    loop {
        let give_up_at = match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                since = None;
                health.send_replace(Health::Connected);
                None
            }
            SessionState::Disconnected => {
                let since = *since.get_or_insert_with(Instant::now);
                health.send_replace(Health::Disconnected { since });
                Some(since + timeout)
            }
            SessionState::Expired => return lose(&health, &client, "the session expired".into()),
            SessionState::Closed => return lose(&health, &client, "the session was closed".into()),
            SessionState::AuthFailed => {
                return lose(&health, &client, "authentication failed".into())
            }
        };
        state = match give_up_at {
            None => states.changed().await,
            Some(at) => tokio::select! {
                next = states.changed() => next,
                _ = tokio::time::sleep_until(at.into()) => {
                    return lose(
                        &health,
                        &client,
                        format!(
                            "disconnected for longer than the session timeout ({timeout:?}): \
                             the ensemble may have expired the session"
                        ),
                    );
                }
            },
        };
    }
}

fn lose(health: &watch::Sender<Health>, client: &Weak<Mutex<Option<Client>>>, reason: String) {
    health.send_replace(Health::Lost(reason));
    // Without a client handle the library closes the session as soon as it can reach a
    // server (or gives up), so nodes we no longer vouch for do not linger.
    if let Some(slot) = client.upgrade() {
        let dropped = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy client proves its session many times per tick; the proofs kept must still
    /// reach back past a tick, or every lease would be anchored on the session's creation.
    #[test]
    fn a_busy_session_still_has_a_proof_a_tick_old() {
        let tick = Duration::from_millis(200);
        let start = Instant::now();
        let mut proofs = Proofs::new(tick);
        for ms in 0..2_000 {
            proofs.record(start + Duration::from_millis(ms));
        }
        let now = start + Duration::from_millis(2_000);
        let anchor = proofs.a_tick_before(now).expect(
            "no proof kept from a tick ago: the anchor falls back to the session's creation",
        );
        assert!(now - anchor <= tick * 2, "anchor {:?} old", now - anchor);
    }
}
