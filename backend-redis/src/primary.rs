//! The server a [`RedisLock`](crate::RedisLock) speaks to: one fixed node, or the primary
//! that Redis Sentinel names, found again after a failover.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tenure_api::urls::HostPort;
use tenure_api::LockError;

use crate::config::{RedisConfig, Topology};
use crate::error::{bounded, classify};

/// Commands go over one multiplexed connection to a node (a dropped one is replaced as a
/// suspect one is, see [`Primary::rediscover`]), or over a Redis Cluster connection that
/// routes each by its key's slot (and follows `MOVED`/`ASK`). Not redis-rs's
/// `ConnectionManager`, which reconnects in place: it cost 3–4 µs of client CPU per request
/// (docs/performance.md), a third of a Redlock round's.
#[derive(Clone)]
pub(crate) enum Conn {
    Node(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            // A node without the script gets it by `EVAL`, which goes to the key's slot
            // like `EVALSHA`: the client's own fallback, `SCRIPT LOAD`, goes to every
            // node and fails when any one of them cannot take it (a replica still
            // loading, a node that just died).
            Conn::Cluster(c) => Box::pin(async move {
                match c.req_packed_command(cmd).await {
                    Err(e) if e.kind() == redis::ErrorKind::NoScriptError => match eval_of(cmd) {
                        Some(eval) => c.req_packed_command(&eval).await,
                        None => Err(e),
                    },
                    other => other,
                }
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `EVAL <code> …` for an `EVALSHA <sha> …` of one of this crate's scripts.
fn eval_of(evalsha: &redis::Cmd) -> Option<redis::Cmd> {
    let mut args = evalsha.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        redis::Arg::Cursor => None,
    });
    if !args.next()??.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let code = crate::scripts::code_of(args.next()??)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(code);
    for arg in args {
        eval.arg(arg?);
    }
    Some(eval)
}

/// One connected node, or a connected Redis Cluster.
pub(crate) struct Node {
    /// For the subscriber connection (`None` on a Redis Cluster, whose subscriber is a
    /// cluster connection of its own).
    pub(crate) client: Option<redis::Client>,
    /// What commands go over.
    pub(crate) conn: Conn,
    /// Where it is (`None` for a fixed server: it never moves).
    addr: Option<HostPort>,
    /// Counts the switches: 0 for the first node.
    pub(crate) generation: u64,
    /// A call timed out on it: the next call tries a fresh connection first, even to the
    /// same address (asking the sentinels first, if any). The old one may hang on a dead
    /// peer, or owe replies to requests lost on the way (a middlebox that ends TCP can
    /// drop them): replies are matched to requests in order, so every later request on
    /// it would wait behind a reply that never comes. (Redis Cluster: its own connection.)
    suspect: AtomicBool,
}

impl Node {
    /// Marks the node for a check before the next call (see [`Primary::node_for_call`]).
    pub(crate) fn suspect(&self) {
        self.suspect.store(true, Ordering::Relaxed);
    }

    fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }
}

/// The current primary, replaced when Sentinel names another.
pub(crate) struct Primary {
    config: RedisConfig,
    current: RwLock<Arc<Node>>,
    /// Held while the sentinels are asked; holds when the last check ended and why it
    /// found no primary, so the callers that queued behind a check take its answer.
    finding: tokio::sync::Mutex<Option<Checked>>,
    /// The sentinel that answered last, asked first next time.
    first: AtomicUsize,
}

struct Checked {
    finished: Instant,
    failure: Option<String>,
}

impl Primary {
    /// Connects to the configured server, or to the primary the sentinels name.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Self, LockError> {
        let deadline = Instant::now() + config.connect_timeout * 2;
        let first = AtomicUsize::new(0);
        let node = match config.topology {
            Topology::Sentinel(_) => match find_primary(config, None, &first, deadline).await? {
                Some(node) => node,
                // Only a current node can be the same.
                None => return Err(unavailable(config, "no primary to connect to")),
            },
            Topology::Cluster(_) => connect_cluster(config, deadline).await?,
            _ => connect_node(config, config, None, deadline).await?,
        };
        Ok(Self {
            config: config.clone(),
            current: RwLock::new(Arc::new(node)),
            finding: tokio::sync::Mutex::new(None),
            first,
        })
    }

    pub(crate) fn follows_sentinel(&self) -> bool {
        matches!(self.config.topology, Topology::Sentinel(_))
    }

    /// Whether a suspect node is replaced by a fresh connection: always but on a Redis
    /// Cluster, whose connection routes and reconnects by itself.
    fn replaces_suspects(&self) -> bool {
        !matches!(self.config.topology, Topology::Cluster(_))
    }

    /// The node commands go to now.
    pub(crate) fn node(&self) -> Arc<Node> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The node a call should go to: the current one, replaced first (see
    /// [`rediscover`](Self::rediscover)) if a request timed out on it. With Sentinel the
    /// check runs by `deadline`. Without, a fresh connection is made in a task of its own
    /// within the connect timeout (one at a time: callers that find the same node
    /// suspect meanwhile take that attempt's answer), and the call waits for it up to
    /// half its time left: past that, it goes over the old connection (its server may
    /// only be slow), and the fresh one serves the calls after it. A call's short bound
    /// (Redlock's node timeout) thus never cuts a reconnection short. Never fails:
    /// without a replacement, the current node.
    ///
    /// # Cancel safety
    /// Cancel-safe: the reconnection carries on without the call.
    pub(crate) async fn node_for_call(self: &Arc<Self>, deadline: Instant) -> Arc<Node> {
        let node = self.node();
        if !node.is_suspect() || !self.replaces_suspects() {
            return node;
        }
        if self.follows_sentinel() {
            return self.rediscover(&node, deadline).await.unwrap_or(node);
        }
        let (this, failed) = (Arc::clone(self), Arc::clone(&node));
        let connect_by = Instant::now() + self.config.connect_timeout;
        let fresh = tokio::spawn(async move { this.rediscover(&failed, connect_by).await });
        let now = Instant::now();
        let by = now + deadline.saturating_duration_since(now) / 2;
        match tokio::time::timeout_at(by.into(), fresh).await {
            Ok(Ok(Ok(fresh))) => fresh,
            _ => node,
        }
    }

    /// After `failed` (the node a call just failed on) stopped answering or said it is a
    /// replica: with Sentinel, asks the sentinels which node is the primary now and
    /// switches to it; without, switches to a fresh connection to the configured server
    /// if `failed` is suspect (a call marks a node whose connection dropped or timed out).
    /// Callers that saw the same node fail while a check ran take that check's answer
    /// instead of asking again. The node to retry on (`failed` itself on a Redis
    /// Cluster, or when it is still the primary and not suspect), or why none was
    /// reached, by `deadline`.
    ///
    /// # Cancel safety
    /// Cancel-safe: the switch happens whole or not at all.
    pub(crate) async fn rediscover(
        &self,
        failed: &Arc<Node>,
        deadline: Instant,
    ) -> Result<Arc<Node>, LockError> {
        let replace = failed.is_suspect() && self.replaces_suspects();
        if !(self.follows_sentinel() || replace) {
            return Ok(failed.clone());
        }
        // Boxed: every call's future would otherwise carry the whole discovery.
        Box::pin(self.switch(failed, deadline)).await
    }

    async fn switch(&self, failed: &Arc<Node>, deadline: Instant) -> Result<Arc<Node>, LockError> {
        let asked = Instant::now();
        let mut last = tokio::time::timeout_at(deadline.into(), self.finding.lock())
            .await
            .map_err(|_| unavailable(&self.config, "no time left to ask the sentinels"))?;
        let now = self.node();
        if now.generation != failed.generation {
            return Ok(now); // another caller switched meanwhile
        }
        if let Some(checked) = last.as_ref().filter(|c| c.finished >= asked) {
            return match &checked.failure {
                None => Ok(now),
                Some(why) => Err(unavailable(&self.config, why)),
            };
        }
        let found = find_primary(&self.config, Some(&now), &self.first, deadline).await;
        *last = Some(Checked {
            finished: Instant::now(),
            failure: found.as_ref().err().map(ToString::to_string),
        });
        let mut found = match found? {
            None => return Ok(now),
            Some(node) => node,
        };
        found.generation = now.generation + 1;
        let found = Arc::new(found);
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = found.clone();
        Ok(found)
    }
}

/// Connects to `node` (the configured server, or one a sentinel named) by `deadline`,
/// reporting errors as `config`'s.
async fn connect_node(
    config: &RedisConfig,
    node: &RedisConfig,
    addr: Option<HostPort>,
    deadline: Instant,
) -> Result<Node, LockError> {
    let client = node.client()?;
    let connection_config = AsyncConnectionConfig::new()
        .set_connection_timeout(config.connect_timeout)
        .set_response_timeout(config.request_timeout);
    let conn = bounded(
        deadline.saturating_duration_since(Instant::now()),
        client.get_multiplexed_async_connection_with_config(&connection_config),
    )
    .await
    .map_err(|e| {
        let dropped = e.is_connection_dropped();
        match classify(config, "connect", e) {
            // A TLS-only port drops a plaintext client at its first command.
            LockError::Unavailable { message, source } if dropped && !config.tls() => {
                LockError::Unavailable {
                    message: format!(
                        "{message} (the server closed the connection at once: if it \
                         requires TLS, use rediss://, rediss+sentinel:// or rediss+cluster://)"
                    ),
                    source,
                }
            }
            other => other,
        }
    })?;
    Ok(Node {
        client: Some(client),
        conn: Conn::Node(conn),
        addr,
        generation: 0,
        suspect: AtomicBool::new(false),
    })
}

/// Connects to a Redis Cluster through its seed nodes by `deadline`.
async fn connect_cluster(config: &RedisConfig, deadline: Instant) -> Result<Node, LockError> {
    let client = config.cluster_client(None)?;
    let conn = bounded(
        deadline.saturating_duration_since(Instant::now()),
        client.get_async_connection(),
    )
    .await
    .map_err(|e| classify(config, "connect", e))?;
    Ok(Node {
        client: None,
        conn: Conn::Cluster(conn),
        addr: None,
        generation: 0,
        suspect: AtomicBool::new(false),
    })
}

/// Asks the sentinels, starting with the one that answered last and each within its
/// share of the time left, which node is the primary (`SENTINEL
/// get-master-addr-by-name`), and checks with `ROLE` that the node named is one (a
/// sentinel can still name the old primary during a failover), as Redis's guidelines for
/// Sentinel clients say. A sentinel that does not answer, or names a node that is not a
/// primary, is passed over for the next. The node found, or `None` when the primary is
/// `current`'s address and `current` is not suspect.
async fn find_primary(
    config: &RedisConfig,
    current: Option<&Node>,
    first: &AtomicUsize,
    deadline: Instant,
) -> Result<Option<Node>, LockError> {
    let Topology::Sentinel(sentinel) = &config.topology else {
        return connect_node(config, config, None, deadline).await.map(Some);
    };
    let count = sentinel.sentinels.len();
    let start = first.load(Ordering::Relaxed) % count.max(1);
    let mut failures: Vec<LockError> = Vec::new();
    for (asked, i) in (start..count).chain(0..start).enumerate() {
        let at = &sentinel.sentinels[i];
        let share = deadline.saturating_duration_since(Instant::now()) / (count - asked) as u32;
        if share.is_zero() {
            break;
        }
        let ask = ask_sentinel(
            config,
            &sentinel.master,
            at,
            current,
            Instant::now() + share,
        );
        match ask.await {
            Ok(found) => {
                first.store(i, Ordering::Relaxed);
                return Ok(found);
            }
            Err(e) => failures.push(e),
        }
    }
    let why = failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let why = format!("no sentinel named a primary ({why})");
    if failures.len() == count && failures.iter().all(|e| matches!(e, LockError::Config(_))) {
        // Every sentinel answered and refused us (an unknown name, authentication): a
        // wrong URL or setup, not an outage.
        return Err(LockError::Config(format!("{}: {why}", config.endpoint())));
    }
    Err(unavailable(config, &why))
}

/// One sentinel's answer, checked, by `deadline`.
async fn ask_sentinel(
    config: &RedisConfig,
    master: &str,
    at: &HostPort,
    current: Option<&Node>,
    deadline: Instant,
) -> Result<Option<Node>, LockError> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let what = format!("sentinel {at}");
    let client = config.sentinel_node(at)?.client()?;
    let named = bounded(left(), async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    })
    .await
    .map_err(|e| match classify(config, &what, e) {
        LockError::Config(message) => LockError::Config(format!(
            "{message} (redis+sentinel:// asks the sentinels without credentials)"
        )),
        other => other,
    })?;
    let Some((host, port)) = named else {
        return Err(LockError::Config(format!(
            "{what} monitors no primary named {master:?}"
        )));
    };
    let addr = HostPort { host, port };
    if current.is_some_and(|n| n.addr.as_ref() == Some(&addr) && !n.is_suspect()) {
        return Ok(None);
    }
    let node = connect_node(config, &config.at(&addr)?, Some(addr.clone()), deadline).await?;
    let mut conn = node.conn.clone();
    let role: redis::Value = bounded(left(), redis::cmd("ROLE").query_async(&mut conn))
        .await
        .map_err(|e| classify(config, "ROLE", e))?;
    match role_name(&role) {
        Some("master") => Ok(Some(node)),
        other => Err(unavailable(
            config,
            &format!(
                "{what} names {addr}, which answers ROLE as {} (a failover may be under way)",
                other.unwrap_or("something else")
            ),
        )),
    }
}

fn role_name(role: &redis::Value) -> Option<&str> {
    match role {
        redis::Value::Array(parts) => match parts.first()? {
            redis::Value::BulkString(name) => std::str::from_utf8(name).ok(),
            redis::Value::SimpleString(name) => Some(name),
            _ => None,
        },
        _ => None,
    }
}

fn unavailable(config: &RedisConfig, why: &str) -> LockError {
    LockError::Unavailable {
        message: format!("{}: {why}", config.endpoint()),
        source: None,
    }
}
