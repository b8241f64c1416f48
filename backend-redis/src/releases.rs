//! One subscriber connection per client for every waiter's release channel.
//!
//! A waiter used to open a connection of its own for each wait (a TCP connect, and over
//! `rediss://` a TLS handshake and `AUTH`, before its `SUBSCRIBE`). Now the client keeps
//! one subscriber connection, opened at the first wait: a task owns it, subscribes a
//! channel when its first waiter arrives and unsubscribes it when its last one leaves,
//! and counts each channel's messages for the waiters. Requests are handled in order by
//! that task, so a waiter's subscription is confirmed before it is told so, and an
//! unsubscription can never overtake a later subscription to the same channel. While
//! channels are subscribed, the task pings the server every [`KEEPALIVE`]: an idle
//! connection dropped silently on the way (a NAT, a load balancer) is noticed, and its
//! waiters subscribe again on a new one.
//!
//! On a Redis Cluster the connection is a cluster connection speaking RESP3, and each
//! channel a shard channel (`SSUBSCRIBE`, Redis 7), subscribed on the primary of its
//! slot — the lock key's, as the channel carries the key's hash tag — where the release
//! script's `SPUBLISH` reaches it. When a node's connection drops (its primary died, a
//! failover) or a node unsubscribes a channel itself (its slot moved), the task ends like
//! a closed single-node connection: every waiter tries again and subscribes on a new
//! connection, which finds the slot's new primary.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{PushInfo, PushKind};
use tokio::sync::{mpsc, oneshot, watch};

/// How often the task pings a connection with subscriptions.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// What a waiter asks the subscriber task.
enum Request {
    /// Subscribe `channel` (unless it already is) and count one more waiter on it.
    ///
    /// The answer is the waiter's [`ReleaseWatch`], made by the task with `requests`:
    /// a waiter that gave up before reading it drops it unread, which leaves the channel.
    Watch {
        channel: String,
        requests: mpsc::UnboundedSender<Request>,
        reply: oneshot::Sender<Result<ReleaseWatch, Refused>>,
    },
    /// One waiter of `channel` left: unsubscribe it when it was the last.
    Leave { channel: String },
}

/// The client's subscriber connection, as seen by waiters. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Subscriber {
    requests: mpsc::UnboundedSender<Request>,
}

/// One waiter's subscription to one channel. Dropping it leaves the channel.
#[derive(Debug)]
pub struct ReleaseWatch {
    messages: watch::Receiver<u64>,
    channel: String,
    requests: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Watch { channel, .. } => write!(f, "Watch({channel})"),
            Request::Leave { channel } => write!(f, "Leave({channel})"),
        }
    }
}

impl ReleaseWatch {
    /// Waits for the next message on the channel after the last one seen (at once if one
    /// came since). `false` when the subscriber connection is gone: subscribe again.
    ///
    /// # Cancel safety
    /// Cancel safe: a message that arrives meanwhile is seen by the next call.
    pub async fn released(&mut self) -> bool {
        self.messages.changed().await.is_ok()
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        let channel = std::mem::take(&mut self.channel);
        let _ = self.requests.send(Request::Leave { channel });
    }
}

impl Subscriber {
    /// Starts the task that owns `link`. The task ends, and every [`ReleaseWatch`]
    /// learns it, when the connection closes or the last `Subscriber` and watch are gone.
    ///
    /// Each subscription, unsubscription and ping must be answered within `timeout`, or
    /// the connection counts as dead (an idle subscriber connection can be dropped
    /// silently on the way, by a NAT or a load balancer) and the task ends: the next
    /// waiter opens another.
    pub(crate) fn start(link: Link, timeout: Duration) -> Self {
        let (requests, received) = mpsc::unbounded_channel();
        tokio::spawn(run(link, received, timeout));
        Self { requests }
    }

    /// Whether the task still runs (its connection is open).
    pub(crate) fn is_open(&self) -> bool {
        !self.requests.is_closed()
    }

    /// Subscribes to `channel` for one more waiter, within `limit`.
    ///
    /// # Cancel safety
    /// Cancel safe: a subscription confirmed after the caller left is left again (its
    /// [`ReleaseWatch`] is dropped unread).
    pub(crate) async fn watch(
        &self,
        channel: String,
        limit: Duration,
    ) -> Result<ReleaseWatch, Refused> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Watch {
                channel,
                requests: self.requests.clone(),
                reply,
            })
            .map_err(|_| Refused::Closed)?;
        match tokio::time::timeout(limit, answer).await {
            Err(_) => Err(Refused::TimedOut(limit)),
            Ok(Err(_)) => Err(Refused::Closed),
            Ok(Ok(answer)) => answer,
        }
    }
}

/// Why [`Subscriber::watch`] failed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The connection (and its task) is gone.
    Closed,
    /// No confirmation within this limit.
    TimedOut(Duration),
    /// The connection failed, or the server answered with an error.
    Redis(redis::RedisError),
    /// The subscription did not take (`PING` answered this instead of an array).
    NotSubscribed(String),
}

/// A subscribed channel: its message count, and how many waiters watch it.
struct Channel {
    messages: watch::Sender<u64>,
    waiters: usize,
}

/// A subscriber task's connection.
pub(crate) enum Link {
    /// A pub/sub connection to one node, split into its two halves.
    ///
    /// With `ping_check` (RESP2), the first subscription is confirmed by a `PING`: the
    /// client library hands back any reply to `SUBSCRIBE` as success, even an ACL's
    /// `NOPERM`, but a subscribed RESP2 connection answers `PING` with an array. A
    /// refusal found so refuses every later request on this connection at once (an ACL
    /// that refuses one channel of a prefix refuses them all).
    Node {
        sink: PubSubSink,
        stream: PubSubStream,
        ping_check: bool,
    },
    /// A RESP3 connection to a Redis Cluster, whose pushes (messages, confirmations,
    /// disconnections) arrive on `pushes`. `leaving` counts, per channel, the
    /// `SUNSUBSCRIBE`s sent whose confirmation has not been seen yet: any other
    /// `sunsubscribe` push is the server's own (the slot moved).
    Cluster {
        conn: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        leaving: HashMap<String, usize>,
    },
}

/// What a [`Link`] receives.
enum Event {
    /// A message on this channel.
    Message(String),
    /// The subscriptions may be gone: the connection closed, a node's connection
    /// dropped, or a node unsubscribed a channel itself.
    Gone,
}

impl Link {
    /// A [`Link::Cluster`] over `conn`, built with a push sender feeding `pushes`.
    pub(crate) fn cluster(
        conn: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
    ) -> Self {
        Link::Cluster {
            conn,
            pushes,
            leaving: HashMap::new(),
        }
    }

    /// The next event. `subscribed`: whether any channel is (a cluster connection's
    /// node that drops while nothing is subscribed loses nothing).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is received unless returned.
    async fn next(&mut self, subscribed: bool) -> Event {
        match self {
            Link::Node { stream, .. } => match stream.next().await {
                Some(message) => Event::Message(message.get_channel_name().to_owned()),
                None => Event::Gone,
            },
            Link::Cluster {
                pushes, leaving, ..
            } => loop {
                let Some(push) = pushes.recv().await else {
                    return Event::Gone;
                };
                let channel = match push.data.first() {
                    Some(redis::Value::BulkString(name)) => String::from_utf8_lossy(name),
                    _ => "".into(),
                };
                match push.kind {
                    PushKind::SMessage => return Event::Message(channel.into_owned()),
                    PushKind::SUnsubscribe => match leaving.get_mut(channel.as_ref()) {
                        Some(sent) => {
                            *sent -= 1;
                            if *sent == 0 {
                                leaving.remove(channel.as_ref());
                            }
                        }
                        None => return Event::Gone,
                    },
                    PushKind::Disconnection if subscribed => return Event::Gone,
                    _ => {}
                }
            },
        }
    }

    /// Subscribes `channel` (and with a node's `ping_check`, checks that it took), each
    /// step within `timeout`.
    async fn subscribe(&mut self, channel: &str, timeout: Duration) -> Result<(), Refused> {
        let timed_out = |_| Refused::TimedOut(timeout);
        match self {
            Link::Node {
                sink, ping_check, ..
            } => {
                subscribe(sink, channel, *ping_check, timeout).await?;
                *ping_check = false;
                Ok(())
            }
            Link::Cluster { conn, .. } => tokio::time::timeout(timeout, conn.ssubscribe(channel))
                .await
                .map_err(timed_out)?
                .map_err(Refused::Redis),
        }
    }

    /// Unsubscribes `channel` within `timeout` (`Err(None)`: no answer in time).
    async fn unsubscribe(
        &mut self,
        channel: &str,
        timeout: Duration,
    ) -> Result<(), Option<redis::RedisError>> {
        let done = match self {
            Link::Node { sink, .. } => {
                tokio::time::timeout(timeout, sink.unsubscribe(channel)).await
            }
            Link::Cluster { conn, leaving, .. } => {
                let done = tokio::time::timeout(timeout, conn.sunsubscribe(channel)).await;
                if matches!(done, Ok(Ok(()))) {
                    // The server's confirmation is a push, still to be read: this one's.
                    *leaving.entry(channel.to_owned()).or_default() += 1;
                }
                done
            }
        };
        done.map_err(|_| None)?.map_err(Some)
    }

    /// After the server refused to subscribe `channel`: a cluster connection, which
    /// records every channel it is asked to subscribe and subscribes them all again after
    /// a reconnection, is told to drop it (or it would keep one entry per channel ever
    /// refused, e.g. before Redis 7, where `SSUBSCRIBE` does not exist). `false` if the
    /// connection failed.
    async fn forget(&mut self, channel: &str, timeout: Duration) -> bool {
        if let Link::Node { .. } = self {
            return true;
        }
        match self.unsubscribe(channel, timeout).await {
            Ok(()) => true,
            Err(Some(e)) => !broken(&e),
            Err(None) => false,
        }
    }

    /// Pings the node (every primary of a cluster) within `timeout`; `false` if one did
    /// not answer.
    async fn ping(&mut self, timeout: Duration) -> bool {
        let pong = match self {
            Link::Node { sink, .. } => {
                tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await
            }
            Link::Cluster { conn, .. } => {
                let every_primary = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                let ping = redis::cmd("PING");
                tokio::time::timeout(timeout, conn.route_command(&ping, every_primary)).await
            }
        };
        matches!(pong, Ok(Ok(_)))
    }
}

/// The subscriber task: requests in order, messages counted per channel, a ping every
/// [`KEEPALIVE`] while channels are subscribed.
async fn run(mut link: Link, mut requests: mpsc::UnboundedReceiver<Request>, timeout: Duration) {
    let mut channels: HashMap<String, Channel> = HashMap::new();
    // A refusal found by the ping check: every later request gets it too.
    let mut refused: Option<String> = None;
    let mut keepalive =
        tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let request = tokio::select! {
            event = link.next(!channels.is_empty()) => match event {
                Event::Message(name) => {
                    if let Some(channel) = channels.get(&name) {
                        channel.messages.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    continue;
                }
                Event::Gone => return, // every watch sees its sender go
            },
            _ = keepalive.tick() => {
                if channels.is_empty() || link.ping(timeout).await {
                    continue;
                }
                return; // no answer: the waiters subscribe again on a new connection
            }
            request = requests.recv() => match request {
                Some(request) => request,
                None => return,
            },
        };
        let leave = match request {
            Request::Leave { channel } => channel,
            Request::Watch {
                channel,
                requests,
                reply,
            } => {
                let messages = match channels.get_mut(&channel) {
                    Some(known) => {
                        known.waiters += 1;
                        Ok(known.messages.subscribe())
                    }
                    None => match &refused {
                        Some(why) => Err(Refused::NotSubscribed(why.clone())),
                        None => match link.subscribe(&channel, timeout).await {
                            Ok(()) => {
                                let (messages, seen) = watch::channel(0);
                                let known = Channel {
                                    messages,
                                    waiters: 1,
                                };
                                channels.insert(channel.clone(), known);
                                Ok(seen)
                            }
                            Err(Refused::NotSubscribed(why)) => {
                                refused = Some(why.clone());
                                Err(Refused::NotSubscribed(why))
                            }
                            Err(Refused::Redis(e)) if !broken(&e) => {
                                if !link.forget(&channel, timeout).await {
                                    let _ = reply.send(Err(Refused::Redis(e)));
                                    return;
                                }
                                Err(Refused::Redis(e))
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e));
                                return; // the connection failed: a waiter opens another
                            }
                        },
                    },
                };
                // A waiter that has given up drops its watch unread: that leaves the
                // channel again (a request this task reads later).
                let _ = reply.send(messages.map(|messages| ReleaseWatch {
                    messages,
                    channel,
                    requests,
                }));
                continue;
            }
        };
        let Some(known) = channels.get_mut(&leave) else {
            continue;
        };
        known.waiters -= 1;
        if known.waiters == 0 {
            channels.remove(&leave);
            if link.unsubscribe(&leave, timeout).await.is_err() {
                return;
            }
        }
    }
}

/// Whether `e` means the connection is no longer usable.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

/// `SUBSCRIBE channel`, and with `ping_check` a `PING` confirming it took (see
/// [`Link::Node`]).
async fn subscribe(
    sink: &mut PubSubSink,
    channel: &str,
    ping_check: bool,
    timeout: Duration,
) -> Result<(), Refused> {
    let timed_out = |_| Refused::TimedOut(timeout);
    tokio::time::timeout(timeout, sink.subscribe(channel))
        .await
        .map_err(timed_out)?
        .map_err(Refused::Redis)?;
    if !ping_check {
        return Ok(());
    }
    let pong = tokio::time::timeout(timeout, sink.ping::<redis::Value>())
        .await
        .map_err(timed_out)?;
    match pong.map_err(Refused::Redis)? {
        redis::Value::Array(ref items)
            if items.first() == Some(&redis::Value::BulkString(b"pong".to_vec())) =>
        {
            Ok(())
        }
        redis::Value::ServerError(e) => Err(Refused::Redis(e.into())),
        other => Err(Refused::NotSubscribed(format!("PING answered {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers `+OK` to each command of a connection's set-up; from the
    /// first `SUBSCRIBE` on, it answers that one (if `confirm`) and then nothing more.
    async fn falling_silent(confirm: bool) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut answering = true;
            loop {
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                let chunk = &buf[..n];
                if !answering {
                    continue;
                }
                if chunk.windows(9).any(|w| w == b"SUBSCRIBE") {
                    answering = false;
                    if confirm {
                        let reply = b"*3\r\n$9\r\nsubscribe\r\n$7\r\nchannel\r\n:1\r\n";
                        let _ = socket.write_all(reply).await;
                    }
                    continue;
                }
                // One reply per command: each RESP command starts a line with `*`.
                let commands = chunk
                    .iter()
                    .enumerate()
                    .filter(|&(i, &b)| b == b'*' && (i == 0 || chunk[i - 1] == b'\n'))
                    .count();
                let _ = socket.write_all(&b"+OK\r\n".repeat(commands)).await;
            }
        });
        addr
    }

    async fn subscriber(addr: std::net::SocketAddr, timeout: Duration) -> Subscriber {
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let pubsub = tokio::time::timeout(Duration::from_secs(5), client.get_async_pubsub())
            .await
            .expect("set up")
            .unwrap();
        let (sink, stream) = pubsub.split();
        let link = Link::Node {
            sink,
            stream,
            ping_check: false,
        };
        Subscriber::start(link, timeout)
    }

    async fn ends(subscriber: &Subscriber, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while subscriber.is_open() {
            assert!(tokio::time::Instant::now() < deadline, "the task ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A subscriber connection whose server stops answering (an idle connection dropped
    /// silently on the way) is given up, so the next waiter opens another instead of
    /// queueing behind it for good.
    #[tokio::test]
    async fn a_connection_that_stops_answering_is_given_up() {
        let timeout = Duration::from_millis(100);
        let subscriber = subscriber(falling_silent(false).await, timeout).await;
        let refused = subscriber
            .watch("channel".into(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, Refused::TimedOut(t) if t == timeout),
            "{refused:?}"
        );
        ends(&subscriber, Duration::from_secs(5)).await;
    }

    /// A connection that goes silent after its subscriptions took is found by the
    /// keep-alive ping, and its waiters are told (they subscribe again elsewhere).
    #[tokio::test]
    async fn a_silent_connection_with_subscriptions_is_found_by_the_keepalive() {
        let timeout = Duration::from_millis(100);
        let subscriber = subscriber(falling_silent(true).await, timeout).await;
        let mut watch = subscriber
            .watch("channel".into(), Duration::from_secs(5))
            .await
            .expect("the subscription took");
        let told = tokio::time::timeout(KEEPALIVE * 2, watch.released())
            .await
            .expect("told within two keep-alive periods");
        assert!(!told, "told the connection is gone, not of a release");
        ends(&subscriber, Duration::from_secs(1)).await;
    }
}
