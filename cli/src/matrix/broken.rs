//! Deliberately broken locks, to prove the matrix catches them: each is a thin wrapper
//! over a real backend client (on the same servers and links) that re-creates one
//! classic anti-pattern. Run one with `tenure matrix --backends broken:NAME`; list them
//! with `tenure matrix --list-broken`. Never use them for anything else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sqlx::Connection as _;
use tenure_api::backend::{default_drift, poll_acquire};
use tenure_api::{
    async_trait, validate_ttl, AcquireOptions, Capabilities, DistributedLock, FencingToken,
    HolderInfo, Lease, LeaseHandle, LockError, LockKey, OwnerId, ReleaseOutcome, SystemClock,
    MAX_TTL,
};
use tenure_redis::{Grant, RedisLock};

/// A classic anti-pattern, re-created on a real backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Redis: `SETNX`, then `EXPIRE` as a second command.
    SetnxThenExpire,
    /// Redis: release by `GET`, compare, then `DEL`: two commands, no atomicity.
    GetDelRelease,
    /// Redis: release by a bare `DEL`, whoever holds the key.
    DelWithoutOwnerCheck,
    /// Redis: one lock value (owner id) shared by every client.
    FixedValue,
    /// Redlock: the deadline is counted from the last reply, and a late quorum is kept.
    RedlockNoValidity,
    /// Redlock: a grant on any one node is taken for the lock.
    RedlockMinority,
    /// Redlock: every round of one `acquire` grants to the same owner id, so a failed
    /// round's clean-up, landing late behind its stalled grant, deletes a later round's.
    OwnerReusedAcrossRetries,
    /// Redis: `extend` on a lost lock takes the lock again and reports success.
    ExtendReacquires,
    /// Redis: fencing tokens from a counter in the client process.
    LocalCounterToken,
    /// Redis: the lease's deadline counts from the reply, not from the request.
    DeadlineFromReply,
    /// etcd: the answer to a keep-alive is never checked (no answer, or TTL 0, taken as
    /// renewed).
    EtcdIgnoresExpiry,
    /// ZooKeeper: a `Disconnected` session is taken for a live one.
    ZkDisconnectedHeld,
    /// Postgres: the fence counter is raised in a transaction of the holder's that
    /// commits with the release, so a crashed holder's token is handed out again.
    PgFenceInTxn,
    /// Redis, its client untouched: the holder's guard counts its deadline on
    /// CLOCK_MONOTONIC alone, which stands still while the machine is suspended, so a
    /// holder woken after its lease ran out on the server still believes it.
    DeadlineOnAStoppingClock,
}

impl Flaw {
    /// Every variant, in the order `--list-broken` prints them.
    pub const ALL: [Flaw; 14] = [
        Flaw::SetnxThenExpire,
        Flaw::GetDelRelease,
        Flaw::DelWithoutOwnerCheck,
        Flaw::FixedValue,
        Flaw::RedlockNoValidity,
        Flaw::RedlockMinority,
        Flaw::ExtendReacquires,
        Flaw::LocalCounterToken,
        Flaw::DeadlineFromReply,
        Flaw::EtcdIgnoresExpiry,
        Flaw::ZkDisconnectedHeld,
        Flaw::PgFenceInTxn,
        Flaw::OwnerReusedAcrossRetries,
        Flaw::DeadlineOnAStoppingClock,
    ];

    /// The name after `broken:`.
    pub fn name(self) -> &'static str {
        match self {
            Flaw::SetnxThenExpire => "setnx-then-expire",
            Flaw::GetDelRelease => "get-del-release",
            Flaw::DelWithoutOwnerCheck => "del-without-owner-check",
            Flaw::FixedValue => "fixed-value",
            Flaw::RedlockNoValidity => "redlock-no-validity",
            Flaw::RedlockMinority => "redlock-minority",
            Flaw::ExtendReacquires => "extend-reacquires",
            Flaw::LocalCounterToken => "local-counter-token",
            Flaw::DeadlineFromReply => "deadline-from-reply",
            Flaw::EtcdIgnoresExpiry => "etcd-ignores-expiry",
            Flaw::ZkDisconnectedHeld => "zk-disconnected-held",
            Flaw::PgFenceInTxn => "pg-fence-in-txn",
            Flaw::OwnerReusedAcrossRetries => "owner-reused-across-retries",
            Flaw::DeadlineOnAStoppingClock => "deadline-on-a-stopping-clock",
        }
    }

    /// The real backend it wraps.
    pub fn backend(self) -> &'static str {
        match self {
            Flaw::RedlockNoValidity | Flaw::RedlockMinority | Flaw::OwnerReusedAcrossRetries => {
                "redlock"
            }
            Flaw::EtcdIgnoresExpiry => "etcd",
            Flaw::ZkDisconnectedHeld => "zk",
            Flaw::PgFenceInTxn => "postgres",
            _ => "redis",
        }
    }

    /// Whether the flaw is in the holder's clock rather than its client: the fault
    /// suite then times the holder's guard on a clock that cannot tell suspends
    /// ([`FaultTarget::with_stopping_clock`](tenure_conformance::faults::FaultTarget::with_stopping_clock)).
    pub fn stops_the_clock(self) -> bool {
        self == Flaw::DeadlineOnAStoppingClock
    }

    /// The variant named by a backend name `broken:NAME`; `Ok(None)` for other names.
    pub fn of_backend(name: &str) -> Result<Option<Flaw>, LockError> {
        let Some(wanted) = name.strip_prefix("broken:") else {
            return Ok(None);
        };
        match Flaw::ALL.into_iter().find(|f| f.name() == wanted) {
            Some(flaw) => Ok(Some(flaw)),
            None => Err(LockError::InvalidInput(format!(
                "no broken variant {wanted:?} (known: {})",
                Flaw::ALL.map(Flaw::name).join(", ")
            ))),
        }
    }
}

/// The value every [`Flaw::FixedValue`] client writes.
const FIXED_OWNER: OwnerId = OwnerId([0x42; 16]);

/// The table of [`Flaw::PgFenceInTxn`]'s counters.
const PG_FENCE_TABLE: &str = "tenure_broken_fence";

/// What a variant needs beyond the real client.
enum Raw {
    None,
    /// The real Redis client, and a plain connection of its own through the same links.
    Redis(Box<(RedisLock, ConnectionManager)>),
    /// One real Redis client per Redlock node, the configuration, and the grants needed.
    Nodes(Vec<RedisLock>, tenure_redlock::RedlockConfig, usize),
    /// A connection of the holder's own, in the transaction that holds its fence raise.
    Pg(Box<PgRaw>),
}

/// [`Flaw::PgFenceInTxn`]'s own connection (in the transaction that holds its fence raise).
struct PgRaw {
    conn: tokio::sync::Mutex<Option<sqlx::PgConnection>>,
    config: tenure_postgres::PgConfig,
}

/// A real client with one flaw.
struct Broken {
    flaw: Flaw,
    inner: Arc<dyn DistributedLock>,
    raw: Raw,
    /// [`Flaw::LocalCounterToken`]'s counter.
    counter: AtomicU64,
    /// Real leases behind leases handed out with tokens of the wrapper's own.
    real: Mutex<HashMap<OwnerId, Lease>>,
}

impl std::fmt::Debug for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broken")
            .field("flaw", &self.flaw)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        message: format!("broken lock: {what}: {error}"),
        source: None,
    }
}

/// A plain connection that reconnects after a cut, with the client's request timeout.
async fn redis_conn(config: &tenure_redis::RedisConfig) -> Result<ConnectionManager, LockError> {
    let options = ConnectionManagerConfig::new()
        .set_connection_timeout(config.connect_timeout)
        .set_response_timeout(config.request_timeout)
        .set_number_of_retries(1);
    redis::Client::open(config.client_url()?)
        .map_err(|e| LockError::Config(e.to_string()))?
        .get_connection_manager_with_config(options)
        .await
        .map_err(|e| unavailable("connect", e))
}

async fn pg_conn(config: &tenure_postgres::PgConfig) -> Result<sqlx::PgConnection, LockError> {
    sqlx::PgConnection::connect_with(config.connect_options())
        .await
        .map_err(|e| unavailable("connect", e))
}

/// Loads the server's scripts, so that a request under a fault runs at once rather than
/// after a `NOSCRIPT` round trip (as in any long-running process).
async fn warm_up(lock: &RedisLock) -> Result<(), LockError> {
    let key = LockKey::new("tenure-broken/warm-up")?;
    let (owner, limit) = (OwnerId::random(), lock.config().request_timeout);
    lock.grant(&key, owner, Duration::from_secs(1), None, limit)
        .await?;
    lock.extend_owner(&key, owner, Duration::from_secs(1), limit)
        .await?;
    lock.release_owner(&key, owner, limit).await?;
    Ok(())
}

/// Wraps `inner`, a real client of `url`, in `flaw`. Any raw connection goes to `url`
/// too (through the same proxies).
///
/// # Cancel safety
/// Cancel-safe: nothing is left behind.
pub async fn wrap(
    flaw: Flaw,
    url: String,
    inner: Arc<dyn DistributedLock>,
) -> Result<Arc<dyn DistributedLock>, LockError> {
    let raw = match flaw.backend() {
        _ if flaw.stops_the_clock() => Raw::None,
        "redis" => {
            let lock = RedisLock::connect(&url).await?;
            let conn = redis_conn(lock.config()).await?;
            warm_up(&lock).await?;
            Raw::Redis(Box::new((lock, conn)))
        }
        "redlock" => {
            let config = tenure_redlock::RedlockConfig::from_url(&url)?;
            let needed = match flaw {
                Flaw::RedlockMinority => 1,
                _ => config.quorum(),
            };
            let nodes = config.nodes.iter().cloned().map(|mut node| {
                // Each request is bounded by the Redlock node timeout instead.
                node.request_timeout = node.request_timeout.max(config.node_timeout_for(MAX_TTL));
                async move {
                    let lock = RedisLock::with_config(node).await?;
                    warm_up(&lock).await?;
                    Ok::<_, LockError>(lock)
                }
            });
            let nodes = futures::future::try_join_all(nodes).await?;
            Raw::Nodes(nodes, config, needed)
        }
        "postgres" => {
            let config = tenure_postgres::PgConfig::from_url(&url)?;
            let mut conn = pg_conn(&config).await?;
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {PG_FENCE_TABLE} (key text PRIMARY KEY, n bigint NOT NULL)"
            );
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&mut conn)
                .await
            {
                // Concurrent creations race on the catalog; one of them made it.
                let probe = format!("SELECT 1 FROM {PG_FENCE_TABLE} LIMIT 0");
                sqlx::query(sqlx::AssertSqlSafe(probe))
                    .execute(&mut conn)
                    .await
                    .map_err(|_| unavailable("fence table", e))?;
            }
            Raw::Pg(Box::new(PgRaw {
                conn: tokio::sync::Mutex::new(Some(conn)),
                config,
            }))
        }
        _ => Raw::None,
    };
    Ok(Arc::new(Broken {
        flaw,
        inner,
        raw,
        counter: AtomicU64::new(0),
        real: Mutex::new(HashMap::new()),
    }))
}

impl PgRaw {
    /// Raises `key`'s counter in an open transaction of its own, committed on release.
    async fn fence(&self, key: &LockKey) -> Result<FencingToken, LockError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(pg_conn(&self.config).await?);
        }
        let conn = slot.as_mut().expect("connected above");
        let raise = format!(
            "INSERT INTO {PG_FENCE_TABLE} AS f (key, n) VALUES ($1, 1) \
             ON CONFLICT (key) DO UPDATE SET n = f.n + 1 RETURNING n"
        );
        let result = async {
            sqlx::query("BEGIN").execute(&mut *conn).await?;
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(raise))
                .bind(key.as_str())
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match result {
            Ok(n) => Ok(FencingToken(u64::try_from(n).unwrap_or(0))),
            Err(e) => {
                *slot = None;
                Err(unavailable("fence raise", e))
            }
        }
    }
}

impl Broken {
    fn redis(&self) -> (&RedisLock, ConnectionManager) {
        match &self.raw {
            Raw::Redis(raw) => (&raw.0, raw.1.clone()),
            _ => unreachable!("{:?} is a Redis variant", self.flaw),
        }
    }

    /// The Redlock nodes, each request bounded by the node timeout for `ttl`, and the
    /// grants needed.
    fn nodes(&self, ttl: Duration) -> (&[RedisLock], Duration, usize) {
        match &self.raw {
            Raw::Nodes(nodes, config, needed) => (nodes, config.node_timeout_for(ttl), *needed),
            _ => unreachable!("{:?} is a Redlock variant", self.flaw),
        }
    }

    /// Whether `try_acquire` is the wrapper's own (and `acquire` polls it).
    fn own_acquire(&self) -> bool {
        matches!(
            self.flaw,
            Flaw::SetnxThenExpire
                | Flaw::FixedValue
                | Flaw::RedlockNoValidity
                | Flaw::RedlockMinority
                | Flaw::DeadlineFromReply
                | Flaw::OwnerReusedAcrossRetries
        )
    }

    /// Whether leases carry tokens of the wrapper's own.
    fn own_tokens(&self) -> bool {
        matches!(self.flaw, Flaw::LocalCounterToken | Flaw::PgFenceInTxn)
    }

    fn reals(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerId, Lease>> {
        self.real.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lease(
        &self,
        key: &LockKey,
        owner: OwnerId,
        token: FencingToken,
        from: Instant,
        ttl: Duration,
    ) -> Lease {
        let drift = match self.flaw {
            Flaw::DeadlineFromReply | Flaw::RedlockNoValidity => Duration::ZERO,
            _ => default_drift(ttl),
        };
        let path = match &self.raw {
            Raw::Redis(raw) => raw.0.lock_key(key),
            _ => String::new(),
        };
        Lease::new(key.clone(), owner, token, from, ttl, drift).with_handle(LeaseHandle {
            path,
            ..LeaseHandle::default()
        })
    }

    /// The wrapper's own single attempt.
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        match self.flaw {
            Flaw::SetnxThenExpire => {
                let (lock, mut conn) = self.redis();
                let (name, owner) = (lock.lock_key(key), OwnerId::random());
                let count: u64 = redis::cmd("INCR")
                    .arg(format!("{name}:fence"))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable("INCR", e))?;
                let set: bool = redis::cmd("SETNX")
                    .arg(&name)
                    .arg(format!("{owner}:{count}"))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable("SETNX", e))?;
                if !set {
                    return Ok(None);
                }
                let _: bool = redis::cmd("PEXPIRE")
                    .arg(&name)
                    .arg(ttl.as_millis().to_string())
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable("PEXPIRE", e))?;
                let token = tenure_redis::scripts::token_for(count, owner)?;
                Ok(Some(self.lease(key, owner, token, sent, ttl)))
            }
            Flaw::FixedValue | Flaw::DeadlineFromReply => {
                let owner = match self.flaw {
                    Flaw::FixedValue => FIXED_OWNER,
                    _ => OwnerId::random(),
                };
                let from = |replied| match self.flaw {
                    Flaw::FixedValue => sent,
                    _ => replied,
                };
                let redis = &self.redis().0;
                let limit = redis.config().request_timeout;
                match redis.grant(key, owner, ttl, None, limit).await? {
                    Grant::Granted(token) => Ok(Some(self.lease(
                        key,
                        owner,
                        token,
                        from(Instant::now()),
                        ttl,
                    ))),
                    Grant::Held(_) => Ok(None),
                }
            }
            _ => self.round(key, ttl, OwnerId::random()).await,
        }
    }

    /// A Redlock round for `owner`: a grant on `needed` nodes, with the largest node
    /// token; else a release of `owner` on every node (the clean-up).
    async fn round(
        &self,
        key: &LockKey,
        ttl: Duration,
        owner: OwnerId,
    ) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        let (nodes, bound, needed) = self.nodes(ttl);
        let grants =
            futures::future::join_all(nodes.iter().map(|n| n.grant(key, owner, ttl, None, bound)))
                .await;
        let replied = Instant::now();
        let tokens: Vec<FencingToken> = grants
            .into_iter()
            .filter_map(|g| match g {
                Ok(Grant::Granted(token)) => Some(token),
                _ => None,
            })
            .collect();
        let valid = self.flaw == Flaw::RedlockNoValidity
            || replied < sent + ttl.saturating_sub(default_drift(ttl));
        if tokens.len() >= needed && valid {
            let from = match self.flaw {
                Flaw::RedlockNoValidity => replied,
                _ => sent,
            };
            let token = tokens.into_iter().max().unwrap_or(FencingToken(0));
            return Ok(Some(self.lease(key, owner, token, from, ttl)));
        }
        futures::future::join_all(nodes.iter().map(|n| n.release_owner(key, owner, bound))).await;
        Ok(None)
    }

    /// Hands out `real` under a token of the wrapper's own.
    async fn retoken(&self, real: Lease) -> Result<Lease, LockError> {
        let token = match &self.raw {
            Raw::Pg(pg) => match pg.fence(real.key()).await {
                Ok(token) => token,
                Err(e) => {
                    let _ = self.inner.release(real).await;
                    return Err(e);
                }
            },
            _ => FencingToken(self.counter.fetch_add(1, Ordering::Relaxed) + 1),
        };
        self.reals().insert(real.owner(), real.clone());
        Ok(real.with_token(token))
    }

    /// Commits the fence raise (with the release, as the lock's own transaction would).
    async fn pg_commit(&self) {
        if let Raw::Pg(pg) = &self.raw {
            let mut slot = pg.conn.lock().await;
            if let Some(c) = slot.as_mut() {
                if sqlx::query("COMMIT").execute(&mut *c).await.is_err() {
                    *slot = None;
                }
            }
        }
    }
}

#[async_trait]
impl DistributedLock for Broken {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        if self.own_acquire() {
            return self.attempt(key, ttl).await;
        }
        match self.inner.try_acquire(key, ttl).await? {
            Some(lease) if self.own_tokens() => self.retoken(lease).await.map(Some),
            other => Ok(other),
        }
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        if self.flaw == Flaw::OwnerReusedAcrossRetries {
            opts.refuse_label("broken")?;
            validate_ttl(opts.ttl)?;
            // One owner id for every round of the call.
            let owner = OwnerId::random();
            return poll_acquire(&SystemClock, opts, || self.round(key, opts.ttl, owner)).await;
        }
        if self.own_acquire() {
            opts.refuse_label("broken")?;
            return poll_acquire(&SystemClock, opts, || self.attempt(key, opts.ttl)).await;
        }
        let lease = self.inner.acquire(key, opts).await?;
        if self.own_tokens() {
            return self.retoken(lease).await;
        }
        Ok(lease)
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let sent = Instant::now();
        let renewed = |lease: &mut Lease| lease.renewed(sent, ttl, default_drift(ttl));
        match self.flaw {
            _ if self.own_tokens() => {
                let real = self.reals().get(&lease.owner()).cloned();
                let Some(mut real) = real else {
                    return Err(LockError::lost("broken lock: no such lease"));
                };
                self.inner.extend(&mut real, ttl).await?;
                *lease = real.clone().with_token(lease.token());
                self.reals().insert(real.owner(), real);
                Ok(())
            }
            Flaw::RedlockNoValidity | Flaw::RedlockMinority | Flaw::OwnerReusedAcrossRetries => {
                let (nodes, bound, needed) = self.nodes(ttl);
                let (key, owner) = (lease.key().clone(), lease.owner());
                let extended = futures::future::join_all(
                    nodes
                        .iter()
                        .map(|n| n.extend_owner(&key, owner, ttl, bound)),
                )
                .await;
                if extended
                    .into_iter()
                    .filter(|e| matches!(e, Ok(true)))
                    .count()
                    < needed
                {
                    return Err(LockError::lost("broken lock: extended on too few nodes"));
                }
                renewed(lease);
                Ok(())
            }
            Flaw::ExtendReacquires => match self.inner.extend(lease, ttl).await {
                Err(LockError::LeaseLost { .. }) => {
                    match self.inner.try_acquire(lease.key(), ttl).await? {
                        Some(again) => {
                            *lease = again;
                            Ok(())
                        }
                        None => Err(LockError::lost("broken lock: taken by another")),
                    }
                }
                other => other,
            },
            Flaw::EtcdIgnoresExpiry => {
                // The keep-alive went out; whatever came back (if anything), renewed.
                let _ = self.inner.extend(lease, ttl).await;
                renewed(lease);
                Ok(())
            }
            Flaw::ZkDisconnectedHeld => {
                // No prompt answer means a disconnected session, presumed alive, its
                // node still ours; only a server that says otherwise ends the lease.
                let prompt = ttl / 10;
                let error = match tokio::time::timeout(prompt, self.inner.extend(lease, ttl)).await
                {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(e)) => e,
                    Err(_) => LockError::lost("broken lock: no answer"),
                };
                match tokio::time::timeout(prompt, self.inner.inspect(lease.key())).await {
                    Ok(Ok(Some(holder))) if holder.owner != lease.owner() => Err(error),
                    Ok(Ok(None)) => Err(error),
                    _ => {
                        renewed(lease);
                        Ok(())
                    }
                }
            }
            _ => self.inner.extend(lease, ttl).await,
        }
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let outcome = |deleted: bool| {
            if deleted {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            }
        };
        match self.flaw {
            _ if self.own_tokens() => {
                let real = self.reals().remove(&lease.owner()).unwrap_or(lease);
                let released = self.inner.release(real).await;
                self.pg_commit().await;
                released
            }
            Flaw::GetDelRelease | Flaw::DelWithoutOwnerCheck => {
                let (lock, mut conn) = self.redis();
                let name = lock.lock_key(lease.key());
                if self.flaw == Flaw::GetDelRelease {
                    let value: Option<String> = redis::cmd("GET")
                        .arg(&name)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| unavailable("GET", e))?;
                    if !value.is_some_and(|v| v.starts_with(&format!("{}:", lease.owner()))) {
                        return Ok(ReleaseOutcome::NotHeld);
                    }
                }
                let deleted: i64 = redis::cmd("DEL")
                    .arg(&name)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable("DEL", e))?;
                Ok(outcome(deleted > 0))
            }
            Flaw::RedlockNoValidity | Flaw::RedlockMinority | Flaw::OwnerReusedAcrossRetries => {
                // Each node's request bounded as the real Redlock bounds it: a cut-off
                // node must not hold the release up.
                let (nodes, bound, _) = self.nodes(lease.ttl());
                let released = futures::future::join_all(
                    nodes
                        .iter()
                        .map(|n| n.release_owner(lease.key(), lease.owner(), bound)),
                )
                .await;
                Ok(outcome(released.iter().any(|r| matches!(r, Ok(true)))))
            }
            _ => self.inner.release(lease).await,
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    /// The backend's, except that a flaw with an acquire of its own records no labels.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            labels: self.inner.capabilities().labels && !self.own_acquire(),
            ..self.inner.capabilities()
        }
    }
}
