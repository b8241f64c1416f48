#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod error;
#[cfg(feature = "testbed")]
pub mod floor;
#[cfg(feature = "testbed")]
pub mod lab;
mod primary;
mod releases;
pub mod scripts;
mod unanswered;
#[cfg(feature = "testbed")]
pub mod verdicts;
mod writer_mark;

use std::fmt;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_api::backend::{default_drift, validate_keys, Backend, Driver};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey, OwnerId, ReleaseOutcome,
    Replication, WaitKind,
};

pub use config::{
    redact, FenceMode, RedisConfig, SentinelConfig, Topology, DEFAULT_SENTINEL_PORT,
    DEFAULT_WAIT_TIMEOUT, MAX_WAIT_REPLICAS,
};
use config::{KeyName, FENCE, READERS, RELEASED, WRITER};
use error::{bounded, classify, timed_out};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;
use primary::{Conn, Primary};
pub use releases::ReleaseWatch;
use releases::{Link, Refused, Subscriber};
use scripts::{count_of, holder_of, token_for, Call, MAX_COUNT, SCRIPTS};
use unanswered::Unanswered;
use writer_mark::WriterMark;

/// Words of the refusal of a grant too few replicas confirmed (`wait_replicas`).
pub(crate) const UNCONFIRMED: &str = "replicas wait_replicas asks for";

/// The commands a Redis ACL user needs for locks, and no more: the scripts (`EVALSHA`,
/// and `SCRIPT LOAD` for a server that does not have them yet), the commands they run,
/// and the release channel (`SUBSCRIBE`, `UNSUBSCRIBE`, `PING`). Give the user the keys and channels of
/// its prefix too — for `prefix=app/`, keys `{app/…}`, `{app/…}:fence`, `{app/…}:readers`,
/// `{app/…}:writer` and channel `{app/…}:released`:
///
/// ```text
/// ACL SETUSER app on >password resetkeys ~{app/* resetchannels &{app/* -@all +evalsha +script|load +get +set +pexpire +pttl +time +incr +persist +del +hget +hset +hdel +hgetall +publish +subscribe +unsubscribe +ping +wait +role +cluster|slots
/// ```
///
/// (`WAIT` only for [`wait_replicas`](RedisConfig::wait_replicas), `ROLE` only for
/// Redis Sentinel, which checks the primary it is sent to, `CLUSTER SLOTS` only for a
/// Redis Cluster, whose client reads the slot map with it; on a cluster, `EVAL` too
/// when a node lacks a script — `+eval` —, sharded pub/sub for the release channel —
/// `+spublish +ssubscribe +sunsubscribe` — and the user on every node, as ACLs are not
/// shared between them.)
///
/// (`SELECT` too if the URL names a database other than 0.) `tenure admin` needs more
/// (it scans keys). The secured-server tests run the whole suite as such a user.
pub const ACL_COMMANDS: &str = "-@all +evalsha +script|load +get +set +pexpire +pttl +time \
    +incr +persist +del +hget +hset +hdel +hgetall +publish +subscribe +unsubscribe +ping +wait \
    +role +cluster|slots";

/// How often, at least, a subscribed waiter tries again (or at the caller's backoff
/// ceiling, if longer), however long the holder's TTL: a safety net for release messages
/// never sent — another recipe's holder (redis-py's `Lock`) publishes none, and older
/// tenure clients on a Cluster polled — or lost unseen (the cluster client can replace a
/// node's connection without telling, and its own resubscription can fail).
const RELEASE_RECHECK: Duration = Duration::from_secs(1);

/// How long a waiting writer's mark keeps further readers out unless renewed: a writer
/// that waits while readers hold renews it at least every [`RELEASE_RECHECK`], and takes
/// it back when it stops waiting; one whose process died stops holding readers back
/// this long after.
const WRITER_MARK: Duration = Duration::from_secs(3);

/// The longest a call waits, whatever `limit` it is given (a year: for ever).
const LIMIT_MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// A lock service on one Redis server, the primary Redis Sentinel names, or a Redis
/// Cluster. Cheap to share (`Arc`); all calls multiplex over one connection, replaced
/// when it drops (a cluster connection, routed by slot, on a cluster), and all waiters
/// share one subscriber connection (opened at the first wait, again after it closes;
/// on a cluster, a cluster connection subscribing shard channels).
#[derive(Clone)]
pub struct RedisLock {
    config: RedisConfig,
    primary: Arc<Primary>,
    /// The shared subscriber, with the generation of the node it is on.
    subscriber: Arc<tokio::sync::Mutex<Option<(Subscriber, u64)>>>,
    /// The connection each owner's unanswered request went over, where its clean-up goes.
    unanswered: Arc<Unanswered>,
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What one run of the acquire script on a node found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The lock is ours, with this node's fence token.
    Granted(FencingToken),
    /// Another owner holds it for this much longer (`Duration::MAX`: with no expiry,
    /// as another recipe's lock may be).
    Held(Duration),
    /// Readers hold it ([`DistributedLock::acquire_shared`]), the last of them for this
    /// much longer.
    ReadHeld(Duration),
}

/// Which grant a request asks for: the key's one writer, or one of its readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Shared,
}

/// What a grant request asks for: a lease of `ttl`, with `label`, in `mode`.
#[derive(Clone, Copy, Debug)]
struct Ask<'a> {
    ttl: Duration,
    label: Option<&'a str>,
    mode: Mode,
}

impl<'a> Ask<'a> {
    fn exclusive(ttl: Duration, label: Option<&'a str>) -> Self {
        Self {
            ttl,
            label,
            mode: Mode::Exclusive,
        }
    }
}

/// Armed while an acquire script is in flight: dropped there (the caller gave up on the
/// acquire), it releases the owner's possible grant in a task of its own, so the lock is
/// not held by nobody until its TTL. The attempt forgets it once the reply is in.
struct InFlight<'a> {
    lock: &'a RedisLock,
    keys: &'a [LockKey],
    owner: OwnerId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.lock.release_detached(self.keys, self.owner);
    }
}

/// What one acquire attempt found.
enum Attempt {
    Granted(Lease),
    Held {
        pttl: Duration,
        /// Readers hold the key (a waiting writer marks itself).
        readers: bool,
    },
    /// Granted, but the reply came after the lease's deadline: refused and released (see
    /// [`RedisLock::attempt`]).
    Late(LockError),
}

impl RedisLock {
    /// This backend for URL dispatch ([`Driver`]): `redis://`, `rediss://`,
    /// `redis+sentinel://`, `rediss+sentinel://`, `redis+cluster://`, `rediss+cluster://`.
    pub const DRIVER: Driver = Driver {
        name: "redis",
        schemes: &[
            "redis",
            "rediss",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
        connect: |url| Box::pin(async move { Self::connect(url).await.map(Backend::new) }),
    };

    /// Connects to the server named by a `redis://` or `rediss://` URL, to the primary
    /// the sentinels of a `redis+sentinel://` (`rediss+sentinel://`) URL name, or to the
    /// Redis Cluster of a `redis+cluster://` (`rediss+cluster://`) URL (see
    /// [`RedisConfig`] and the crate docs).
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(RedisConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    pub async fn with_config(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        let primary = Arc::new(Primary::connect(&config).await?);
        Ok(Self {
            config,
            primary,
            subscriber: Arc::default(),
            unanswered: Arc::default(),
        })
    }

    /// Whether this is a Redis Cluster (sharded pub/sub, keys in different slots).
    fn is_cluster(&self) -> bool {
        matches!(self.config.topology, Topology::Cluster(_))
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The Redis key holding `key`'s lock: the prefixed name in a hash tag.
    pub fn lock_key(&self, key: &LockKey) -> String {
        self.config.lock_key(key)
    }

    /// See [`RedisConfig::key_name`].
    fn key_name<'a>(&'a self, key: &'a LockKey, suffix: &'static str) -> KeyName<'a> {
        self.config.key_name(key, suffix)
    }

    async fn call<T: redis::FromRedisValue>(&self, what: &str, call: Call) -> Result<T, LockError> {
        let bound = Bound::full(self.config.request_timeout);
        let (value, _) = self
            .run_script(what, &call, bound, 0, &Route::Current)
            .await?;
        Ok(value)
    }

    /// Runs a script that writes (over `route`), then checks that
    /// [`RedisConfig::wait_replicas`] replicas have the write: the value, and `Err`
    /// naming what `what` did and how many replicas confirmed it when too few did (`Ok`
    /// at once without `wait_replicas`).
    async fn call_confirmed<T: redis::FromRedisValue>(
        &self,
        what: &str,
        call: Call,
        bound: Bound,
        route: &Route,
    ) -> Result<(T, Result<(), String>), LockError> {
        let wanted = self.config.wait_replicas;
        let (value, confirmed) = self.run_script(what, &call, bound, wanted, route).await?;
        let confirmed = match confirmed {
            Some(got) if got < i64::from(wanted) => Err(format!(
                "{what} on {}: {got} of the {wanted} {UNCONFIRMED} confirmed it within {:?}",
                self.config.endpoint(),
                self.config.wait_timeout
            )),
            _ => Ok(()),
        };
        Ok((value, confirmed))
    }

    /// Runs a script, waiting at most `bound.limit` in all (reconnect and retry included).
    /// With `replicas` > 0, `WAIT replicas wait_timeout` follows in the same pipeline, so
    /// on the same connection (`WAIT` counts that connection's writes: sent separately,
    /// after a reconnect, it would confirm nothing yet report every replica); the second
    /// value is its answer.
    ///
    /// `route` says where it goes: a grant request is noted until a reply arrives on
    /// its connection, and a clean-up can be sent behind such a request (see
    /// [`unanswered`]).
    async fn run_script<T: redis::FromRedisValue>(
        &self,
        what: &str,
        call: &Call,
        bound: Bound,
        replicas: u32,
        route: &Route,
    ) -> Result<(T, Option<i64>), LockError> {
        let deadline = Instant::now() + bound.limit.min(LIMIT_MAX);
        let left = || deadline.saturating_duration_since(Instant::now());
        let wait = self.config.wait_timeout;
        let mut node = match route {
            Route::Behind(node) => node.clone(),
            _ => self.primary.node_for_call(deadline).await,
        };
        let mut retried = false;
        // One loop for the call and its retry: a second `send` in the code would double
        // the space every call's future reserves for it.
        loop {
            let mut conn = node.conn.clone();
            let budget = left();
            if let Route::Grant(owner) = route {
                self.unanswered.sending(*owner, &node);
            }
            let result = bounded(budget, send(call, replicas, wait, &mut conn)).await;
            if let Route::Grant(owner) = route {
                // Without a reply the request may still reach the server: noted.
                if !matches!(&result, Err(e) if unanswered(e)) {
                    self.unanswered.answered(*owner, &node);
                }
            }
            // A connection that dropped is not reconnected in place (as redis-rs's
            // `ConnectionManager` would, at 3-4 µs per request): the node is marked
            // suspect, and replaced by a fresh connection before its next request — also
            // when this call does not retry.
            if matches!(&result, Err(e) if e.is_unrecoverable_error()) {
                node.suspect();
            }
            // The first command after the server came back fails on the dead socket, and
            // is retried over a fresh connection; with Sentinel, a failed or demoted
            // primary may have been replaced. Every script is idempotent for its owner (a repeated acquire
            // is recognised, extend and release compare the owner), so one retry is safe.
            // A timeout leaves no time to retry: the next call checks the node first (a
            // fresh connection; with Sentinel, asking the sentinels). Without Sentinel,
            // only a request that had at least half its full time on this connection
            // counts: one cut short (by its caller's wait, or by a reconnection before
            // it) says nothing about the connection.
            let next = match &result {
                _ if retried => None,
                Err(e) if e.is_timeout() => {
                    let long = !budget.is_zero() && budget.saturating_mul(2) >= bound.full;
                    if self.primary.follows_sentinel() || long {
                        node.suspect();
                    }
                    None
                }
                Err(e) if e.is_connection_dropped() || e.is_connection_refusal() => Some(
                    // Without an answer from the sentinels, the same node, as without them.
                    self.primary
                        .rediscover(&node, deadline)
                        .await
                        .unwrap_or_else(|_| node.clone()),
                ),
                Err(e) if e.kind() == redis::ErrorKind::ReadOnly => self
                    .primary
                    .rediscover(&node, deadline)
                    .await
                    .ok()
                    .filter(|next| next.generation != node.generation),
                _ => None,
            };
            match next.filter(|_| !left().is_zero()) {
                Some(next) => (node, retried) = (next, true),
                None => return result.map_err(|e| classify(&self.config, what, e)),
            }
        }
    }

    /// Runs the acquire script once: the lock for `owner` with a fresh fence token, or
    /// the holder's remaining PTTL. The building block of [`DistributedLock::try_acquire`]
    /// and of Redlock's per-node round.
    ///
    /// Like every building block here, it waits at most `limit` in all (reconnecting
    /// included; [`RedisConfig::request_timeout`] is what this client's own calls give
    /// each request, and a reply is never awaited longer than that). A request that had
    /// at least half of `limit` on its connection and got no reply condemns the
    /// connection: the next call first takes a fresh one (see the crate docs,
    /// *Connections*).
    ///
    /// # Cancel safety
    /// If dropped after sending, the lock may be granted to nobody until its TTL.
    pub async fn grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        limit: Duration,
    ) -> Result<Grant, LockError> {
        let keys = std::slice::from_ref(key);
        let (grant, _) = self
            .grant_within(keys, owner, Ask::exclusive(ttl, label), Bound::full(limit))
            .await?;
        Ok(grant)
    }

    /// [`grant`](Self::grant), proposing a count (see [`Proposal`]): with the
    /// clock-floored fence counter, the server takes it when it is at least the
    /// counter's next value, not ahead of the server's clock, and behind it by at most
    /// the proposal's window (capped at
    /// [`PROPOSAL_WINDOW_MAX`](scripts::PROPOSAL_WINDOW_MAX)); else it counts as `grant`
    /// does (a plain counter ignores the proposal). Redlock proposes
    /// one count to every node of a round: nodes that take it name the same token, and a
    /// majority that does needs no fence round.
    ///
    /// # Cancel safety
    /// As [`grant`](Self::grant).
    pub async fn grant_proposing(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        proposal: Proposal,
        limit: Duration,
    ) -> Result<Grant, LockError> {
        let keys = std::slice::from_ref(key);
        let counting = self.counting(Some(proposal));
        let bound = Bound::full(limit);
        let (grant, _) = self
            .run_grant(keys, owner, Ask::exclusive(ttl, label), counting, bound)
            .await?;
        Ok(grant)
    }

    /// [`grant`](Self::grant) without the fence counter: the lock key alone, and a token
    /// whose count is this client's time in µs at the grant. Grants of a key by one
    /// client get increasing tokens while its clock moves forward, but no counter backs
    /// them (a clock step, another client: no order). For Redlock with `fencing=false`,
    /// whose leases promise no fence; it leaves no fence key behind, which is most of the
    /// server's work for a fresh lock name, and a free lock is taken by a plain `SET NX
    /// PX`, without a script.
    ///
    /// # Cancel safety
    /// As [`grant`](Self::grant).
    pub async fn grant_unfenced(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        limit: Duration,
    ) -> Result<Grant, LockError> {
        let keys = std::slice::from_ref(key);
        let counting = Counting::Unfenced(unfenced_count());
        let bound = Bound::full(limit);
        let (grant, _) = self
            .run_grant(keys, owner, Ask::exclusive(ttl, label), counting, bound)
            .await?;
        Ok(grant)
    }

    /// [`grant`](Self::grant) of the first free of `keys` (or the one `owner` already
    /// holds) in `mode`, within `bound`: the grant, and which key it is for (0 when all
    /// are held).
    async fn grant_within(
        &self,
        keys: &[LockKey],
        owner: OwnerId,
        ask: Ask<'_>,
        bound: Bound,
    ) -> Result<(Grant, usize), LockError> {
        let counting = self.counting(None);
        self.run_grant(keys, owner, ask, counting, bound).await
    }

    /// How this client's grants count: with its fence counter (and `proposal`), or, with
    /// `fence=none`, unfenced (this client's clock).
    fn counting(&self, proposal: Option<Proposal>) -> Counting {
        match self.config.fence {
            // A proposal is a fence counter's: without one, this client's clock, as always.
            FenceMode::None => Counting::Unfenced(unfenced_count()),
            mode => Counting::Fence(mode, proposal),
        }
    }

    /// Takes a free lock without a fence counter by `SET lock value NX PX ttl`, the
    /// value written as the acquire script writes it (count `count`): no script runs
    /// for the common case, where the script cost the server 2.7 times as much. The
    /// reply as the acquire script gives it (granted, at index 0), or `None` when the
    /// key exists — held by another, already `owner`'s (a retried acquire), or not a
    /// lock at all: the acquire script then decides.
    ///
    /// # Cancel safety
    /// As [`grant`](Self::grant).
    async fn claim_unfenced(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        label: Option<&str>,
        count: u64,
        bound: Bound,
    ) -> Result<Option<((i64, i64, i64), Result<(), String>)>, LockError> {
        let mut value = owner.hex().to_vec();
        write!(value, ":{count}").expect("writing to a vector cannot fail");
        if let Some(label) = label.filter(|l| !l.is_empty()) {
            value.push(b':');
            value.extend_from_slice(label.as_bytes());
        }
        let mut call = Call::command("SET", 1);
        call.key(self.key_name(key, ""))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl));
        let started = Instant::now();
        let route = Route::Grant(owner);
        let (reply, confirmed) = self.call_confirmed("acquire", call, bound, &route).await?;
        match reply {
            redis::Value::Okay => Ok(Some(((1, count as i64, 0), confirmed))),
            redis::Value::Nil => Ok(None),
            other => {
                // Whatever answered, a grant may stand: given back, as a script's odd
                // reply is.
                let left = bound.limit.saturating_sub(started.elapsed());
                let keys = std::slice::from_ref(key);
                self.release_in_background(keys, owner, Some(left)).await;
                Err(LockError::backend(format!(
                    "SET NX answered {other:?} for `{key}`"
                )))
            }
        }
    }

    /// Runs the acquire script over `keys`, counting as `counting` says, within `bound`:
    /// the grant, and the index in `keys` of the key granted. A single key
    /// without a fence counter is first tried with a plain `SET NX PX`
    /// ([`claim_unfenced`](Self::claim_unfenced)); the script runs only if the key exists,
    /// so a held key costs two round trips there, where the script alone took one.
    async fn run_grant(
        &self,
        keys: &[LockKey],
        owner: OwnerId,
        ask: Ask<'_>,
        counting: Counting,
        bound: Bound,
    ) -> Result<(Grant, usize), LockError> {
        let Ask { ttl, label, mode } = ask;
        let started = Instant::now();
        let left = || bound.limit.saturating_sub(started.elapsed());
        // The count argument (unfenced: the count; clock-floored: a proposal) and, for a
        // proposal, its window in µs.
        let (fence, count, window) = match counting {
            Counting::Unfenced(count) => (None, Some(count), None),
            Counting::Fence(FenceMode::ClockFloored, Some(proposal)) => (
                Some(FenceMode::ClockFloored),
                Some(proposal.count),
                Some(proposal.window.as_micros().min(u128::from(u64::MAX)) as u64),
            ),
            Counting::Fence(mode, _) => (Some(mode), None, None),
        };
        let claimed = match (keys, counting, mode) {
            // Not with wait_replicas: a held key would then pay a WAIT for the SET and
            // another for the script that decides; the script alone waits once.
            ([key], Counting::Unfenced(count), Mode::Exclusive)
                if self.config.wait_replicas == 0 =>
            {
                self.claim_unfenced(key, owner, ttl, label, count, bound)
                    .await
            }
            _ => Ok(None),
        };
        let replied = match claimed {
            Ok(Some(claimed)) => Ok(claimed),
            // The `SET` used the whole wait: the script would be sent and given up at once.
            Ok(None) if left().is_zero() => {
                Err(classify(&self.config, "acquire", timed_out(bound.limit)))
            }
            Ok(None) => {
                let fenced = usize::from(fence.is_some());
                let mut call = match (mode, keys) {
                    (Mode::Shared, [key]) => {
                        let mut call = Call::script(&SCRIPTS.acquire_shared, 3 + fenced);
                        call.key(self.key_name(key, ""))
                            .key(self.key_name(key, READERS))
                            .key(self.key_name(key, WRITER));
                        if fenced == 1 {
                            call.key(self.key_name(key, FENCE));
                        }
                        call
                    }
                    (Mode::Shared, _) => {
                        return Err(LockError::Config(
                            "a reader asks for one key at a time".into(),
                        ))
                    }
                    (Mode::Exclusive, _) => {
                        let mut call = Call::script(&SCRIPTS.acquire, (1 + fenced) * keys.len());
                        for key in keys {
                            call.key(self.key_name(key, ""));
                            if fenced == 1 {
                                call.key(self.key_name(key, FENCE));
                            }
                        }
                        call
                    }
                };
                call.arg(&owner.hex()[..])
                    .arg(millis(ttl))
                    .arg(fence.map_or("none", FenceMode::as_str));
                if label.is_some() || count.is_some() {
                    call.arg(label.unwrap_or(""));
                }
                if let Some(count) = count {
                    call.arg(count);
                }
                if let Some(window) = window {
                    call.arg(window);
                }
                let route = Route::Grant(owner);
                self.call_confirmed("acquire", call, bound.within(left()), &route)
                    .await
            }
            Err(e) => Err(e),
        };
        let ((granted, value, index), confirmed): ((i64, i64, i64), _) = match replied {
            Ok(replied) => replied,
            Err(e) if self.config.wait_replicas > 0 => {
                // The script may have granted before WAIT failed (a pipeline reports its
                // first error): give that grant back rather than leave it to its TTL.
                self.release_in_background(keys, owner, Some(left())).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if granted != 1 {
            // PTTL -1: a key with no expiry (another recipe's lock without a timeout).
            let pttl = u64::try_from(value).map_or(Duration::MAX, Duration::from_millis);
            // Index -2: readers hold (one of) the keys.
            return Ok(match index {
                -2 => (Grant::ReadHeld(pttl), 0),
                _ => (Grant::Held(pttl), 0),
            });
        }
        let Some(index) = usize::try_from(index).ok().filter(|&i| i < keys.len()) else {
            self.release_in_background(keys, owner, Some(left())).await;
            return Err(LockError::backend(format!(
                "acquire script granted lock {index} of {}",
                keys.len()
            )));
        };
        let granted = std::slice::from_ref(&keys[index]);
        if let Err(why) = confirmed {
            // Too few replicas have it: a failover could lose it. Given back, not held,
            // waiting for the release no longer than the call's own limit.
            let released = match self
                .release_in_background(granted, owner, Some(left()))
                .await
            {
                Some(Ok(_)) => "released".to_owned(),
                Some(Err(e)) => format!("its release failed ({e}); it expires within its TTL"),
                None => "its release is under way".to_owned(),
            };
            return Err(LockError::Unavailable {
                message: format!("{why}: grant refused and {released}"),
                source: None,
            });
        }
        let count = u64::try_from(value)
            .map_err(|_| LockError::backend(format!("server returned fence {value}")))?;
        Ok((token_for(count, owner).map(Grant::Granted)?, index))
    }

    /// Pushes the expiry of `owner`'s lock to `ttl`; `false` if it is not `owner`'s. A
    /// clock-floored fence key is kept alive at least as long (see [`FenceMode`]).
    ///
    /// # Cancel safety
    /// The server may or may not have applied the extension.
    pub async fn extend_owner(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.extend_grant(key, owner, ttl, Mode::Exclusive, limit)
            .await
    }

    /// [`extend_owner`](Self::extend_owner) of a grant in `mode`: a reader's record is
    /// extended by [`EXTEND_SHARED`](scripts::EXTEND_SHARED).
    ///
    /// # Cancel safety
    /// As [`extend_owner`](Self::extend_owner).
    async fn extend_grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        mode: Mode,
        limit: Duration,
    ) -> Result<bool, LockError> {
        // Without a fence counter, no fence key to keep alive.
        let fenced = usize::from(self.config.fence != FenceMode::None);
        let mut call = match mode {
            Mode::Exclusive => Call::script(&SCRIPTS.extend, 1 + fenced),
            Mode::Shared => Call::script(&SCRIPTS.extend_shared, 2 + fenced),
        };
        call.key(self.key_name(key, ""));
        if mode == Mode::Shared {
            call.key(self.key_name(key, READERS));
        }
        if fenced == 1 {
            call.key(self.key_name(key, FENCE));
        }
        call.arg(&owner.hex()[..]).arg(millis(ttl));
        let (extended, confirmed) = self
            .call_confirmed::<i64>("extend", call, Bound::full(limit), &Route::Current)
            .await?;
        if extended != 1 {
            return Ok(false);
        }
        confirmed.map_err(|why| LockError::Unavailable {
            message: format!("{why}: the extension does not count"),
            source: None,
        })?;
        Ok(true)
    }

    /// Deletes `owner`'s lock and announces it on the key's release channel (waking the
    /// waiters; if the server refuses the message, e.g. an ACL without the channel, the
    /// lock is still released and its waiters poll); `false` if it is not `owner`'s.
    ///
    /// # Cancel safety
    /// The server may or may not have released the lock.
    pub async fn release_owner(
        &self,
        key: &LockKey,
        owner: OwnerId,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.delete_owner(key, owner, true, limit).await
    }

    /// Deletes `owner`'s lock without announcing it: for a grant nobody was told about
    /// (Redlock's failed round), whose removal is no release worth waking waiters for.
    ///
    /// # Cancel safety
    /// As [`release_owner`](Self::release_owner).
    pub async fn withdraw_owner(
        &self,
        key: &LockKey,
        owner: OwnerId,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.delete_owner(key, owner, false, limit).await
    }

    async fn delete_owner(
        &self,
        key: &LockKey,
        owner: OwnerId,
        announce: bool,
        limit: Duration,
    ) -> Result<bool, LockError> {
        // On a Redis Cluster, a shard channel: a PUBLISH would go to every node.
        let sharded = if self.is_cluster() { "sharded" } else { "" };
        // The readers' records too: an owner's grant is ended wherever it is, so every
        // clean-up (which knows the owner, not the grant) ends a reader's as a writer's.
        let mut call = Call::script(&SCRIPTS.release, 2);
        call.key(self.key_name(key, ""))
            .key(self.key_name(key, READERS))
            .arg(&owner.hex()[..]);
        if announce {
            call.arg_fmt(self.key_name(key, RELEASED));
        } else {
            call.arg("");
        }
        call.arg(sharded);
        // 2: released, but the server refused the message (its waiters poll).
        let bound = Bound::full(limit);
        let behind = self.unanswered.behind(owner);
        if behind.is_empty() {
            let (released, _) = self
                .run_script::<i64>("release", &call, bound, 0, &Route::Current)
                .await?;
            return Ok(matches!(released, 1 | 2));
        }
        // Behind every grant request of this owner still in flight, and over the current
        // connection too (a noted one may be dead, or no longer the primary's): the owner
        // is never granted again, so a repeated release is harmless. Once per connection:
        // where the current one is a noted one (no fresh one yet), a second release there
        // would only add a request to a connection that may owe replies — one that a
        // middlebox dropped — and answers are matched to requests in order.
        let deadline = Instant::now() + limit.min(LIMIT_MAX);
        let current = self.primary.node_for_call(deadline).await;
        let mut nodes = behind;
        if !nodes.iter().any(|node| Arc::ptr_eq(node, &current)) {
            nodes.push(current);
        }
        let routes: Vec<Route> = nodes.into_iter().map(Route::Behind).collect();
        let sends = routes
            .iter()
            .map(|route| self.run_script::<i64>("release", &call, bound, 0, route));
        let outcomes = futures::future::join_all(sends).await;
        self.unanswered.forget(owner);
        let mut released = None;
        for outcome in outcomes {
            released = match (outcome, released) {
                (Ok((1 | 2, _)), _) | (_, Some(Ok(true))) => Some(Ok(true)),
                (Ok(_), _) | (Err(_), Some(Ok(false))) => Some(Ok(false)),
                (Err(e), _) => Some(Err(e)),
            };
        }
        released.unwrap_or(Ok(false))
    }

    /// Raises the key's fence counter to at least `token`'s count (see
    /// [`scripts::token_for`]) and records it in the lock
    /// if it is still `owner`'s (the write round of Redlock's quorum max-register).
    /// Returns whether the lock is still `owner`'s. In clock-floored mode the fence key
    /// keeps (or gets) its expiry; with `fence=counter` it is persistent (see
    /// [`FenceMode`]).
    ///
    /// # Cancel safety
    /// The server may or may not have applied the write; it only ever raises the fence.
    pub async fn raise_fence(
        &self,
        key: &LockKey,
        owner: OwnerId,
        token: FencingToken,
        limit: Duration,
    ) -> Result<bool, LockError> {
        if self.config.fence == FenceMode::None {
            return Err(LockError::Config(
                "fence=none keeps no fence counter to raise (Redlock: fencing=false)".into(),
            ));
        }
        let mut call = Call::script(&SCRIPTS.raise_fence, 2);
        call.key(self.key_name(key, ""))
            .key(self.key_name(key, FENCE))
            .arg(&owner.hex()[..])
            .arg(count_of(token))
            .arg(self.config.fence.as_str());
        let (ours, confirmed) = self
            .call_confirmed::<i64>("raise fence", call, Bound::full(limit), &Route::Current)
            .await?;
        confirmed.map_err(|message| LockError::Unavailable {
            message,
            source: None,
        })?;
        Ok(ours == 1)
    }

    /// One run of the acquire script for `owner`, within `bound`.
    ///
    /// A grant whose reply arrives after the lease's own deadline is refused: it is
    /// released (owner-checked, in a task of its own bounded by the request timeout) and
    /// reported as [`Attempt::Late`]. `release_wait` bounds how long to wait for that
    /// release (`None`: until it is done); past it, the release carries on in the
    /// background.
    async fn attempt(
        &self,
        keys: &[LockKey],
        owner: OwnerId,
        ask: Ask<'_>,
        bound: Bound,
        release_wait: Option<Duration>,
    ) -> Result<Attempt, LockError> {
        let ttl = ask.ttl;
        let sent = Instant::now();
        let in_flight = InFlight {
            lock: self,
            keys,
            owner,
        };
        let granted = self.grant_within(keys, owner, ask, bound).await;
        std::mem::forget(in_flight);
        let (token, key) = match granted? {
            (Grant::Held(pttl), _) => {
                return Ok(Attempt::Held {
                    pttl,
                    readers: false,
                })
            }
            (Grant::ReadHeld(pttl), _) => {
                return Ok(Attempt::Held {
                    pttl,
                    readers: true,
                })
            }
            (Grant::Granted(token), index) => (token, &keys[index]),
        };
        let mut lease = Lease::new(key.clone(), owner, token, sent, ttl, default_drift(ttl))
            .with_handle(LeaseHandle {
                path: self.lock_key(key),
                ..LeaseHandle::default()
            });
        if ask.mode == Mode::Shared {
            lease = lease.into_shared();
        }
        let replied = Instant::now();
        if replied < lease.valid_until() {
            return Ok(Attempt::Granted(lease));
        }
        // The reply came after the lease's own deadline (sent + ttl − drift): the lock may
        // already be free on the server, or be for a while yet, but it is no lease we can
        // use. Give it back (owner-checked) so that nobody waits for it, and report it.
        let granted = std::slice::from_ref(key);
        let released = self
            .release_in_background(granted, owner, release_wait)
            .await;
        let released = match released {
            Some(Ok(_)) => "it was released".to_owned(),
            Some(Err(e)) => format!("releasing it failed ({e}); it expires within its TTL"),
            None => "its release is still under way".to_owned(),
        };
        let error = LockError::Unavailable {
            message: format!(
                "acquire on {}: the reply arrived {:?} after sending, past the lease deadline \
                 (ttl {ttl:?} minus drift): grant refused and {released}",
                self.config.endpoint(),
                replied - sent,
            ),
            source: None,
        };
        Ok(Attempt::Late(error))
    }

    /// One attempt at the first free of `keys` with a fresh owner id, as
    /// [`DistributedLock::try_acquire`] (with the grant's label and mode), releasing a
    /// grant whose reply was lost.
    async fn try_once(&self, keys: &[LockKey], ask: Ask<'_>) -> Result<Option<Lease>, LockError> {
        let owner = OwnerId::random();
        let bound = Bound::full(self.config.request_timeout);
        match self.attempt(keys, owner, ask, bound, None).await {
            Ok(Attempt::Granted(lease)) => Ok(Some(lease)),
            Ok(Attempt::Held { .. }) => Ok(None),
            Ok(Attempt::Late(error)) => Err(error),
            Err(e) => {
                if e.is_retryable() {
                    // The script may have run without its reply reaching us: free what
                    // may be a grant to an owner nobody will ever use (behind it).
                    self.release_detached(keys, owner);
                }
                Err(e)
            }
        }
    }

    /// Releases `owner`'s locks of `keys` (owner-checked) in a task of its own, from a
    /// `Drop`: without a runtime to run it (dropped outside one), the TTL frees the lock.
    fn release_detached(&self, keys: &[LockKey], owner: OwnerId) {
        if tokio::runtime::Handle::try_current().is_ok() {
            let (lock, keys) = (self.clone(), keys.to_vec());
            tokio::spawn(async move { lock.release_each(&keys, owner).await });
        }
    }

    /// Releases `owner`'s lock of each of `keys`, all at once (pipelined on the one
    /// connection): whether one was released, or the first error.
    async fn release_each(&self, keys: &[LockKey], owner: OwnerId) -> Result<bool, LockError> {
        let limit = self.config.request_timeout;
        let releases = keys.iter().map(|key| self.release_owner(key, owner, limit));
        let mut released = Ok(false);
        for outcome in futures::future::join_all(releases).await {
            match (outcome, &mut released) {
                (Ok(true), Ok(any)) => *any = true,
                (Err(e), Ok(_)) => released = Err(e),
                _ => {}
            }
        }
        released
    }

    /// Releases `owner`'s locks of `keys` in a task of its own (each bounded by the
    /// request timeout, and running to its end even if the caller goes away), waiting up
    /// to `wait` for the outcome (`None`: until it is done). `None` if it has not finished
    /// by then.
    async fn release_in_background(
        &self,
        keys: &[LockKey],
        owner: OwnerId,
        wait: Option<Duration>,
    ) -> Option<Result<bool, LockError>> {
        let (this, keys) = (self.clone(), keys.to_vec());
        let task = tokio::spawn(async move { this.release_each(&keys, owner).await });
        let joined = match wait {
            None => Some(task.await),
            Some(wait) => tokio::time::timeout(wait, task).await.ok(),
        };
        joined.map(|r| r.unwrap_or_else(|e| Err(LockError::backend(format!("release task: {e}")))))
    }

    /// [`DistributedLock::acquire`] of the first free of `keys` (see
    /// [`DistributedLock::acquire_any`]): each attempt is one script call over all of
    /// them, and a wait subscribes to each key's release channel.
    async fn acquire_keys(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
        mode: Mode,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let started = Instant::now();
        let request_timeout = self.config.request_timeout;
        let ask = Ask {
            ttl: opts.ttl,
            label: opts.label.as_deref(),
            mode,
        };
        if opts.wait.is_zero() {
            return match self.try_once(keys, ask).await? {
                Some(lease) => Ok(lease),
                None => Err(LockError::Timeout {
                    waited: started.elapsed(),
                }),
            };
        }
        let deadline = opts.wait_deadline(started);
        let left = || deadline.saturating_duration_since(Instant::now());
        let mut pubsub = None;
        // A subscription refused for good (e.g. an ACL without SUBSCRIBE): poll instead.
        let mut subscribe_refused = false;
        let mut failures = 0u32;
        let mut polls = 0u32;
        // Why the lock is not ours yet, if not "held by another".
        let mut why: Option<LockError> = None;
        let mut attempts = 0u32;
        // A writer's mark while readers hold its key, taken back when this call ends.
        let mut mark: Option<WriterMark> = None;
        loop {
            let limit = left().min(request_timeout);
            if limit.is_zero() {
                break;
            }
            attempts += 1;
            let sent = Instant::now();
            let bound = Bound::full(request_timeout).within(limit);
            // An owner id of its own per attempt: a request of an earlier attempt that
            // lands late, or its clean-up, cannot act on this attempt's grant.
            let owner = OwnerId::random();
            let attempt = self.attempt(keys, owner, ask, bound, Some(limit));
            let retry_in = match attempt.await {
                Ok(Attempt::Granted(lease)) => return Ok(lease),
                Ok(Attempt::Held { pttl, readers }) => {
                    failures = 0;
                    why = None;
                    // Readers hold the key: a writer marks itself, so that no further
                    // reader is granted before it, and renews its mark at every try
                    // from then on (also behind another writer, until it is granted),
                    // trying again before the mark runs out. Not over several keys.
                    let marks = match (mode, keys) {
                        (Mode::Exclusive, [key]) if readers || mark.is_some() => Some(key),
                        _ => None,
                    };
                    if let Some(key) = marks {
                        let mark = mark.get_or_insert_with(|| WriterMark::new(self, key));
                        mark.renew(Bound::full(request_timeout).within(left()))
                            .await;
                    }
                    let pttl = match marks {
                        Some(_) => pttl.min(RELEASE_RECHECK),
                        None => pttl,
                    };
                    // Held: subscribe to its release, then try again at once, as it may
                    // have been released before the subscription took effect. A failed
                    // subscription is kept as the reason should the wait run out on it,
                    // and the wait goes on by polling.
                    if pubsub.is_none() && !subscribe_refused && !left().is_zero() {
                        match self.subscribe_each(keys, left()).await {
                            Ok(sub) => {
                                pubsub = Some(sub);
                                continue;
                            }
                            Err(e) => {
                                subscribe_refused = !e.is_retryable();
                                why = Some(e);
                            }
                        }
                    }
                    let pttl = pttl.max(Duration::from_millis(1));
                    if pubsub.is_none() {
                        polls += 1;
                        pttl.min(opts.backoff.delay(polls))
                    } else {
                        pttl.min(opts.backoff.max.max(RELEASE_RECHECK))
                    }
                }
                Ok(Attempt::Late(error)) => {
                    failures += 1;
                    why = Some(error);
                    opts.backoff.delay(failures)
                }
                Err(e) if e.is_retryable() => {
                    failures += 1;
                    // The script may have run without its reply reaching us: the grant
                    // it may have made is released behind it, now (its owner id is
                    // never used again).
                    self.release_detached(keys, owner);
                    pubsub = None;
                    // An attempt the end of the wait cut off before its own timeout says
                    // nothing new (e.g. while `WAIT` waited): what came before stands.
                    let cut_off = limit < request_timeout && sent.elapsed() >= limit;
                    if !cut_off || attempts == 1 {
                        why = Some(e);
                    }
                    opts.backoff.delay(failures)
                }
                Err(e) => return Err(e),
            };
            let wait = retry_in.min(left());
            if wait.is_zero() {
                break;
            }
            let sleep = tokio::time::sleep(wait);
            match pubsub.as_mut() {
                Some(watches) => {
                    tokio::select! {
                        released = any_released(watches) => if !released {
                            pubsub = None; // connection lost: resubscribe next round
                        },
                        _ = sleep => {}
                    }
                }
                None => sleep.await,
            }
        }
        Err(why.unwrap_or(LockError::Timeout {
            waited: started.elapsed(),
        }))
    }

    /// [`subscribe_releases`](Self::subscribe_releases) to each of `keys`, all within
    /// `limit`: every subscription, or the first error.
    ///
    /// # Cancel safety
    /// Cancel-safe, as each subscription.
    async fn subscribe_each(
        &self,
        keys: &[LockKey],
        limit: Duration,
    ) -> Result<Vec<ReleaseWatch>, LockError> {
        futures::future::try_join_all(keys.iter().map(|key| self.subscribe_releases(key, limit)))
            .await
    }

    /// Subscribes to `key`'s release channel, waiting at most `limit` in all (connect and
    /// `SUBSCRIBE` — `SSUBSCRIBE` on a cluster —, each also bounded by its own timeout):
    /// a message arrives each time a holder of `key` releases it on this server
    /// ([`release_owner`](Self::release_owner)).
    /// The subscription is on the client's one subscriber connection, shared by all its
    /// waiters and opened by the first (again after it closed). A refused subscription
    /// (e.g. an ACL without `SUBSCRIBE`) is an error, not a silent subscription that
    /// never hears anything.
    ///
    /// # Cancel safety
    /// Cancel-safe: a subscription confirmed after the future was dropped is left again.
    pub async fn subscribe_releases(
        &self,
        key: &LockKey,
        limit: Duration,
    ) -> Result<ReleaseWatch, LockError> {
        let deadline = Instant::now() + limit;
        let left = || deadline.saturating_duration_since(Instant::now());
        let what = "subscribe";
        let subscriber = {
            let mut current = bounded(left(), async { Ok(self.subscriber.lock().await) })
                .await
                .map_err(|e| classify(&self.config, what, e))?;
            // On the current primary: after a switch, a new subscriber there.
            let node = self.primary.node();
            match current.as_ref() {
                Some((open, on)) if open.is_open() && *on == node.generation => open.clone(),
                _ => {
                    let link = self.subscriber_link(&node, left()).await?;
                    let opened = Subscriber::start(link, self.config.request_timeout);
                    *current = Some((opened.clone(), node.generation));
                    opened
                }
            }
        };
        let channel = self.key_name(key, RELEASED).to_string();
        let limit = self.config.request_timeout.min(left());
        subscriber
            .watch(channel.clone(), limit)
            .await
            .map_err(|refused| match refused {
                Refused::Redis(e) => classify(&self.config, what, e),
                Refused::TimedOut(limit) => LockError::Unavailable {
                    message: format!(
                        "subscribe on {}: no answer to SUBSCRIBE {channel} within {limit:?}",
                        self.config.endpoint()
                    ),
                    source: None,
                },
                Refused::Closed => LockError::Unavailable {
                    message: format!(
                        "subscribe on {}: the subscriber connection closed",
                        self.config.endpoint()
                    ),
                    source: None,
                },
                Refused::NotSubscribed(answer) => LockError::Backend {
                    message: format!(
                        "subscribe on {}: the subscription to {channel} did not take \
                         ({answer}); is SUBSCRIBE allowed for this user?",
                        self.config.endpoint()
                    ),
                    source: None,
                },
            })
    }

    /// A new subscriber connection, to `node` or to the Redis Cluster, within `left`
    /// and the connect timeout (twice that for a cluster: a connection to every node,
    /// after the slot map, as at [`connect`](Self::connect)).
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is left behind.
    async fn subscriber_link(
        &self,
        node: &primary::Node,
        left: Duration,
    ) -> Result<Link, LockError> {
        let failed = |e| classify(&self.config, "subscribe", e);
        let Some(client) = &node.client else {
            let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
            let client = self.config.cluster_client(Some(pushes))?;
            let limit = self.config.connect_timeout.saturating_mul(2).min(left);
            let conn = bounded(limit, client.get_async_connection())
                .await
                .map_err(failed)?;
            return Ok(Link::cluster(conn, received));
        };
        let pubsub = bounded(
            self.config.connect_timeout.min(left),
            client.get_async_pubsub(),
        )
        .await
        .map_err(failed)?;
        let (sink, stream) = pubsub.split();
        Ok(Link::Node {
            sink,
            stream,
            // RESP3 answers PING the same way subscribed or not: SUBSCRIBE is trusted
            // there.
            ping_check: client.get_connection_info().redis.protocol
                == redis::ProtocolVersion::RESP2,
        })
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    /// One run of the acquire script. A grant whose reply arrives after the lease's own
    /// deadline (sent + ttl − drift) is refused: the lock is released (owner-checked) and
    /// the result is [`LockError::Unavailable`] — not `Ok(None)`, as nobody else holds it.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropped while the script is in flight, it releases that owner's
    /// possible grant in the background (owner-checked, behind the script on the same
    /// connection, also after a timeout: see the crate docs, *Stale requests*), as it
    /// does when the call fails without knowing whether the script ran (a timeout, a
    /// dropped connection).
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.try_once(std::slice::from_ref(key), Ask::exclusive(ttl, None))
            .await
    }

    /// Tries; while the lock is held, subscribes to the key's release channel (then tries
    /// again at once, in case the release came first) and retries on each release
    /// message, or when the holder's PTTL runs out, until `opts.wait` has passed. An
    /// uncontended acquire is one script call. Each attempt has an owner id of its own:
    /// an attempt that failed without knowing whether the script ran has its possible
    /// grant released at once, behind it on its connection, and no later attempt can be
    /// touched by that release or by the late request.
    ///
    /// Every step (subscribing, each script call, reconnecting) is bounded by what is
    /// left of the wait as well as by its own timeout, so the call returns within
    /// `opts.wait` plus scheduling slack. A zero wait makes exactly one attempt, bounded
    /// by the request timeout (like [`try_acquire`](DistributedLock::try_acquire)), so a
    /// wait shorter than a round trip to the server ends in `Unavailable`.
    ///
    /// A failed subscription falls back to polling (with `opts.backoff`, never slower
    /// than the holder's PTTL). The result when the wait runs out tells what was last
    /// seen: [`LockError::Timeout`] if the last attempt found the lock held by another,
    /// otherwise the error of the last step — [`LockError::Unavailable`] when the server
    /// did not answer in time, be it to the subscription or to an attempt. A last attempt
    /// that the end of the wait cut off before its own timeout adds nothing: the answer
    /// before it stands (e.g. `wait_replicas`'s refusal, not "no reply within 94ms").
    /// Non-retryable errors ([`LockError::Config`], [`LockError::Backend`]) end the call
    /// at once.
    ///
    /// # Cancel safety
    /// Cancel-safe: the subscription is dropped with the future, and a grant that an
    /// attempt may have left (dropped in flight, or failed without knowing whether the
    /// script ran) is released in the background — also when the call gives up on it.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.acquire_keys(std::slice::from_ref(key), opts, Mode::Exclusive)
            .await
    }

    /// A reader, as [`acquire`](DistributedLock::acquire) waits and cleans up: granted
    /// while no writer holds the key and none waits for it. Readers' records sit beside
    /// the lock key, which holds the mark `readers` while any reader's lease lasts (so
    /// writers and other recipes' clients see the key held); a writer that waits while
    /// readers hold marks itself, and later readers wait for it (see the crate docs,
    /// *Readers*).
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire).
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        self.acquire_keys(std::slice::from_ref(key), opts, Mode::Shared)
            .await
    }

    /// Never shortens the key's expiry: a `ttl` below what the key has left leaves the
    /// server's expiry as it is (the lease's own deadline still moves to now + `ttl`),
    /// so an extension that lands late, after a longer one, cannot cut the lease short.
    /// An extension whose reply arrives after the deadline it would set does not count:
    /// [`LockError::Unavailable`], and `lease` keeps its old deadline.
    ///
    /// # Cancel safety
    /// The server may have applied the extension; `lease` is unchanged.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        let limit = self.config.request_timeout;
        let mode = match lease.is_shared() {
            true => Mode::Shared,
            false => Mode::Exclusive,
        };
        let extended = self
            .extend_grant(lease.key(), lease.owner(), ttl, mode, limit)
            .await?;
        if !extended {
            return Err(LockError::lost(format!(
                "`{}` is no longer held by {} (expired or taken over)",
                lease.key(),
                lease.owner()
            )));
        }
        let drift = default_drift(ttl);
        let replied = sent.elapsed();
        if Instant::now() >= tenure_api::backend::deadline(sent, ttl, drift) {
            return Err(LockError::Unavailable {
                message: format!(
                    "extend on {}: the reply arrived {replied:?} after sending, past the new \
                     deadline (ttl {ttl:?} minus drift): the extension does not count",
                    self.config.endpoint()
                ),
                source: None,
            });
        }
        lease.renewed(sent, ttl, drift);
        Ok(())
    }

    /// # Cancel safety
    /// If dropped, the lock may stay held until its TTL.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let limit = self.config.request_timeout;
        let released = self
            .release_owner(lease.key(), lease.owner(), limit)
            .await?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let mut call = Call::script(&SCRIPTS.inspect, 2);
        call.key(self.key_name(key, ""))
            .key(self.key_name(key, READERS));
        let (value, pttl): (Option<String>, i64) = self.call("inspect", call).await?;
        // PTTL -1 (no expiry) is reported as no remaining time.
        Ok(value.map(|value| holder_of(&self.lock_key(key), &value, pttl)))
    }

    /// Every key's holder in one script call; on a Redis Cluster, where the keys sit in
    /// different slots, one call per key, concurrently.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect_each(&self, keys: &[LockKey]) -> Result<Vec<Option<HolderInfo>>, LockError> {
        if self.is_cluster() || keys.len() < 2 {
            return tenure_api::backend::inspect_concurrently(self, keys).await;
        }
        let mut call = Call::script(&SCRIPTS.inspect, 2 * keys.len());
        for key in keys {
            call.key(self.key_name(key, ""))
                .key(self.key_name(key, READERS));
        }
        let read: Vec<(Option<String>, i64)> = self.call("inspect", call).await?;
        if read.len() != keys.len() {
            return Err(LockError::Backend {
                message: format!("inspect read {} of {} keys", read.len(), keys.len()),
                source: None,
            });
        }
        Ok(keys
            .iter()
            .zip(read)
            .map(|(key, (value, pttl))| value.map(|v| holder_of(&self.lock_key(key), &v, pttl)))
            .collect())
    }

    /// As [`acquire`](DistributedLock::acquire), over several keys: each attempt is one
    /// script call that takes the first free key (or the one the attempt's owner id
    /// already holds, when a reconnection retried it), and a wait subscribes to every key's release channel
    /// and tries again on any release. On a Redis Cluster, where the keys sit in
    /// different slots, they are tried one by one ([`tenure_api::backend::acquire_each`]).
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire): a grant an attempt may have left is
    /// released (owner-checked) on every key.
    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        if self.is_cluster() {
            // A Redis Cluster: the keys sit in different hash slots, so no one script
            // can see them all.
            return tenure_api::backend::acquire_each(self, keys, opts).await;
        }
        self.acquire_keys(validate_keys(keys)?, opts, Mode::Exclusive)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "redis",
            fencing: match self.config.fence {
                FenceMode::ClockFloored => FencingKind::ClockFlooredCounter,
                FenceMode::Counter => FencingKind::SingleNodeCounter,
                FenceMode::None => FencingKind::None,
            },
            expiry: ExpiryKind::ServerTtl,
            replication: Replication::SingleNode,
            wait: WaitKind::Push,
            fairness: Fairness::None,
            failures_tolerated: 0,
            clock_dependent: true,
            labels: true,
            shared: true,
        }
    }
}

/// Waits for a release message on any of `watches`: `false` when the subscriber
/// connection is gone.
///
/// # Cancel safety
/// Cancel-safe, as [`ReleaseWatch::released`].
async fn any_released(watches: &mut [ReleaseWatch]) -> bool {
    let waits = watches.iter_mut().map(|watch| Box::pin(watch.released()));
    futures::future::select_all(waits).await.0
}

/// Sends `call`, followed by `WAIT replicas wait` in the same pipeline when
/// `replicas` > 0 (its answer is the second value). A server that does not have the
/// script yet gets it loaded, then the whole pipeline again.
async fn send<T: redis::FromRedisValue>(
    call: &Call,
    replicas: u32,
    wait: Duration,
    conn: &mut Conn,
) -> redis::RedisResult<(T, Option<i64>)> {
    if replicas == 0 {
        let sent = match (call.cmd().query_async(conn).await, call.loadable()) {
            (Err(e), Some(script)) if e.kind() == redis::ErrorKind::NoScriptError => {
                script.load_async(conn).await?;
                call.cmd().query_async(conn).await
            }
            (other, _) => other,
        };
        return sent.map(|v| (v, None));
    }
    // Boxed: the pipeline's future would otherwise enlarge every call's, confirmed or not.
    Box::pin(send_confirmed(call, replicas, wait, conn)).await
}

/// [`send`] with `WAIT`.
async fn send_confirmed<T: redis::FromRedisValue>(
    call: &Call,
    replicas: u32,
    wait: Duration,
    conn: &mut Conn,
) -> redis::RedisResult<(T, Option<i64>)> {
    let mut pipe = redis::pipe();
    pipe.add_command(call.cmd().clone())
        .cmd("WAIT")
        .arg(replicas)
        .arg(millis(wait));
    let sent = match (pipe.query_async::<(T, i64)>(conn).await, call.loadable()) {
        (Err(e), Some(script)) if e.kind() == redis::ErrorKind::NoScriptError => {
            script.load_async(conn).await?;
            pipe.query_async(conn).await
        }
        (other, _) => other,
    };
    sent.map(|(value, confirmed)| (value, Some(confirmed)))
}

/// How long a call may take: at most `limit` in all (reconnect and retry included), of
/// the `full` time such a call has when nothing cuts it short (the request timeout, or
/// the bound a caller such as Redlock gives a node's request). Only a request that had
/// at least half of `full` and got no reply condemns its connection (see
/// [`RedisLock::run_script`]).
#[derive(Clone, Copy, Debug)]
struct Bound {
    limit: Duration,
    full: Duration,
}

impl Bound {
    /// A call with its full time.
    fn full(limit: Duration) -> Self {
        Self { limit, full: limit }
    }

    /// The same call, cut to at most `limit`.
    fn within(self, limit: Duration) -> Self {
        Self {
            limit: self.limit.min(limit),
            full: self.full,
        }
    }
}

/// Where a call goes (see [`RedisLock::run_script`]).
enum Route {
    /// Over the current connection.
    Current,
    /// A grant request of this owner, over the current connection, noted there until a
    /// reply arrives on it (see [`unanswered`]).
    Grant(OwnerId),
    /// Over this connection, behind an unanswered grant request.
    Behind(Arc<primary::Node>),
}

/// Whether a call that failed so may still reach the server: no reply came (a timeout,
/// a connection lost with the request on it).
fn unanswered(error: &redis::RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || (error.is_io_error() && !error.is_connection_refusal())
}

/// How [`RedisLock::run_grant`] counts a grant.
#[derive(Clone, Copy, Debug)]
enum Counting {
    /// No fence counter: this count, unbacked (see [`RedisLock::grant_unfenced`]).
    Unfenced(u64),
    /// The fence counter of this kind, with a proposed count and its window (see
    /// [`RedisLock::grant_proposing`]).
    Fence(FenceMode, Option<Proposal>),
}

/// A fence count proposed with a grant (see [`RedisLock::grant_proposing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// The count: µs since the epoch, on the proposer's clock.
    pub count: u64,
    /// How far behind the server's clock the count may be and still be taken.
    pub window: Duration,
}

/// The count of an unfenced grant: this client's time in µs, within `1..=MAX_COUNT`.
fn unfenced_count() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).map_or(MAX_COUNT, |c| c.clamp(1, MAX_COUNT))
}

fn millis(ttl: Duration) -> u64 {
    ttl.as_millis().try_into().unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15, defect 7: `connect_timeout * 2` overflowed (a panic) for a timeout set
    /// directly on the public field; it is now a `Config` error before any connection.
    #[tokio::test]
    async fn an_enormous_timeout_is_a_config_error_not_a_panic() {
        let mut config = RedisConfig::from_url("redis://127.0.0.1:1").unwrap();
        config.connect_timeout = Duration::MAX;
        let error = RedisLock::with_config(config).await.unwrap_err();
        assert!(matches!(error, LockError::Config(_)), "{error}");
    }
}
