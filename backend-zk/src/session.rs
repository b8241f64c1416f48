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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use tenure_api::LockError;
use tokio::sync::watch;
use zookeeper_client::{
    Client, Error as ZkError, OneshotWatcher, SessionState, StateWatcher, TlsOptions,
};

use crate::config::ZkConfig;
use crate::error::{bounded, from_zk};

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
    /// Lease nodes of this session under a watch, by path.
    watched: Mutex<Watches>,
    /// The `sync` in flight that renewals may share. It holds a client handle, so the
    /// monitor empties it when it declares the session lost (see [`lose`]).
    syncing: Arc<Mutex<Option<InFlight>>>,
}

/// The watches of a session's lease nodes, by path.
#[derive(Default)]
struct Watches {
    by_path: HashMap<String, Watched>,
    /// Entries whose watch fired are dropped when there are this many: a lease dropped
    /// without release, or released through another session, leaves one behind.
    prune_at: usize,
}

/// A watch on a lease's node, set when the node was read and found to be the lease's.
/// The server notifies the session when the node is deleted or changed (or the session
/// ends), and it sends that notification before its reply to any later request of the
/// session: so as long as the watch has not fired, a `sync` sent after `since` and
/// answered proves the node still existed when the leader answered it.
struct Watched {
    /// When the reply that set the watch arrived.
    since: Instant,
    /// Completes when the watch fires (`None` if the client library went away).
    fired: BoxFuture<'static, Option<zookeeper_client::WatchedEvent>>,
}

/// A `sync` sent at `sent`, shared by whoever waits for it.
struct InFlight {
    sent: Instant,
    reply: Shared<BoxFuture<'static, Result<(), ZkError>>>,
}

/// A `sync` in flight is shared by renewals for 1/`JOIN_WITHIN` of the session timeout
/// after it was sent (see [`Session::sync_since`]).
const JOIN_WITHIN: u32 = 100;

/// A woken waiter's own proof stands for a new `sync` for 1/`REUSE_WITHIN` of its lease's
/// length (see [`Session::stands_for_sync`]).
const REUSE_WITHIN: u32 = 10;

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
    /// The latest proof: the session was heard from after it.
    fn latest(&self) -> Option<Instant> {
        self.sent.back().copied()
    }

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

/// The TLS options of a `zks://` configuration: its CA and client certificate, read now.
fn tls_options(config: &ZkConfig) -> Result<TlsOptions, LockError> {
    tenure_api::tls::install_crypto_provider();
    let endpoint = config.connect_string();
    if config.ca_file.is_none() {
        return Err(LockError::Config(format!(
            "{endpoint}: zks:// needs ca_file (the CA that signed the servers' certificates): \
             the ZooKeeper client has no built-in roots"
        )));
    }
    let pem = tenure_api::tls::read_pem_files(
        &endpoint,
        config.ca_file.as_deref(),
        config.cert_file.as_deref(),
        config.key_file.as_deref(),
    )?;
    let text = |bytes: Vec<u8>, name: &str| {
        String::from_utf8(bytes)
            .map_err(|_| LockError::Config(format!("{endpoint}: {name} is not UTF-8 PEM text")))
    };
    let bad = |e: ZkError| LockError::Config(format!("{endpoint}: TLS files: {e}"));
    let mut tls = TlsOptions::new();
    if let Some(ca) = pem.ca {
        tls = tls.with_pem_ca(&text(ca, "ca_file")?).map_err(bad)?;
    }
    if let Some((cert, key)) = pem.identity {
        let (cert, key) = (text(cert, "cert_file")?, text(key, "key_file")?);
        tls = tls.with_pem_identity(&cert, &key).map_err(bad)?;
    }
    Ok(tls)
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
        if config.tls {
            connector = connector.with_tls(tls_options(config)?);
        }
        let target = config.connect_string();
        let connecting = async {
            match config.tls {
                true => connector.secure_connect(&target).await,
                false => connector.connect(&target).await,
            }
        };
        let established = Instant::now();
        let client = match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(from_zk("connect", &target, error)),
            Err(_) => {
                // The client retries every server until then and keeps no cause (a refused
                // TLS handshake looks like an unreachable server).
                let hint = match config.tls {
                    true => {
                        " (over zks://: if the servers refuse the TLS handshake, check ca_file, \
                         and cert_file and key_file where they require client certificates)"
                    }
                    false => " (if the servers' client port is TLS-only, use zks://)",
                };
                return Err(LockError::Unavailable {
                    message: format!(
                        "connect to {target}: no session within {:?}{hint}",
                        config.connect_timeout
                    ),
                    source: None,
                });
            }
        };
        let id = client.session_id().0;
        let timeout = client.session_timeout();
        let states = client.state_watcher();
        let initial = states.peek_state();
        let slot = Arc::new(Mutex::new(Some(client)));
        let (sender, health) = watch::channel(Health::Connected);
        let proofs = Arc::new(Mutex::new(Proofs::new(config.server_tick)));
        let syncing = Arc::new(Mutex::new(None));
        let monitor = tokio::spawn(monitor(
            states,
            initial,
            timeout,
            sender,
            Handles {
                client: Arc::downgrade(&slot),
                syncing: Arc::downgrade(&syncing),
            },
            Arc::downgrade(&proofs),
        ));
        let prover = tokio::spawn(prover(
            Arc::downgrade(&slot),
            Arc::downgrade(&proofs),
            timeout,
            config.request_timeout,
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
            watched: Mutex::new(Watches::default()),
            syncing,
        }))
    }

    /// Remembers `watcher`, set on the lease node at `path` by a read whose reply arrived
    /// at `since` and showed the node to be the lease's. Replaces an earlier watch.
    pub(crate) fn watch(&self, path: String, watcher: OneshotWatcher, since: Instant) {
        // The client library unwraps the watch's channel; should it ever go away without
        // firing the watch, that must not unwind through a renewal.
        let fired = AssertUnwindSafe(watcher.changed())
            .catch_unwind()
            .map(Result::ok)
            .boxed();
        let mut watches = locked(&self.watched);
        if watches.by_path.len() >= watches.prune_at {
            watches
                .by_path
                .retain(|_, w| (&mut w.fired).now_or_never().is_none());
            watches.prune_at = (2 * watches.by_path.len()).max(64);
        }
        watches.by_path.insert(path, Watched { since, fired });
    }

    /// When the watch on the lease node at `path` was set, if it is set and has not fired.
    /// A watch that fired is forgotten.
    pub(crate) fn unchanged_since(&self, path: &str) -> Option<Instant> {
        let mut watches = locked(&self.watched);
        let entry = watches.by_path.get_mut(path)?;
        if (&mut entry.fired).now_or_never().is_none() {
            return Some(entry.since);
        }
        watches.by_path.remove(path);
        None
    }

    /// Forgets the watch on `path` (its lease is released).
    pub(crate) fn unwatch(&self, path: &str) {
        let removed = locked(&self.watched).by_path.remove(path);
        drop(removed);
    }

    /// Waits for a `sync` sent after `since` to be answered (the server this client talks
    /// to has then caught up with the leader, so reads that follow are not stale, and the
    /// session's activity up to a tick before is known to the leader) — one already in flight if it
    /// was sent within the last 1/[`JOIN_WITHIN`] of the session timeout, else a new one —
    /// bounded by `limit`, records it as a proof, and returns when it was sent. The `sync`
    /// is on its way when the first poll of this future returns: a read sent after that
    /// need not wait for the reply, as ZooKeeper serves a session's requests in order (a
    /// read behind a `sync` sees at least the state the `sync` brought). Renewals
    /// that overlap thus share one `sync`, and one that joins loses at most that much of
    /// its lease. (An older `sync` still in flight is stuck: a renewal joining it would be
    /// worth nothing once it is answered.)
    ///
    /// # Cancel safety
    /// Cancel-safe: a `sync` in flight stays available to the next caller.
    pub(crate) async fn sync_since(
        &self,
        client: &Client,
        since: Instant,
        limit: Duration,
    ) -> Result<Instant, ZkError> {
        let (sent, reply) = {
            let mut syncing = locked(&self.syncing);
            // The monitor marks the session lost before it empties the slot: checked under
            // the slot's lock, a `sync` left here is either seen by it or never started.
            if self.is_lost() {
                return Err(ZkError::ClientClosed);
            }
            match &*syncing {
                Some(f)
                    if f.sent >= since
                        && f.sent.elapsed() <= self.timeout / JOIN_WITHIN
                        && f.reply.peek().is_none() =>
                {
                    (f.sent, f.reply.clone())
                }
                _ => {
                    let client = client.clone();
                    // Taken before the request is made: the `sync` is sent no earlier.
                    let sent = Instant::now();
                    let reply = async move { client.sync("/").await }.boxed().shared();
                    // Polled once here, under the slot's lock, which sends the `sync`: a
                    // request sent after this call, or after joining it, is behind it in
                    // the session's order (see `Self::sync_since`).
                    let _ = reply.clone().now_or_never();
                    *syncing = Some(InFlight {
                        sent,
                        reply: reply.clone(),
                    });
                    (sent, reply)
                }
            }
        };
        let answered = bounded(limit, reply.clone()).await;
        if answered.is_err() {
            // Not answered in time (or failed): the next renewal sends its own.
            let mut syncing = locked(&self.syncing);
            if syncing.as_ref().is_some_and(|f| f.reply.ptr_eq(&reply)) {
                *syncing = None;
            }
        }
        answered?;
        self.record(sent);
        Ok(sent)
    }

    /// Whether an earlier proof sent at `sent` (a `sync` or a create that completed)
    /// still stands for a new `sync` for a lease of `ttl`: sent within the last
    /// 1/[`REUSE_WITHIN`] of the lease's length (the TTL, at most the session timeout).
    /// A lease counted from it is as safe as one proven by a new `sync` — the bound is
    /// computed from a proof either way — and at most that much shorter.
    pub(crate) fn stands_for_sync(&self, sent: Instant, ttl: Duration) -> bool {
        sent.elapsed() <= ttl.min(self.timeout) / REUSE_WITHIN
    }

    /// Records that a request sent at `sent` through this session was answered by way of
    /// the leader (a `sync`, or a create), so the server this client talks to was then in
    /// touch with it.
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

/// The current instant on tokio's clock (the same as `Instant::now()` unless a test
/// paused that clock).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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
    request_timeout: Duration,
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
        if let Ok(Ok(())) = tokio::time::timeout(request_timeout, client.sync("/")).await {
            let Some(proofs) = proofs.upgrade() else {
                return;
            };
            locked(&proofs).record(sent);
        }
    }
}

/// Where the monitor learns of the session's state changes: the client's watcher, or a
/// plain channel in tests. Like any watch channel it keeps only the latest state, so a
/// short reconnection between two polls can be missed.
pub(crate) trait States: Send + 'static {
    /// The next state, once it changes.
    ///
    /// # Cancel safety
    /// Cancel-safe: a change not yet returned is returned by the next call.
    fn changed(&mut self) -> impl std::future::Future<Output = SessionState> + Send;
}

impl States for StateWatcher {
    fn changed(&mut self) -> impl std::future::Future<Output = SessionState> + Send {
        StateWatcher::changed(self)
    }
}

/// What the monitor lets go of when it declares the session lost.
struct Handles {
    client: Weak<Mutex<Option<Client>>>,
    syncing: Weak<Mutex<Option<InFlight>>>,
}

/// Follows the library's session states; declares the session lost on expiry, close,
/// auth failure, or a disconnect longer than `timeout`, and then drops the client (which
/// closes the session). The disconnect counts from the later of the first "disconnected"
/// seen and the last answered request (`proofs`): the watcher keeps only the latest state,
/// so a short reconnection in which a lease was granted or renewed can go unseen, and the
/// session must not be closed before that lease's deadline.
async fn monitor(
    mut states: impl States,
    mut state: SessionState,
    timeout: Duration,
    health: watch::Sender<Health>,
    handles: Handles,
    proofs: Weak<Mutex<Proofs>>,
) {
    let mut since: Option<Instant> = None;
    loop {
        let disconnected = match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                since = None;
                health.send_replace(Health::Connected);
                None
            }
            SessionState::Disconnected => {
                let since = *since.get_or_insert_with(now);
                health.send_replace(Health::Disconnected { since });
                Some(since)
            }
            SessionState::Expired => return lose(&health, &handles, "the session expired".into()),
            SessionState::Closed => {
                return lose(&health, &handles, "the session was closed".into())
            }
            SessionState::AuthFailed => {
                return lose(&health, &handles, "authentication failed".into())
            }
        };
        let Some(since) = disconnected else {
            state = states.changed().await;
            continue;
        };
        let heard = || {
            let latest = proofs.upgrade().and_then(|p| locked(&p).latest());
            latest.map_or(since, |p| p.max(since))
        };
        state = loop {
            let give_up_at = heard() + timeout;
            tokio::select! {
                next = states.changed() => break next,
                _ = tokio::time::sleep_until(give_up_at.into()) => {
                    if heard() + timeout > now() {
                        continue; // answered meanwhile: connected after all
                    }
                    return lose(
                        &health,
                        &handles,
                        format!(
                            "disconnected for longer than the session timeout ({timeout:?}): \
                             the ensemble may have expired the session"
                        ),
                    );
                }
            }
        };
    }
}

fn lose(health: &watch::Sender<Health>, handles: &Handles, reason: String) {
    health.send_replace(Health::Lost(reason));
    // Without a client handle the library closes the session as soon as it can reach a
    // server (or gives up), so nodes we no longer vouch for do not linger. A `sync` left
    // in flight holds one too.
    if let Some(slot) = handles.syncing.upgrade() {
        let dropped = locked(&slot).take();
        drop(dropped);
    }
    if let Some(slot) = handles.client.upgrade() {
        let dropped = locked(&slot).take();
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

    impl States for watch::Receiver<SessionState> {
        async fn changed(&mut self) -> SessionState {
            match watch::Receiver::changed(self).await {
                Ok(()) => *self.borrow_and_update(),
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// The session's watcher keeps only the latest state: a monitor that was not polled
    /// during a short reconnection sees "disconnected" twice. A request answered in that
    /// reconnection (a lease's grant, a renewal) proves the session alive, so the session
    /// must not be declared lost — and closed, deleting the lease's node — a session
    /// timeout after the *first* disconnect.
    #[tokio::test(start_paused = true)]
    async fn a_reconnection_the_watcher_missed_still_counts() {
        let timeout = Duration::from_secs(4);
        let (states, watched) = watch::channel(SessionState::SyncConnected);
        let (sender, health) = watch::channel(Health::Connected);
        let slot = Arc::new(Mutex::new(None::<Client>));
        let proofs = Arc::new(Mutex::new(Proofs::new(Duration::from_millis(200))));
        let task = tokio::spawn(monitor(
            watched,
            SessionState::SyncConnected,
            timeout,
            sender,
            Handles {
                client: Arc::downgrade(&slot),
                syncing: Weak::new(),
            },
            Arc::downgrade(&proofs),
        ));
        let lost = || matches!(*health.borrow(), Health::Lost(_));
        tokio::task::yield_now().await;
        states.send_replace(SessionState::Disconnected);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Reconnected, a grant answered, disconnected again — all before the monitor runs.
        states.send_replace(SessionState::SyncConnected);
        let answered = now();
        locked(&proofs).record(answered);
        states.send_replace(SessionState::Disconnected);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert!(
            !lost(),
            "declared lost 4.5 s after the first disconnect, 3.5 s after the session was \
             last heard from: {:?}",
            *health.borrow()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            lost(),
            "still {:?} past a session timeout after the session was last heard from",
            *health.borrow()
        );
        task.abort();
    }
}
