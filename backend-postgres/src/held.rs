//! Held leases: the task that owns a lease's connection, runs its extends and its
//! release, and watches the socket in between.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::Executor;
use tenure_api::backend::{HeldEntry, LossNotice};
use tenure_api::{FencingToken, LeaseDropped, LockError, LockKey, OwnerId, ReleaseOutcome};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::client::{discard, rollback_and_recycle, Dedicated};
use crate::error::map_err;
use crate::sql::{keepalive_idle, timeout_ms};
use crate::{Inner, PgConfig, PgLock};
use tenure_api::backend::Socket;

/// A held lease: what identifies the grant, and the channel to the task that owns its
/// connection.
pub(crate) struct Entry {
    pub(crate) key: LockKey,
    pub(crate) token: FencingToken,
    /// The holding transaction's id (`xid8` as text).
    pub(crate) xid: String,
    /// The TTL of the last grant or extension (for the holder record).
    pub(crate) ttl: Mutex<Duration>,
    /// Requests to the lease's task; dropping the entry ends the task (and the lease).
    pub(crate) tasks: mpsc::Sender<Request>,
    /// Fired by the task when the connection is lost.
    pub(crate) lost: LossNotice,
}

/// What a lease's task is asked to do on its connection.
pub(crate) enum Request {
    /// Re-arm the idle timer with a TTL.
    Extend(Duration, oneshot::Sender<Result<(), LockError>>),
    /// `COMMIT` and give the connection back.
    Release(oneshot::Sender<Result<ReleaseOutcome, LockError>>),
    /// Stop watching and hand the connection, in its open lock transaction, and the
    /// held-lock slot to the caller (a [`LockedTransaction`](crate::LockedTransaction)).
    HandOver(oneshot::Sender<HandedOver>),
}

/// A held lease's connection, its lock transaction still open, and its held-lock slot.
pub(crate) type HandedOver = (Dedicated, Option<OwnedSemaphorePermit>);

impl HeldEntry for Entry {
    fn key(&self) -> &LockKey {
        &self.key
    }
    fn token(&self) -> FencingToken {
        self.token
    }
}

/// The task that owns a held lease's connection: runs its extends and its release, and
/// watches the socket in between, so a connection the server closed (terminated backend,
/// restart, idle timeout, keepalive failure) fires the lease's [`LossNotice`] at once,
/// and a lease dropped without release is rolled back and its slot freed at once.
pub(crate) struct HeldTask {
    pub(crate) inner: Weak<Inner>,
    pub(crate) owner: OwnerId,
    pub(crate) entry: Weak<Entry>,
    pub(crate) xid: String,
    pub(crate) lost: LossNotice,
    /// Given back before a release is answered, so the caller can use it at once.
    pub(crate) slot: Option<OwnedSemaphorePermit>,
    /// The latest deadline a copy of the lease may hold (a grant's or an extension's,
    /// even one whose caller went away): the transaction's idle timeout never ends it
    /// sooner.
    pub(crate) promised: Instant,
}

impl HeldTask {
    pub(crate) async fn run(
        mut self,
        mut conn: Dedicated,
        mut requests: mpsc::Receiver<Request>,
        dropped: LeaseDropped,
    ) {
        loop {
            tokio::select! {
                biased;
                request = requests.recv() => match request {
                    Some(Request::Extend(ttl, reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        // Never below a deadline promised before: an extension to a
                        // shorter TTL may come from a copy of the lease, or from a caller
                        // that went away while the original keeps the longer deadline.
                        let now = Instant::now();
                        let keep = ttl.max(self.promised.saturating_duration_since(now));
                        let result = refresh(&mut conn, keep, &self.xid, &inner.config).await;
                        if result.is_ok() {
                            self.promised = self.promised.max(now + ttl);
                        }
                        if let Err(e) = &result {
                            self.lose(e.to_string());
                            let _ = reply.send(result);
                            break;
                        }
                        let _ = reply.send(result);
                    }
                    Some(Request::Release(reply)) => {
                        let Some(inner) = self.inner.upgrade() else { break };
                        let config = &inner.config;
                        let committed = tokio::time::timeout(
                            config.request_timeout,
                            conn.listener().execute("COMMIT"),
                        )
                        .await;
                        drop(self.slot.take());
                        let outcome = match committed {
                            Ok(Ok(_)) => {
                                PgLock::recycle(&inner, conn);
                                let _ = reply.send(Ok(ReleaseOutcome::Released));
                                return;
                            }
                            // The server ended the session (idle timeout, terminated,
                            // restarted): the transaction was rolled back and the lock
                            // freed before we asked.
                            Ok(Err(_)) => Ok(ReleaseOutcome::NotHeld),
                            Err(_) => Err(LockError::Unavailable {
                                message: format!(
                                    "release on {}: no reply within {:?}; the connection was \
                                     closed, so the server frees the lock when it notices",
                                    config.endpoint(),
                                    config.request_timeout
                                ),
                                source: None,
                            }),
                        };
                        let _ = reply.send(outcome);
                        break;
                    }
                    Some(Request::HandOver(reply)) => {
                        let slot = self.slot.take();
                        self.forget();
                        // A caller that gave up closes the connection: the server rolls
                        // the transaction back and frees the lock.
                        if let Err((conn, _)) = reply.send((conn, slot)) {
                            discard(conn);
                        }
                        return;
                    }
                    // The entry is gone: the client was closed or dropped.
                    None => {
                        self.lost.fire(
                            LockError::lost("the lock client was closed, ending its transactions")
                                .to_string(),
                        );
                        break;
                    }
                },
                _ = dropped.wait() => {
                    // Every copy of the lease was dropped without a release: free the lock
                    // and the slot now rather than at the TTL.
                    self.forget();
                    if let Some(inner) = self.inner.upgrade() {
                        rollback_and_recycle(&inner, conn).await;
                        return;
                    }
                    break;
                }
                closed = Watch::new(conn.socket, conn.listener().try_recv()) => {
                    let why = match closed {
                        Watched::Closed(Err(e)) => e.to_string(),
                        Watched::Closed(Ok(None)) => "the server closed it".to_string(),
                        Watched::Closed(Ok(Some(_))) => "an unexpected notification".to_string(),
                        Watched::Unsolicited => "the server sent an unsolicited message \
                            (the FATAL that precedes closing the session)"
                            .to_string(),
                    };
                    self.lose(LockError::lost(format!(
                        "the holding connection ended (the server rolled the transaction \
                         back and freed the lock): {why}"
                    )).to_string());
                    break;
                }
            }
        }
        // Whatever ended the task (a released lease needs no notice, and gets none it
        // could act on), the connection closes now: the lease is gone.
        self.lost
            .fire(LockError::lost("the lease's connection was closed").to_string());
        discard(conn);
    }

    /// Reports the loss to the lease's holder and forgets the lease.
    fn lose(&mut self, reason: String) {
        self.lost.fire(reason);
        self.forget();
    }

    /// Gives the slot back, then takes the lease out of the map (in that order, so a
    /// caller that sees the lease gone can use its slot).
    fn forget(&mut self) {
        drop(self.slot.take());
        if let (Some(inner), Some(entry)) = (self.inner.upgrade(), self.entry.upgrade()) {
            inner.held.forget(self.owner, &entry);
        }
    }
}

/// What the socket watch of an idle held connection saw.
pub(crate) enum Watched<T> {
    /// `try_recv` returned: the connection is closed (or a notification came).
    Closed(T),
    /// The server sent a message nobody asked for. To a session idle in its transaction
    /// it sends nothing unless it is ending it: the `FATAL` it sends *before* releasing the
    /// session's locks (`pg_terminate_backend`, shutdown, idle timeout). `try_recv` skips
    /// error messages and only returns at end of stream, after the locks are free; this
    /// catches the earlier message.
    Unsolicited,
}

/// Watches an idle held connection: `try_recv`, and whether the server sent anything.
///
/// With the connection's [`Socket`], unread bytes are seen by peeking before `try_recv`
/// reads them, and wake-ups are not trusted. Without it (the server sees the client
/// through a proxy or NAT, a Unix-domain socket), a wake-up by the socket after which
/// `try_recv` still waits is taken for a message. That guess can be wrong: on a
/// multi-threaded runtime a readiness event may be delivered after the reply it reported
/// was read (a stale wake-up), which then ends a healthy lease early — the safe
/// direction, but a loss all the same.
///
/// What the peek cannot see: a `FATAL` that sqlx read together with the previous reply,
/// or one that lands in the microseconds between a peek and `try_recv`'s read. `try_recv`
/// swallows those, and the loss is reported at the end of the stream, once the server
/// has released the lock.
struct Watch<F> {
    inner: std::pin::Pin<Box<F>>,
    socket: Option<Socket>,
    woken: Arc<AtomicBool>,
}

/// Records that the socket woke the watch, then wakes the task.
struct WatchWaker {
    woken: Arc<AtomicBool>,
    task: std::task::Waker,
}

impl std::task::Wake for WatchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake_by_ref();
    }
}

impl<F> Watch<F> {
    fn new(socket: Option<Socket>, inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            socket,
            woken: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl<F: Future> Future for Watch<F> {
    type Output = Watched<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.socket.is_some_and(Socket::has_unread) {
            return std::task::Poll::Ready(Watched::Unsolicited);
        }
        let woken = self.woken.swap(false, Ordering::SeqCst);
        let waker = std::task::Waker::from(Arc::new(WatchWaker {
            woken: self.woken.clone(),
            task: cx.waker().clone(),
        }));
        let mut own = std::task::Context::from_waker(&waker);
        match self.inner.as_mut().poll(&mut own) {
            std::task::Poll::Ready(out) => std::task::Poll::Ready(Watched::Closed(out)),
            std::task::Poll::Pending if woken && self.socket.is_none() => {
                std::task::Poll::Ready(Watched::Unsolicited)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

/// Re-arms the held transaction's idle timer with `ttl` and checks it is still the
/// transaction `xid`. Any failure means the lease is gone.
pub(crate) async fn refresh(
    conn: &mut Dedicated,
    ttl: Duration,
    xid: &str,
    config: &PgConfig,
) -> Result<(), LockError> {
    let result = tokio::time::timeout(
        config.request_timeout,
        sqlx::query_as::<_, (String, String, Option<String>)>(
            "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
             set_config('tcp_keepalives_idle', $2, false), \
             pg_current_xact_id_if_assigned()::text",
        )
        .bind(timeout_ms(ttl).to_string())
        .bind(keepalive_idle(ttl).to_string())
        // To the end of the reply (see `lock_row`).
        .fetch_all(conn.listener()),
    )
    .await
    .map(|rows| rows.and_then(|rows| rows.into_iter().next().ok_or(sqlx::Error::RowNotFound)));
    match result {
        Ok(Ok((_, _, Some(current)))) if current == xid => Ok(()),
        Ok(Ok((_, _, current))) => Err(LockError::lost(format!(
            "the holding transaction {xid} has ended (now {current:?})"
        ))),
        Ok(Err(e)) => Err(LockError::lost(format!(
            "the holding connection to {} is gone: {}",
            config.endpoint(),
            map_err(config, "extend", e)
        ))),
        Err(_) => Err(LockError::lost(format!(
            "the holding connection to {} did not answer within {:?}",
            config.endpoint(),
            config.request_timeout
        ))),
    }
}
