//! Redis's deliberately broken variants ([`BrokenVariant`]): the real client with one
//! classic anti-pattern each, on the same servers and links. Those that send requests of
//! their own have a client of their own too, its scripts loaded at once, and send plain
//! commands over its connection; `local-counter-token` and `deadline-on-a-stopping-clock` send none (the
//! latter is the real client itself, `acquire_any` included).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::backend::{default_drift, poll_acquire};
use tenure_api::{
    async_trait, validate_ttl, AcquireOptions, Capabilities, DistributedLock, FencingToken,
    HolderInfo, Lease, LeaseHandle, LockError, LockKey, OwnerId, ReleaseOutcome, SystemClock,
};
use tenure_conformance::broken::{unavailable, untouched, BrokenVariant, Retokened, TokenSource};
use tenure_conformance::testbed::BoxFuture;

use crate::{Grant, RedisLock};

/// Redis's broken variants, in the order `tenure matrix --list-broken` prints them.
pub(super) const BROKEN: &[BrokenVariant] = &[
    BrokenVariant::new("setnx-then-expire", |url, inner| {
        wrap(Flaw::SetnxThenExpire, url, inner)
    }),
    BrokenVariant::new("get-del-release", |url, inner| {
        wrap(Flaw::GetDelRelease, url, inner)
    }),
    BrokenVariant::new("del-without-owner-check", |url, inner| {
        wrap(Flaw::DelWithoutOwnerCheck, url, inner)
    }),
    BrokenVariant::new("fixed-value", |url, inner| {
        wrap(Flaw::FixedValue, url, inner)
    }),
    BrokenVariant::new("extend-reacquires", |url, inner| {
        wrap(Flaw::ExtendReacquires, url, inner)
    }),
    // Fencing tokens from a counter in the client process.
    BrokenVariant::new("local-counter-token", Retokened::<LocalCounter>::wrap),
    BrokenVariant::new("deadline-from-reply", |url, inner| {
        wrap(Flaw::DeadlineFromReply, url, inner)
    }),
    // Its client untouched: the holder's guard counts its deadline on CLOCK_MONOTONIC
    // alone, which stands still while the machine is suspended, so a holder woken after
    // its lease ran out on the server still believes it.
    BrokenVariant::new("deadline-on-a-stopping-clock", untouched).stopping_the_clock(),
];

/// A classic anti-pattern of a Redis lock client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// `SETNX`, then `EXPIRE` as a second command.
    SetnxThenExpire,
    /// Release by `GET`, compare, then `DEL`: two commands, no atomicity.
    GetDelRelease,
    /// Release by a bare `DEL`, whoever holds the key.
    DelWithoutOwnerCheck,
    /// One lock value (owner id) shared by every client.
    FixedValue,
    /// `extend` on a lost lock takes the lock again and reports success.
    ExtendReacquires,
    /// The lease's deadline counts from the reply, not from the request.
    DeadlineFromReply,
}

/// Every [`Flaw::FixedValue`] client's owner id.
const FIXED_OWNER: OwnerId = OwnerId([0x42; 16]);

impl Flaw {
    /// Whether `try_acquire` is the wrapper's own (and `acquire` polls it).
    fn own_acquire(self) -> bool {
        matches!(
            self,
            Flaw::SetnxThenExpire | Flaw::FixedValue | Flaw::DeadlineFromReply
        )
    }
}

/// Wraps `inner`, a real client of `url`, in `flaw`, with a client of its own.
fn wrap(
    flaw: Flaw,
    url: String,
    inner: Arc<dyn DistributedLock>,
) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> {
    Box::pin(async move {
        let lock = RedisLock::connect(&url).await?;
        warm_up(&lock).await?;
        let broken: Arc<dyn DistributedLock> = Arc::new(Broken { flaw, inner, lock });
        Ok(broken)
    })
}

/// A counter in the client process.
#[derive(Debug, Default)]
struct LocalCounter(AtomicU64);

#[async_trait]
impl TokenSource for LocalCounter {
    async fn token(&self, _key: &LockKey) -> Result<FencingToken, LockError> {
        Ok(FencingToken(self.0.fetch_add(1, Ordering::Relaxed) + 1))
    }
}

/// Loads the server's scripts, so that a request under a fault runs at once rather than
/// after a `NOSCRIPT` round trip (as in any long-running process).
///
/// # Cancel safety
/// Cancel-safe: the warm-up key expires within a second.
pub async fn warm_up(lock: &RedisLock) -> Result<(), LockError> {
    let key = LockKey::new("tenure-broken/warm-up")?;
    let (owner, limit) = (OwnerId::random(), lock.config().request_timeout);
    lock.grant(&key, owner, Duration::from_secs(1), None, limit)
        .await?;
    lock.extend_owner(&key, owner, Duration::from_secs(1), limit)
        .await?;
    lock.release_owner(&key, owner, limit).await?;
    Ok(())
}

/// The real client with one flaw, and a client of its own through the same links.
struct Broken {
    flaw: Flaw,
    inner: Arc<dyn DistributedLock>,
    lock: RedisLock,
}

impl std::fmt::Debug for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broken")
            .field("flaw", &self.flaw)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Broken {
    fn lease(
        &self,
        key: &LockKey,
        owner: OwnerId,
        token: FencingToken,
        from: Instant,
        ttl: Duration,
    ) -> Lease {
        let drift = match self.flaw {
            Flaw::DeadlineFromReply => Duration::ZERO,
            _ => default_drift(ttl),
        };
        Lease::new(key.clone(), owner, token, from, ttl, drift).with_handle(LeaseHandle {
            path: self.lock.lock_key(key),
            ..LeaseHandle::default()
        })
    }

    /// One plain command on the wrapper's own client's connection, within the client's
    /// request timeout; a connection that dropped is replaced before the next command, as
    /// the backend replaces its own.
    ///
    /// # Cancel safety
    /// Cancel-safe; a cancelled command may still run on the server.
    async fn command<T: redis::FromRedisValue>(
        &self,
        what: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, LockError> {
        let limit = self.lock.config().request_timeout;
        let node = self
            .lock
            .primary
            .node_for_call(Instant::now() + limit)
            .await;
        let mut conn = node.conn.clone();
        let replied = crate::error::bounded(limit, cmd.query_async(&mut conn)).await;
        if matches!(&replied, Err(e) if e.is_unrecoverable_error()) {
            node.suspect();
        }
        replied.map_err(|e| unavailable(what, e))
    }

    /// The wrapper's own single attempt.
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        let sent = Instant::now();
        if self.flaw == Flaw::SetnxThenExpire {
            let (name, owner) = (self.lock.lock_key(key), OwnerId::random());
            let count: u64 = self
                .command("INCR", redis::cmd("INCR").arg(format!("{name}:fence")))
                .await?;
            let set: bool = self
                .command(
                    "SETNX",
                    redis::cmd("SETNX")
                        .arg(&name)
                        .arg(format!("{owner}:{count}")),
                )
                .await?;
            if !set {
                return Ok(None);
            }
            let _: bool = self
                .command(
                    "PEXPIRE",
                    redis::cmd("PEXPIRE")
                        .arg(&name)
                        .arg(ttl.as_millis().to_string()),
                )
                .await?;
            let token = crate::scripts::token_for(count, owner)?;
            return Ok(Some(self.lease(key, owner, token, sent, ttl)));
        }
        // FixedValue or DeadlineFromReply.
        let owner = match self.flaw {
            Flaw::FixedValue => FIXED_OWNER,
            _ => OwnerId::random(),
        };
        let limit = self.lock.config().request_timeout;
        match self.lock.grant(key, owner, ttl, None, limit).await? {
            Grant::Granted(token) => {
                let from = match self.flaw {
                    Flaw::FixedValue => sent,
                    _ => Instant::now(),
                };
                Ok(Some(self.lease(key, owner, token, from, ttl)))
            }
            Grant::Held(_) | Grant::ReadHeld(_) => Ok(None),
        }
    }
}

#[async_trait]
impl DistributedLock for Broken {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        match self.flaw.own_acquire() {
            true => self.attempt(key, ttl).await,
            false => self.inner.try_acquire(key, ttl).await,
        }
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        if self.flaw.own_acquire() {
            opts.refuse_label("broken")?;
            return poll_acquire(&SystemClock, opts, || self.attempt(key, opts.ttl)).await;
        }
        self.inner.acquire(key, opts).await
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        if self.flaw != Flaw::ExtendReacquires {
            return self.inner.extend(lease, ttl).await;
        }
        match self.inner.extend(lease, ttl).await {
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
        }
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        if !matches!(self.flaw, Flaw::GetDelRelease | Flaw::DelWithoutOwnerCheck) {
            return self.inner.release(lease).await;
        }
        let name = self.lock.lock_key(lease.key());
        if self.flaw == Flaw::GetDelRelease {
            let value: Option<String> = self.command("GET", redis::cmd("GET").arg(&name)).await?;
            if !value.is_some_and(|v| v.starts_with(&format!("{}:", lease.owner()))) {
                return Ok(ReleaseOutcome::NotHeld);
            }
        }
        let deleted: i64 = self.command("DEL", redis::cmd("DEL").arg(&name)).await?;
        Ok(match deleted > 0 {
            true => ReleaseOutcome::Released,
            false => ReleaseOutcome::NotHeld,
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    /// The backend's, except that a flaw with an acquire of its own records no labels.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            labels: self.inner.capabilities().labels && !self.flaw.own_acquire(),
            shared: false,
            ..self.inner.capabilities()
        }
    }
}
