//! # tenure-redis
//!
//! A [`DistributedLock`] on one Redis server. Acquire is one Lua script: take the key
//! with `PX ttl` if free and advance a per-key fence counter in the same hash slot (the
//! counter has no TTL), returning the token — or the remaining PTTL when held. Release is
//! a compare-and-delete that `PUBLISH`es on the key's channel; waiters subscribe and
//! retry on a message, falling back to the holder's PTTL. Extend is a
//! compare-and-`PEXPIRE`.
//!
//! **Guarantees** ([`RedisLock::capabilities`]): a single node with server-TTL expiry.
//! Safety depends on the server's clock (a jump forward expires locks early) and on the
//! node keeping its data: a restart without persistence, or a failover to an async
//! replica, can grant the lock twice. By default the fence counter never falls below the
//! server's clock in µs ([`FenceMode::ClockFloored`]), so the second holder gets a larger
//! token and a fenced store turns the stale holder away; with `fence=counter` (a plain
//! `INCR`) the counter regresses with the data and fencing cannot tell the two holders
//! apart. The conformance suite demonstrates each of these; use the fencing token.
//!
//! **Late replies.** Like Redlock, a grant whose reply arrives after the lease's own
//! deadline (`sent + ttl − drift`, measured from sending) is never handed out: the lock
//! is released (owner-checked) and the attempt fails with [`LockError::Unavailable`],
//! which [`acquire`](DistributedLock::acquire) retries within its wait.
//!
//! **Errors.** A server that cannot serve us *now* is [`LockError::Unavailable`]
//! (retryable, and waited out by [`acquire`](DistributedLock::acquire) within its wait):
//! I/O errors and timeouts, and the replies `LOADING`, `MASTERDOWN`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `READONLY` (a replica — e.g. a former primary after a failover) and
//! `BUSY` (a long-running script). An authentication failure (`NOAUTH`, `WRONGPASS`, the
//! client's failed `AUTH`), an ACL refusal (`NOPERM`) or a bad client setting is
//! [`LockError::Config`] and never retried. Any other server error is
//! [`LockError::Backend`]. Messages carry the server's error code in brackets, never a
//! password.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_api::LockError> {
//! use std::time::Duration;
//! use tenure_api::{DistributedLock, LockKey};
//! let lock = tenure_redis::RedisLock::connect("redis://127.0.0.1:6379/0?prefix=app:").await?;
//! let lease = lock.try_acquire(&LockKey::new("job")?, Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admin;
mod config;
pub mod scripts;

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisError;
use tenure_api::{
    default_drift, validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind,
    Fairness, FencingKind, FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey,
    OwnerId, ReleaseOutcome, Replication, WaitKind,
};

pub use config::{redact, FenceMode, RedisConfig};
use scripts::{parse_lock_value, SCRIPTS};

/// A lock service on one Redis server. Cheap to share (`Arc`); all calls multiplex over
/// one auto-reconnecting connection.
#[derive(Clone)]
pub struct RedisLock {
    config: RedisConfig,
    client: redis::Client,
    conn: ConnectionManager,
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
    /// Another owner holds it for this much longer.
    Held(Duration),
}

/// What one acquire attempt found.
enum Attempt {
    Granted(Lease),
    Held { pttl: Duration },
}

impl RedisLock {
    /// Connects to the server named by a `redis://` or `rediss://` URL (see
    /// [`RedisConfig`]).
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
        let client = redis::Client::open(config.client_url())
            .map_err(|e| LockError::Config(format!("{config}: {e}")))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(config.connect_timeout)
            .set_response_timeout(config.command_timeout)
            .set_number_of_retries(1)
            .set_max_delay(100);
        let conn = bounded(
            config.connect_timeout * 2,
            client.get_connection_manager_with_config(manager_config),
        )
        .await
        .map_err(|e| classify(&config, "connect", e))?;
        Ok(Self {
            config,
            client,
            conn,
        })
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The Redis key holding `key`'s lock: the prefixed name in a hash tag.
    pub fn lock_key(&self, key: &LockKey) -> String {
        format!("{{{}{}}}", self.config.prefix, key)
    }

    fn fence_key(lock_key: &str) -> String {
        format!("{lock_key}:fence")
    }

    fn channel(lock_key: &str) -> String {
        format!("{lock_key}:released")
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        what: &str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut conn = self.conn.clone();
        let limit = self.config.command_timeout;
        let mut result = bounded(limit, invocation.invoke_async(&mut conn)).await;
        // The first command after the server came back fails on the dead socket while the
        // manager reconnects. Every script is idempotent for its owner (a repeated acquire
        // is recognised, extend and release compare the owner), so one retry is safe.
        if result
            .as_ref()
            .is_err_and(|e| e.is_connection_dropped() || e.is_connection_refusal())
        {
            result = bounded(limit, invocation.invoke_async(&mut conn)).await;
        }
        result.map_err(|e| classify(&self.config, what, e))
    }

    /// Runs the acquire script once: the lock for `owner` with a fresh fence token, or
    /// the holder's remaining PTTL. The building block of [`DistributedLock::try_acquire`]
    /// and of Redlock's per-node round.
    ///
    /// # Cancel safety
    /// If dropped after sending, the lock may be granted to nobody until its TTL.
    pub async fn grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Grant, LockError> {
        let lock_key = self.lock_key(key);
        let mut invocation = SCRIPTS.acquire.prepare_invoke();
        invocation
            .key(&lock_key)
            .key(Self::fence_key(&lock_key))
            .arg(owner.to_string())
            .arg(millis(ttl))
            .arg(self.config.fence.as_str());
        let (granted, value): (i64, i64) = self.call("acquire", invocation).await?;
        if granted != 1 {
            return Ok(Grant::Held(Duration::from_millis(value.max(0) as u64)));
        }
        u64::try_from(value)
            .ok()
            .filter(|t| *t > 0)
            .map(|t| Grant::Granted(FencingToken(t)))
            .ok_or_else(|| LockError::backend(format!("server returned fence {value}")))
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
    ) -> Result<bool, LockError> {
        let lock_key = self.lock_key(key);
        let mut invocation = SCRIPTS.extend.prepare_invoke();
        invocation
            .key(&lock_key)
            .key(Self::fence_key(&lock_key))
            .arg(owner.to_string())
            .arg(millis(ttl));
        Ok(self.call::<i64>("extend", invocation).await? == 1)
    }

    /// Deletes `owner`'s lock and announces it; `false` if it is not `owner`'s.
    ///
    /// # Cancel safety
    /// The server may or may not have released the lock.
    pub async fn release_owner(&self, key: &LockKey, owner: OwnerId) -> Result<bool, LockError> {
        let lock_key = self.lock_key(key);
        let mut invocation = SCRIPTS.release.prepare_invoke();
        invocation
            .key(&lock_key)
            .arg(owner.to_string())
            .arg(Self::channel(&lock_key));
        Ok(self.call::<i64>("release", invocation).await? == 1)
    }

    /// Raises the key's fence counter to at least `token` and records `token` in the lock
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
    ) -> Result<bool, LockError> {
        let lock_key = self.lock_key(key);
        let mut invocation = SCRIPTS.raise_fence.prepare_invoke();
        invocation
            .key(&lock_key)
            .key(Self::fence_key(&lock_key))
            .arg(owner.to_string())
            .arg(token.get())
            .arg(self.config.fence.as_str());
        Ok(self.call::<i64>("raise fence", invocation).await? == 1)
    }

    async fn attempt(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let token = match self.grant(key, owner, ttl).await? {
            Grant::Held(pttl) => return Ok(Attempt::Held { pttl }),
            Grant::Granted(token) => token,
        };
        let lease = Lease::new(key.clone(), owner, token, sent, ttl, default_drift(ttl))
            .with_handle(LeaseHandle {
                path: self.lock_key(key),
                ..LeaseHandle::default()
            });
        let replied = Instant::now();
        if replied < lease.valid_until() {
            return Ok(Attempt::Granted(lease));
        }
        // The reply came after the lease's own deadline (sent + ttl − drift): the lock may
        // already be free on the server, or be for a while yet, but it is no lease we can
        // use. Give it back (owner-checked) so that nobody waits for it, and report it.
        let released = match self.release_owner(key, owner).await {
            Ok(_) => "it was released".to_owned(),
            Err(e) => format!("releasing it failed ({e}); it expires within its TTL"),
        };
        Err(LockError::Unavailable {
            message: format!(
                "acquire on {}: the reply arrived {:?} after sending, past the lease deadline \
                 (ttl {ttl:?} minus drift): grant refused and {released}",
                self.config.endpoint(),
                replied - sent,
            ),
            source: None,
        })
    }

    /// Subscribes to `key`'s release channel.
    async fn subscribe(&self, key: &LockKey) -> Result<redis::aio::PubSub, LockError> {
        let channel = Self::channel(&self.lock_key(key));
        let mut pubsub = bounded(self.config.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|e| classify(&self.config, "subscribe", e))?;
        bounded(self.config.command_timeout, pubsub.subscribe(&channel))
            .await
            .map_err(|e| classify(&self.config, "subscribe", e))?;
        Ok(pubsub)
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    /// One run of the acquire script. A grant whose reply arrives after the lease's own
    /// deadline (sent + ttl − drift) is refused: the lock is released (owner-checked) and
    /// the result is [`LockError::Unavailable`] — not `Ok(None)`, as nobody else holds it.
    ///
    /// # Cancel safety
    /// If dropped after the script was sent, the lock may be held by nobody until its TTL.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        match self.attempt(key, OwnerId::random(), ttl).await? {
            Attempt::Granted(lease) => Ok(Some(lease)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Subscribes to the key's release channel, then retries on each release message,
    /// or when the holder's PTTL runs out, until `opts.wait` has passed. Retries of one
    /// call reuse its owner id, so a retry after a lost reply is recognised as ours.
    ///
    /// # Cancel safety
    /// As `try_acquire`; the subscription is dropped with the future.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        opts.validate()?;
        let owner = OwnerId::random();
        let started = Instant::now();
        let deadline = started + opts.wait;
        let mut pubsub = None;
        let mut failures = 0u32;
        loop {
            // Subscribe before trying, so a release between the try and the wait is seen.
            if pubsub.is_none() && !opts.wait.is_zero() {
                pubsub = self.subscribe(key).await.ok();
            }
            let retry_in = match self.attempt(key, owner, opts.ttl).await {
                Ok(Attempt::Granted(lease)) => return Ok(lease),
                Ok(Attempt::Held { pttl }) => {
                    failures = 0;
                    pttl.max(Duration::from_millis(1))
                }
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    failures += 1;
                    pubsub = None;
                    opts.backoff.delay(failures)
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    waited: now - started,
                });
            }
            let sleep = tokio::time::sleep(retry_in.min(deadline - now));
            match pubsub.as_mut() {
                Some(sub) => {
                    let mut messages = sub.on_message();
                    tokio::select! {
                        message = messages.next() => if message.is_none() {
                            drop(messages);
                            pubsub = None; // connection lost: resubscribe next round
                        },
                        _ = sleep => {}
                    }
                }
                None => sleep.await,
            }
        }
    }

    /// # Cancel safety
    /// The server may have applied the extension; `lease` is unchanged.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        let extended = self.extend_owner(lease.key(), lease.owner(), ttl).await?;
        if !extended {
            return Err(LockError::lost(format!(
                "`{}` is no longer held by {} (expired or taken over)",
                lease.key(),
                lease.owner()
            )));
        }
        lease.renewed(sent, ttl, default_drift(ttl));
        Ok(())
    }

    /// # Cancel safety
    /// If dropped, the lock may stay held until its TTL.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let released = self.release_owner(lease.key(), lease.owner()).await?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let mut invocation = SCRIPTS.inspect.prepare_invoke();
        invocation.key(self.lock_key(key));
        let (value, pttl): (Option<String>, i64) = self.call("inspect", invocation).await?;
        let Some(value) = value else { return Ok(None) };
        let (owner, token) = parse_lock_value(&value)?;
        Ok(Some(HolderInfo {
            owner,
            token: Some(token),
            // PTTL -1 would mean a lock without expiry: report it as such (None).
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        }))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "redis",
            fencing: match self.config.fence {
                FenceMode::ClockFloored => FencingKind::ClockFlooredCounter,
                FenceMode::Counter => FencingKind::SingleNodeCounter,
            },
            expiry: ExpiryKind::ServerTtl,
            replication: Replication::SingleNode,
            wait: WaitKind::Push,
            fairness: Fairness::None,
            failures_tolerated: 0,
            clock_dependent: true,
        }
    }
}

fn millis(ttl: Duration) -> u64 {
    ttl.as_millis().try_into().unwrap_or(u64::MAX)
}

/// Runs `future` for at most `limit`; running out counts as a timeout error.
async fn bounded<T>(
    limit: Duration,
    future: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply within {limit:?}"),
            )))
        })
}

/// What a Redis client error means for a lock call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ErrorClass {
    /// The server cannot serve us now but may soon: [`LockError::Unavailable`].
    Unavailable,
    /// Our credentials or client settings are wrong: [`LockError::Config`], never retried.
    Config,
    /// Anything else: [`LockError::Backend`].
    Backend,
}

/// Sorts a client error into a class, by the client's [`ErrorKind`](redis::ErrorKind)
/// and the server's error code (the first word of an error reply, which Redis keeps when
/// a command inside a script fails).
///
/// - Unavailable (retryable): I/O errors, timeouts, refused or dropped connections, and
///   the server states that pass — `LOADING` (loading its dataset), `MASTERDOWN` (a
///   replica that lost its primary), `TRYAGAIN`, `CLUSTERDOWN`, `READONLY` (a replica,
///   e.g. a former primary after a failover) and `BUSY` (a long script is running).
/// - Config (never retried): authentication failures (`NOAUTH`, `WRONGPASS`, the client's
///   own "authentication failed"), `NOPERM` (the ACL user may not run the scripts) and
///   invalid client settings.
/// - Backend: everything else (`ERR`, `WRONGTYPE`, a malformed reply, …).
fn error_class(error: &RedisError) -> ErrorClass {
    use redis::ErrorKind;
    match error.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
            return ErrorClass::Config
        }
        ErrorKind::IoError
        | ErrorKind::BusyLoadingError
        | ErrorKind::MasterDown
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::ReadOnly => return ErrorClass::Unavailable,
        _ => {}
    }
    match error.code() {
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => ErrorClass::Config,
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY") => {
            ErrorClass::Unavailable
        }
        _ if error.is_timeout()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_unrecoverable_error() =>
        {
            ErrorClass::Unavailable
        }
        _ => ErrorClass::Backend,
    }
}

/// Converts a client error from step `what` into a [`LockError`] of its class (see
/// [`error_class`]); the message names the server and the error code, never a password.
fn classify(config: &RedisConfig, what: &str, error: RedisError) -> LockError {
    let message = match error.code() {
        Some(code) => format!("{what} on {}: {error} [{code}]", config.endpoint()),
        None => format!("{what} on {}: {error}", config.endpoint()),
    };
    match error_class(&error) {
        ErrorClass::Unavailable => LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        },
        ErrorClass::Config => LockError::Config(message),
        ErrorClass::Backend => LockError::Backend {
            message,
            source: Some(Box::new(error)),
        },
    }
}

#[cfg(test)]
mod tests {
    use redis::ErrorKind;

    use super::*;

    /// The error a client sees for this raw server reply (`-CODE detail`).
    fn reply(line: &str) -> RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn class(error: RedisError) -> &'static str {
        let config = RedisConfig::from_url("redis://h").unwrap();
        match classify(&config, "acquire", error) {
            LockError::Unavailable { .. } => "unavailable",
            LockError::Config(_) => "config",
            LockError::Backend { .. } => "backend",
            _ => "other",
        }
    }

    #[test]
    fn transient_server_states_are_unavailable() {
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "READONLY You can't write against a read only replica. script: 7cd7, on @user_script:1.",
            "CLUSTERDOWN The cluster is down",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        ] {
            assert_eq!(class(reply(line)), "unavailable", "{line}");
        }
        for kind in [
            ErrorKind::BusyLoadingError,
            ErrorKind::MasterDown,
            ErrorKind::TryAgain,
            ErrorKind::ReadOnly,
            ErrorKind::ClusterDown,
        ] {
            assert_eq!(
                class(RedisError::from((kind, "x"))),
                "unavailable",
                "{kind:?}"
            );
        }
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply");
        assert_eq!(class(RedisError::from(io)), "unavailable");
    }

    #[test]
    fn authentication_failures_are_config_errors() {
        for line in [
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User app has no permissions to run the 'evalsha' command",
        ] {
            assert_eq!(class(reply(line)), "config", "{line}");
        }
        let failed = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(class(failed), "config");
        let bad = RedisError::from((ErrorKind::InvalidClientConfig, "bad URL"));
        assert_eq!(class(bad), "config");
    }

    #[test]
    fn other_server_errors_are_backend_errors() {
        for line in [
            "ERR Error running script",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "TENURE fence counter {k}:fence reached 2^53",
        ] {
            assert_eq!(class(reply(line)), "backend", "{line}");
        }
    }
}
