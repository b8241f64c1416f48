//! One subscriber connection per client for every waiter's release channel.
//!
//! A waiter used to open a connection of its own for each wait (a TCP connect, and over
//! `rediss://` a TLS handshake and `AUTH`, before its `SUBSCRIBE`). Now the client keeps
//! one subscriber connection, opened at the first wait: a task owns it, subscribes a
//! channel when its first waiter arrives and unsubscribes it when its last one leaves,
//! and counts each channel's messages for the waiters. Requests are handled in order by
//! that task, so a waiter's subscription is confirmed before it is told so, and an
//! unsubscription can never overtake a later subscription to the same channel.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};

/// What a waiter asks the subscriber task.
enum Request {
    /// Subscribe `channel` (unless it already is) and count one more waiter on it.
    Watch {
        channel: String,
        reply: oneshot::Sender<Result<watch::Receiver<u64>, Refused>>,
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
    /// Starts the task that owns a new subscriber connection (split into its two
    /// halves). The task ends, and every [`ReleaseWatch`] learns it, when the connection
    /// closes or the last `Subscriber` and watch are gone.
    ///
    /// With `ping_check` (RESP2), the first subscription is confirmed by a `PING`: the
    /// client library hands back any reply to `SUBSCRIBE` as success, even an ACL's
    /// `NOPERM`, but a subscribed RESP2 connection answers `PING` with an array. A
    /// refusal found so refuses every later request on this connection at once (an ACL
    /// that refuses one channel of a prefix refuses them all).
    ///
    /// Each `SUBSCRIBE`, `PING` and `UNSUBSCRIBE` must be answered within `timeout`, or
    /// the connection counts as dead (an idle subscriber connection can be dropped
    /// silently on the way, by a NAT or a load balancer) and the task ends: the next
    /// waiter opens another.
    pub(crate) fn start(
        sink: PubSubSink,
        stream: PubSubStream,
        ping_check: bool,
        timeout: Duration,
    ) -> Self {
        let (requests, received) = mpsc::unbounded_channel();
        tokio::spawn(run(sink, stream, received, ping_check, timeout));
        Self { requests }
    }

    /// Whether the task still runs (its connection is open).
    pub(crate) fn is_open(&self) -> bool {
        !self.requests.is_closed()
    }

    /// Subscribes to `channel` for one more waiter, within `limit`.
    ///
    /// # Cancel safety
    /// Cancel safe: a subscription confirmed after the caller left is left again.
    pub(crate) async fn watch(
        &self,
        channel: String,
        limit: Duration,
    ) -> Result<ReleaseWatch, Refused> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Watch {
                channel: channel.clone(),
                reply,
            })
            .map_err(|_| Refused::Closed)?;
        let messages = match tokio::time::timeout(limit, answer).await {
            Err(_) => return Err(Refused::TimedOut(limit)),
            Ok(Err(_)) => return Err(Refused::Closed),
            Ok(Ok(answer)) => answer?,
        };
        Ok(ReleaseWatch {
            messages,
            channel,
            requests: self.requests.clone(),
        })
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

/// The subscriber task: requests in order, messages counted per channel.
async fn run(
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut ping_check: bool,
    timeout: Duration,
) {
    let mut channels: HashMap<String, Channel> = HashMap::new();
    // A refusal found by the ping check: every later request gets it too.
    let mut refused: Option<String> = None;
    loop {
        let request = tokio::select! {
            message = stream.next() => match message {
                Some(message) => {
                    if let Some(channel) = channels.get(message.get_channel_name()) {
                        channel.messages.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    continue;
                }
                None => return, // the connection closed: every watch sees its sender go
            },
            request = requests.recv() => match request {
                Some(request) => request,
                None => return,
            },
        };
        let leave = match request {
            Request::Leave { channel } => channel,
            Request::Watch { channel, reply } => {
                let answer = match channels.get_mut(&channel) {
                    Some(known) => {
                        known.waiters += 1;
                        Ok(known.messages.subscribe())
                    }
                    None => match &refused {
                        Some(why) => Err(Refused::NotSubscribed(why.clone())),
                        None => match subscribe(&mut sink, &channel, ping_check, timeout).await {
                            Ok(()) => {
                                ping_check = false;
                                let (messages, seen) = watch::channel(0);
                                channels.insert(
                                    channel.clone(),
                                    Channel {
                                        messages,
                                        waiters: 1,
                                    },
                                );
                                Ok(seen)
                            }
                            Err(Refused::NotSubscribed(why)) => {
                                refused = Some(why.clone());
                                Err(Refused::NotSubscribed(why))
                            }
                            Err(Refused::Redis(e)) if !broken(&e) => Err(Refused::Redis(e)),
                            Err(e) => {
                                let _ = reply.send(Err(e));
                                return; // the connection failed: a waiter opens another
                            }
                        },
                    },
                };
                match reply.send(answer) {
                    // The waiter gave up before the answer: it never watches.
                    Err(Ok(_)) => channel,
                    Ok(()) | Err(Err(_)) => continue,
                }
            }
        };
        let Some(known) = channels.get_mut(&leave) else {
            continue;
        };
        known.waiters -= 1;
        if known.waiters == 0 {
            channels.remove(&leave);
            let unsubscribed = tokio::time::timeout(timeout, sink.unsubscribe(&leave)).await;
            if !matches!(unsubscribed, Ok(Ok(()))) {
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
/// [`Subscriber::start`]).
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

    /// A subscriber connection whose server stops answering (an idle connection dropped
    /// silently on the way) is given up, so the next waiter opens another instead of
    /// queueing behind it for good.
    #[tokio::test]
    async fn a_connection_that_stops_answering_is_given_up() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Answers `+OK` to each command of the connection's set-up, then nothing from the
        // first SUBSCRIBE on.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = silent.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut answering = true;
            loop {
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                let chunk = &buf[..n];
                answering &= !chunk.windows(9).any(|w| w == b"SUBSCRIBE");
                if answering {
                    // One reply per command: each RESP command starts a line with `*`.
                    let commands = chunk
                        .iter()
                        .enumerate()
                        .filter(|&(i, &b)| b == b'*' && (i == 0 || chunk[i - 1] == b'\n'))
                        .count();
                    let _ = socket.write_all(&b"+OK\r\n".repeat(commands)).await;
                }
            }
        });
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let pubsub = tokio::time::timeout(Duration::from_secs(5), client.get_async_pubsub())
            .await
            .expect("connects without waiting for a reply")
            .unwrap();
        let (sink, stream) = pubsub.split();
        let timeout = Duration::from_millis(100);
        let subscriber = Subscriber::start(sink, stream, true, timeout);
        let refused = subscriber
            .watch("channel".into(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, Refused::TimedOut(t) if t == timeout),
            "{refused:?}"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while subscriber.is_open() {
            assert!(tokio::time::Instant::now() < deadline, "the task ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.abort();
    }
}
