//! A TCP fault proxy: listens on a loopback port, forwards to one target, and can be
//! switched at run time to black-hole, reset or delay traffic — on existing connections as
//! well as new ones — or strand the connections open so far (silent for good), or stall
//! them (their requests delivered late), while new ones pass.
//!
//! ```no_run
//! # async fn demo(target: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! use tenure_conformance::proxy::{FaultProxy, ProxyMode};
//!
//! let proxy = FaultProxy::start(target).await?;
//! // Point the client under test at proxy.addr(), then:
//! proxy.set_mode(ProxyMode::Blackhole);
//! proxy.set_mode(ProxyMode::Delay { up: Duration::from_millis(200), down: Duration::ZERO });
//! proxy.set_mode(ProxyMode::Pass);
//! assert!(proxy.stats().accepted > 0);
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the proxy does with traffic. Switching modes affects existing connections and new
/// ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forward everything.
    #[default]
    Pass,
    /// Accept connections and keep both sockets open, but forward nothing in either
    /// direction: bytes read while black-holed (or still queued when the mode switched) are
    /// dropped, never delivered. Clients see timeouts, not errors.
    Blackhole,
    /// Close existing connections with a TCP RST (zero linger) and reset new ones as soon as
    /// they are accepted, until the mode changes.
    Reset,
    /// Forward, but hold each chunk for a fixed time per direction. `up` is client→server,
    /// `down` is server→client. The delay applies to bytes read after the switch.
    Delay {
        /// Client→server delay.
        up: Duration,
        /// Server→client delay.
        down: Duration,
    },
}

/// Counters that show a fault fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Client connections accepted.
    pub accepted: u64,
    /// Connections currently open through the proxy.
    pub active: u64,
    /// Connections closed with RST because of [`ProxyMode::Reset`] (existing and new).
    pub resets: u64,
    /// Connections dropped because the target could not be reached.
    pub connect_failures: u64,
    /// Bytes delivered client→server.
    pub bytes_up: u64,
    /// Bytes delivered server→client.
    pub bytes_down: u64,
    /// Bytes read in either direction and dropped: [`ProxyMode::Blackhole`] (or
    /// [`ProxyMode::Reset`] before it took effect), or a stranded connection
    /// ([`FaultProxy::strand`]).
    pub bytes_blackholed: u64,
    /// Bytes read client→server on a stalled connection, to be delivered late (see
    /// [`FaultProxy::stall`]; counted as they are read).
    pub bytes_stalled: u64,
    /// Of [`bytes_stalled`](Self::bytes_stalled), those delivered so far: the late
    /// requests have landed once the two are equal.
    pub bytes_stalled_delivered: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    active: AtomicU64,
    resets: AtomicU64,
    connect_failures: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    bytes_blackholed: AtomicU64,
    bytes_stalled: AtomicU64,
    bytes_stalled_delivered: AtomicU64,
}

impl Shared {
    /// How many stalls there were.
    fn stalls(&self) -> u64 {
        self.stall
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }

    fn target(&self) -> SocketAddr {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Shared {
    target: std::sync::Mutex<SocketAddr>,
    mode: watch::Sender<ProxyMode>,
    /// Connections accepted before the last [`FaultProxy::strand`] are stranded: how
    /// many strands there were.
    strands: AtomicU64,
    /// The last [`FaultProxy::stall`]: how many stalls there were, and its delay.
    stall: std::sync::Mutex<(u64, Duration)>,
    counters: Counters,
}

/// A TCP proxy in front of one target, with switchable faults. Its tasks stop when it is
/// dropped (open connections are then closed).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl FaultProxy {
    /// Listen on `127.0.0.1:0` and forward to `target`, starting in [`ProxyMode::Pass`].
    /// Must be called within a tokio runtime; the target need not be up yet.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is spawned until the listener is bound.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: std::sync::Mutex::new(target),
            mode: watch::Sender::new(ProxyMode::Pass),
            strands: AtomicU64::new(0),
            stall: std::sync::Mutex::new((0, Duration::ZERO)),
            counters: Counters::default(),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), cancel.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            cancel,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target()
    }

    /// Forward new connections to `target` (a server that moved to another port);
    /// connections already open stay with the old one.
    pub fn set_target(&self, target: SocketAddr) {
        *self
            .shared
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = target;
    }

    /// Switch mode; takes effect on existing and new connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.shared.mode.send_replace(mode);
    }

    /// Strands the connections accepted so far: from now on nothing they carry is
    /// delivered, in either direction, and neither end is told (as when a NAT or a load
    /// balancer lost their state: TCP gives up only after many minutes), until
    /// [`ProxyMode::Reset`] resets them. Connections accepted later pass as the mode
    /// says. Their dropped bytes count as [`ProxyStats::bytes_blackholed`].
    pub fn strand(&self) {
        self.shared.strands.fetch_add(1, Ordering::Relaxed);
    }

    /// Stalls the connections accepted so far: what their clients send from now on
    /// reaches the server `up` late (on top of the mode's delay), in order, while
    /// connections accepted later pass as the mode says — one path to the server held up
    /// (a congested route, a peer stuck on one socket) while a new connection gets
    /// through at once. A later stall replaces this one (`Duration::ZERO` lifts it).
    /// Counted as [`ProxyStats::bytes_stalled`].
    pub fn stall(&self, up: Duration) {
        let mut stall = self
            .shared
            .stall
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *stall = (stall.0 + 1, up);
    }

    /// Waits up to `limit` until every byte stalled so far has been delivered (the late
    /// requests have reached the server); `false` if some are still held up then.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads counters.
    pub async fn stalled_delivered(&self, limit: Duration) -> bool {
        let give_up = Instant::now() + limit;
        loop {
            let stats = self.stats();
            if stats.bytes_stalled_delivered >= stats.bytes_stalled {
                return true;
            }
            if Instant::now() >= give_up {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.shared.mode.borrow()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            accepted: get(&c.accepted),
            active: get(&c.active),
            resets: get(&c.resets),
            connect_failures: get(&c.connect_failures),
            bytes_up: get(&c.bytes_up),
            bytes_down: get(&c.bytes_down),
            bytes_blackholed: get(&c.bytes_blackholed),
            bytes_stalled: get(&c.bytes_stalled),
            bytes_stalled_delivered: get(&c.bytes_stalled_delivered),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => r,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(e) => {
                tracing::debug!(error = %e, "fault proxy accept failed");
                // Avoid a hot loop on e.g. EMFILE.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if *shared.mode.borrow() == ProxyMode::Reset {
            reset(&client);
            shared.counters.resets.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let born = Born {
            strands: shared.strands.load(Ordering::Relaxed),
            stalls: shared.stalls(),
        };
        tokio::spawn(connection(
            client,
            shared.clone(),
            born,
            cancel.child_token(),
        ));
    }
}

/// Arrange for the socket to be closed with RST when dropped.
fn reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

struct ActiveGuard<'a>(&'a Counters);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    mut client: TcpStream,
    shared: Arc<Shared>,
    born: Born,
    cancel: CancellationToken,
) {
    let c = &shared.counters;
    c.active.fetch_add(1, Ordering::Relaxed);
    let _active = ActiveGuard(c);
    let target = shared.target();
    let connect = tokio::select! {
        _ = cancel.cancelled() => return,
        r = TcpStream::connect(target) => r,
    };
    let mut server = match connect {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(target = %target, error = %e, "fault proxy cannot reach target");
            c.connect_failures.fetch_add(1, Ordering::Relaxed);
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut mode_rx = shared.mode.subscribe();
    let was_reset = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let faults = Faults {
            shared: &shared,
            born,
        };
        let up = pump(cr, sw, shared.mode.subscribe(), Direction::Up, &faults);
        let down = pump(sr, cw, shared.mode.subscribe(), Direction::Down, &faults);
        // Each direction runs to its end: bytes already on their way (delayed, stalled)
        // still arrive after the other direction failed (a client that closed and
        // resets the server's late replies), as on a network.
        let both = futures::future::join(up, down);
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = both => false,
            _ = mode_rx.wait_for(|m| *m == ProxyMode::Reset) => true,
        }
    };
    if was_reset {
        reset(&client);
        reset(&server);
        c.resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// The strands and stalls before a connection was accepted (the later ones are its).
#[derive(Clone, Copy)]
struct Born {
    strands: u64,
    stalls: u64,
}

/// The faults on one connection beyond the mode: stranded or stalled.
struct Faults<'a> {
    shared: &'a Shared,
    born: Born,
}

impl Faults<'_> {
    fn stranded(&self) -> bool {
        self.shared.strands.load(Ordering::Relaxed) > self.born.strands
    }

    /// Whether its bytes are dropped now: black-holed (or reset) by the mode, or
    /// stranded (see [`FaultProxy::strand`]).
    fn dropping(&self, mode: ProxyMode) -> bool {
        matches!(mode, ProxyMode::Blackhole | ProxyMode::Reset) || self.stranded()
    }

    /// The delay of a stall of this connection (see [`FaultProxy::stall`]).
    fn stall(&self) -> Duration {
        let (stalls, up) = *self
            .shared
            .stall
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stalls > self.born.stalls {
            up
        } else {
            Duration::ZERO
        }
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Up,
    Down,
}

/// Copy one direction, honouring the mode. Returns when the source reaches EOF or fails
/// (after delivering what is queued and half-closing the destination), or when writing
/// fails.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    mut mode: watch::Receiver<ProxyMode>,
    dir: Direction,
    faults: &Faults<'_>,
) -> io::Result<()> {
    let c = &faults.shared.counters;
    /// Stop reading while this much is queued for delayed delivery.
    const MAX_QUEUED: usize = 4 << 20;
    let delivered = match dir {
        Direction::Up => &c.bytes_up,
        Direction::Down => &c.bytes_down,
    };
    // Each chunk: when it is due, whether it was stalled, its bytes.
    let mut queue: VecDeque<(Instant, bool, Vec<u8>)> = VecDeque::new();
    let mut queued = 0usize;
    let mut eof = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if eof && queue.is_empty() {
            // A partition does not deliver FINs either: hold the half-close while
            // black-holed (for good once stranded).
            let _ = mode.wait_for(|m| *m != ProxyMode::Blackhole).await;
            if faults.stranded() {
                std::future::pending::<()>().await;
            }
            let _ = to.shutdown().await;
            return Ok(());
        }
        let next_due = queue.front().map(|(due, _, _)| *due);
        tokio::select! {
            r = from.read(&mut buf), if !eof && queued < MAX_QUEUED => {
                // A reset source sent what it sent before: that still arrives.
                let n = r.unwrap_or(0);
                if n == 0 {
                    eof = true;
                    continue;
                }
                let now = *mode.borrow();
                if faults.dropping(now) {
                    c.bytes_blackholed.fetch_add(n as u64, Ordering::Relaxed);
                    continue;
                }
                let stall = match dir {
                    Direction::Up => faults.stall(),
                    Direction::Down => Duration::ZERO,
                };
                if !stall.is_zero() {
                    c.bytes_stalled.fetch_add(n as u64, Ordering::Relaxed);
                }
                let delay = stall + match (now, dir) {
                    (ProxyMode::Delay { up, .. }, Direction::Up) => up,
                    (ProxyMode::Delay { down, .. }, Direction::Down) => down,
                    (ProxyMode::Pass | ProxyMode::Blackhole | ProxyMode::Reset, _) => {
                        Duration::ZERO
                    }
                };
                if delay.is_zero() && queue.is_empty() {
                    // Nothing to wait for: forward at once, not on the timer's next tick
                    // (up to a millisecond per hop).
                    to.write_all(&buf[..n]).await?;
                    delivered.fetch_add(n as u64, Ordering::Relaxed);
                    continue;
                }
                queue.push_back((Instant::now() + delay, !stall.is_zero(), buf[..n].to_vec()));
                queued += n;
            }
            _ = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {
                let Some((_, stalled, chunk)) = queue.pop_front() else { continue };
                queued -= chunk.len();
                if faults.dropping(*mode.borrow()) {
                    c.bytes_blackholed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    continue;
                }
                to.write_all(&chunk).await?;
                delivered.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if stalled {
                    c.bytes_stalled_delivered.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }
}
