//! The shared scenario suite: one `pub async fn` per scenario, run against every backend
//! through a [`Harness`]. Scenario floor from madelson's DistributedLock core tests,
//! ShedLock's fuzz counter and Jepsen's lock workload.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tenure_api::{
    renewal_interval, AcquireOptions, Capabilities, DistributedLock, Election, ExpiryKind,
    Fairness, FencingKind, Leader, Lease, LockError, LockExt, LockGuard, LockKey, OwnerId,
    ReleaseOutcome, Semaphore,
};

use crate::history::{FencedRegister, History};
use crate::Harness;

mod multi;
mod rw;
pub use multi::*;
pub use rw::*;

/// Why a scenario failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        Self(format!("unexpected error: {error}"))
    }
}

impl From<crate::history::Rejected> for Failure {
    fn from(error: crate::history::Rejected) -> Self {
        Self(format!("fenced register: {error}"))
    }
}

/// A scenario's result.
pub type Outcome = Result<(), Failure>;

/// Fails the scenario with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::suite::Failure(format!($($fmt)+)));
        }
    };
}

/// What a scenario needs from the backend; without it the scenario is reported ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// A silent holder's lock is freed after its TTL while the holder's client stays
    /// connected (not true of session-based ZooKeeper locks).
    TtlExpiry,
    /// The backend declares FIFO fairness (the scenario then checks it).
    Fifo,
    /// The harness can cut a client's link.
    LinkCut,
    /// The backend records labels ([`Capabilities::labels`]).
    Labels,
    /// The backend takes keys shared ([`Capabilities::shared`]): read-write locks.
    Shared,
    /// The backend holds elections: labels for the leader's value, fencing tokens for
    /// its terms ([`Election::new`]).
    Elections,
}

impl Requirement {
    /// Whether a backend with these capabilities and this harness meets the requirement.
    pub fn met_by(self, caps: &Capabilities, harness: &dyn Harness) -> bool {
        match self {
            Self::TtlExpiry => caps.expiry != ExpiryKind::SessionHeartbeat,
            Self::Fifo => caps.fairness == Fairness::Fifo,
            Self::LinkCut => harness.can_cut_links(),
            Self::Labels => caps.labels,
            Self::Shared => caps.shared,
            Self::Elections => caps.labels && caps.fencing != FencingKind::None,
        }
    }
}

/// What one scenario run sees: the harness and a key namespace of its own.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The backend's harness.
    pub harness: &'a dyn Harness,
    prefix: String,
}

impl<'a> Ctx<'a> {
    /// A context whose keys live under `prefix`.
    pub fn new(harness: &'a dyn Harness, prefix: impl Into<String>) -> Self {
        Self {
            harness,
            prefix: prefix.into(),
        }
    }

    /// A key unique to this run and scenario.
    ///
    /// # Panics
    /// If the prefix makes the key invalid (longer than 512 bytes, control characters):
    /// a broken harness, reported as a failed scenario.
    pub fn key(&self, name: &str) -> LockKey {
        LockKey::new(format!("{}/{}", self.prefix, name))
            .unwrap_or_else(|e| panic!("bad scenario key prefix {:?}: {e}", self.prefix))
    }

    /// A fresh independent client.
    ///
    /// # Cancel safety
    /// As [`Harness::client`].
    pub async fn client(&self) -> Result<Arc<dyn DistributedLock>, Failure> {
        self.harness
            .client()
            .await
            .map_err(|e| Failure(format!("could not create a client: {e}")))
    }

    /// The harness's short TTL.
    pub fn short_ttl(&self) -> Duration {
        self.harness.short_ttl()
    }
}

/// A named scenario with its requirements.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// Its name (also the test name).
    pub name: &'static str,
    /// What it needs; unmet requirements make it *ignored*.
    pub requires: &'static [Requirement],
    /// Runs it.
    pub run: for<'a> fn(&'a Ctx<'a>) -> BoxFuture<'a, Outcome>,
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("requires", &self.requires)
            .finish()
    }
}

impl Scenario {
    /// The first requirement `caps`/`harness` do not meet, if any.
    pub fn unmet(&self, caps: &Capabilities, harness: &dyn Harness) -> Option<Requirement> {
        self.requires
            .iter()
            .copied()
            .find(|r| !r.met_by(caps, harness))
    }
}

macro_rules! scenarios {
    ($($name:ident $([$($req:ident),*])?),* $(,)?) => {
        /// Every scenario of the suite, in a stable order.
        pub fn scenarios() -> Vec<Scenario> {
            vec![$({
                fn run<'a>(ctx: &'a Ctx<'a>) -> BoxFuture<'a, Outcome> {
                    Box::pin($name(ctx))
                }
                Scenario {
                    name: stringify!($name),
                    requires: &[$($(Requirement::$req),*)?],
                    run,
                }
            }),*]
        }
    };
}

scenarios![
    acquire_release_reacquire,
    try_while_held_is_none,
    keys_are_independent,
    keys_that_look_like_syntax_are_plain_names,
    inspect_reports_the_holder,
    invalid_ttl_is_rejected,
    acquire_times_out_while_held,
    extend_keeps_the_lease,
    non_owner_cannot_extend_or_release,
    replayed_lease_cannot_touch_a_later_grant,
    tokens_strictly_increase,
    two_clients_never_share,
    counter_loses_no_update,
    ttl_expiry_and_takeover[TtlExpiry],
    extend_after_expiry_fails[TtlExpiry],
    a_shorter_extension_never_ends_an_earlier_promise,
    releasing_a_stolen_lease_keeps_the_new_owner[TtlExpiry],
    crashed_client_is_freed,
    cancelled_acquire_leaves_no_ghost,
    drop_without_release_frees_the_lock,
    guard_renews_past_the_ttl,
    late_grant_is_never_held_past_its_deadline,
    lost_fires_when_the_link_is_cut[LinkCut],
    blackholed_holder_is_taken_over_only_after_its_lease[LinkCut],
    waiters_are_served_fifo[Fifo],
    many_keys_stress,
    semaphore_admits_its_permits_and_no_more,
    semaphore_permit_of_a_crashed_holder_comes_back,
    semaphore_waiter_gets_a_released_permit,
    semaphore_runs_that_disagree_on_the_count_are_refused[Labels],
    multilock_takes_all_keys_or_none,
    multilocks_on_overlapping_keys_never_deadlock,
    multilock_reports_a_lost_member,
    readers_share_and_a_writer_excludes[Shared],
    a_waiting_writer_is_not_starved_by_readers[Shared],
    a_writer_that_stops_waiting_lets_later_readers_in[Shared],
    a_readers_lease_ends_alone[Shared, TtlExpiry],
    the_shared_mode_is_declared_truly,
    labels_are_reported_while_held[Labels],
    bad_labels_are_refused_and_grant_nothing[Labels],
    election_has_one_leader_at_a_time[Elections],
    election_observers_see_each_leader_in_order[Elections],
];

const LONG_TTL: Duration = Duration::from_secs(30);

async fn must_acquire(
    lock: &Arc<dyn DistributedLock>,
    key: &LockKey,
    ttl: Duration,
) -> Result<Lease, Failure> {
    lock.try_acquire(key, ttl)
        .await?
        .ok_or_else(|| Failure(format!("`{key}` should be free")))
}

async fn holder(
    lock: &Arc<dyn DistributedLock>,
    key: &LockKey,
) -> Result<Option<OwnerId>, Failure> {
    Ok(lock.inspect(key).await?.map(|h| h.owner))
}

/// Acquire, release, and acquire again with a new owner and a larger token.
pub async fn acquire_release_reacquire(ctx: &Ctx<'_>) -> Outcome {
    let lock = ctx.client().await?;
    let key = ctx.key("k");
    let first = must_acquire(&lock, &key, LONG_TTL).await?;
    let outcome = lock.release(first.clone()).await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "release said {outcome:?}"
    );
    let again = lock.release(first.clone()).await?;
    ensure!(
        again == ReleaseOutcome::NotHeld,
        "double release said {again:?}"
    );
    let second = must_acquire(&lock, &key, LONG_TTL).await?;
    ensure!(second.owner() != first.owner(), "owner id reused");
    ensure!(
        second.token() > first.token(),
        "token {} after {}",
        second.token(),
        first.token()
    );
    lock.release(second).await?;
    Ok(())
}

/// `try_acquire` on a held key returns `None` at once, from any client.
pub async fn try_while_held_is_none(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let lease = must_acquire(&a, &key, LONG_TTL).await?;
    ensure!(
        b.try_acquire(&key, LONG_TTL).await?.is_none(),
        "second client got a held lock"
    );
    ensure!(
        a.try_acquire(&key, LONG_TTL).await?.is_none(),
        "same client got it twice"
    );
    a.release(lease).await?;
    let lease = must_acquire(&b, &key, LONG_TTL).await?;
    b.release(lease).await?;
    Ok(())
}

/// Holding one key does not block another.
pub async fn keys_are_independent(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let one = must_acquire(&a, &ctx.key("one"), LONG_TTL).await?;
    let two = must_acquire(&b, &ctx.key("two"), LONG_TTL).await?;
    a.release(one).await?;
    b.release(two).await?;
    Ok(())
}

/// Keys with quotes, backslashes, dollar signs, glob and regex characters, braces and
/// non-ASCII text are plain names: all held at once, each by its own lease, none
/// mistaken for another (a backend that builds query text or patterns from keys must
/// quote them).
pub async fn keys_that_look_like_syntax_are_plain_names(ctx: &Ctx<'_>) -> Outcome {
    const NAMES: [&str; 10] = [
        "it's",
        r"back\slash\",
        "$k$",
        "ends in $k",
        "E'x'",
        "x');--",
        "a*b?[c]%_",
        "{tag}",
        "\"quoted\"",
        "ünï 😀",
    ];
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let mut held = Vec::new();
    for name in NAMES {
        let key = ctx.key(name);
        held.push(must_acquire(&a, &key, LONG_TTL).await?);
        ensure!(
            b.try_acquire(&key, LONG_TTL).await?.is_none(),
            "`{key}` was granted twice"
        );
    }
    for lease in &held {
        let owner = holder(&b, lease.key()).await?;
        ensure!(
            owner == Some(lease.owner()),
            "`{}` shows holder {owner:?}, not {}",
            lease.key(),
            lease.owner()
        );
    }
    for lease in held {
        a.release(lease).await?;
    }
    for name in NAMES {
        let lease = must_acquire(&b, &ctx.key(name), LONG_TTL).await?;
        b.release(lease).await?;
    }
    Ok(())
}

/// `inspect` names the holder and its token, and `None` when free.
pub async fn inspect_reports_the_holder(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    ensure!(b.inspect(&key).await?.is_none(), "free key has a holder");
    let lease = must_acquire(&a, &key, LONG_TTL).await?;
    let info = b
        .inspect(&key)
        .await?
        .ok_or_else(|| Failure("held key shows no holder".into()))?;
    ensure!(
        info.owner == lease.owner(),
        "inspect owner {} != {}",
        info.owner,
        lease.owner()
    );
    if let Some(token) = info.token {
        ensure!(
            token == lease.token(),
            "inspect token {token} != {}",
            lease.token()
        );
    }
    if let Some(remaining) = info.remaining {
        ensure!(
            remaining <= LONG_TTL,
            "remaining {remaining:?} exceeds the ttl"
        );
    }
    a.release(lease).await?;
    ensure!(
        b.inspect(&key).await?.is_none(),
        "released key still has a holder"
    );
    Ok(())
}

/// A zero or absurd TTL is `InvalidInput`, and takes no lock.
pub async fn invalid_ttl_is_rejected(ctx: &Ctx<'_>) -> Outcome {
    let lock = ctx.client().await?;
    let key = ctx.key("k");
    for ttl in [Duration::ZERO, Duration::from_secs(400 * 86_400)] {
        match lock.try_acquire(&key, ttl).await {
            Err(LockError::InvalidInput(_)) => {}
            other => {
                return Err(Failure(format!(
                    "ttl {ttl:?}: expected InvalidInput, got {other:?}"
                )))
            }
        }
    }
    ensure!(
        lock.inspect(&key).await?.is_none(),
        "a rejected acquire left a lock"
    );
    Ok(())
}

/// `acquire` on a held key really waits its bound, then reports `Timeout`.
pub async fn acquire_times_out_while_held(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let lease = must_acquire(&a, &key, LONG_TTL).await?;
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    let result = b
        .acquire(&key, &AcquireOptions::new(LONG_TTL).wait(wait))
        .await;
    let waited = started.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "expected Timeout, got {result:?}"
    );
    ensure!(
        waited >= wait,
        "returned after {waited:?}, before its {wait:?} bound"
    );
    ensure!(
        holder(&b, &key).await? == Some(lease.owner()),
        "holder changed"
    );
    a.release(lease).await?;
    Ok(())
}

/// The TTL of the scenarios that keep a lease alive past it (extend, guard): the harness's
/// short TTL, but at least 1 s. Those scenarios wait for no expiry; what they time is a
/// renewal reaching the server before the lease's end, and on a loaded 2-core machine
/// the 250–330 ms a 500 ms lease leaves after a renewal interval is not always enough
/// (a Postgres holder's session was ended by its idle timer in a matrix run).
pub(super) fn keepalive_ttl(ctx: &Ctx<'_>) -> Duration {
    ctx.short_ttl().max(Duration::from_secs(1))
}

/// Extending before expiry keeps the lock past its original TTL.
pub async fn extend_keeps_the_lease(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = keepalive_ttl(ctx);
    let mut lease = must_acquire(&a, &key, ttl).await?;
    // At the guard's own cadence, for longer than one TTL.
    for _ in 0..5 {
        tokio::time::sleep(renewal_interval(ttl)).await;
        a.extend(&mut lease, ttl).await?;
    }
    ensure!(
        lease.valid_until() > Instant::now(),
        "deadline not moved by extend"
    );
    ensure!(
        b.try_acquire(&key, ttl).await?.is_none(),
        "lost despite extensions"
    );
    a.release(lease).await?;
    Ok(())
}

/// A forged lease (another owner id, the holder's token) can neither extend nor release.
pub async fn non_owner_cannot_extend_or_release(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let lease = must_acquire(&a, &key, LONG_TTL).await?;
    let mut forged = Lease::new(
        key.clone(),
        OwnerId::random(),
        lease.token(),
        Instant::now(),
        LONG_TTL,
        Duration::ZERO,
    )
    .with_handle(lease.handle().clone());
    match b.extend(&mut forged, LONG_TTL).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => {
            return Err(Failure(format!(
                "non-owner extend: expected LeaseLost, got {other:?}"
            )))
        }
    }
    match b.release(forged).await {
        Ok(ReleaseOutcome::NotHeld) | Err(LockError::LeaseLost { .. }) => {}
        other => {
            return Err(Failure(format!(
                "non-owner release: expected NotHeld, got {other:?}"
            )))
        }
    }
    let seen = holder(&b, &key).await?;
    ensure!(
        seen == Some(lease.owner()),
        "non-owner disturbed the lock: the holder is {seen:?}, not {}",
        lease.owner()
    );
    a.release(lease).await?;
    Ok(())
}

/// A lease replayed after its grant ended (released, then the key granted again, here to
/// the same client) can neither extend nor release the later grant, through its own
/// client or another: every grant has a fresh owner id, and the backend checks it.
pub async fn replayed_lease_cannot_touch_a_later_grant(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let old = must_acquire(&a, &key, LONG_TTL).await?;
    let replay = old.clone();
    a.release(old).await?;
    let current = must_acquire(&a, &key, LONG_TTL).await?;
    ensure!(
        current.owner() != replay.owner(),
        "two grants share owner id {}",
        replay.owner()
    );
    for (who, lock) in [("its own client", &a), ("another client", &b)] {
        let mut stale = replay.clone();
        match lock.extend(&mut stale, LONG_TTL).await {
            Err(LockError::LeaseLost { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "replayed extend through {who}: expected LeaseLost, got {other:?}"
                )))
            }
        }
        match lock.release(replay.clone()).await {
            Ok(ReleaseOutcome::NotHeld) | Err(LockError::LeaseLost { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "replayed release through {who}: expected NotHeld, got {other:?}"
                )))
            }
        }
        ensure!(
            holder(&b, &key).await? == Some(current.owner()),
            "a replay through {who} disturbed the lock"
        );
    }
    match a.release(current).await? {
        ReleaseOutcome::Released => Ok(()),
        other => Err(Failure(format!("the current grant's release: {other:?}"))),
    }
}

/// Tokens strictly increase over a sequence of grants to competing clients.
pub async fn tokens_strictly_increase(ctx: &Ctx<'_>) -> Outcome {
    let clients = [ctx.client().await?, ctx.client().await?];
    let key = ctx.key("k");
    let mut last = None;
    for i in 0..20 {
        let lock = &clients[i % 2];
        let lease = must_acquire(lock, &key, LONG_TTL).await?;
        if let Some(prev) = last {
            ensure!(
                lease.token() > prev,
                "grant {i}: token {} after {prev}",
                lease.token()
            );
        }
        last = Some(lease.token());
        lock.release(lease).await?;
    }
    Ok(())
}

/// Several clients contend for one key; the checker finds no overlap of believed holds
/// and tokens that increase in acquisition order.
pub async fn two_clients_never_share(ctx: &Ctx<'_>) -> Outcome {
    let history = History::new();
    let key = ctx.key("k");
    let run_for = Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for client in 0..3 {
        let lock = ctx.client().await?;
        let (history, key) = (history.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(10));
            let started = Instant::now();
            while started.elapsed() < run_for {
                let invoked = Instant::now();
                let lease = lock.acquire(&key, &opts).await?;
                let completed = Instant::now();
                tokio::time::sleep(Duration::from_millis(2)).await;
                history.record(client, &lease, invoked, completed, Instant::now());
                lock.release(lease).await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| Failure(format!("task: {e}")))??;
    }
    let report = history.check();
    ensure!(report.is_safe(), "{report}");
    let holds = history.holds();
    for client in 0..3 {
        ensure!(
            holds.iter().any(|h| h.client == client),
            "client {client} never acquired"
        );
    }
    Ok(())
}

/// N tasks, each with its own client, do read-sleep-write increments under the lock,
/// on a plain counter and on a fenced register: no update is lost, nothing is rejected.
pub async fn counter_loses_no_update(ctx: &Ctx<'_>) -> Outcome {
    const TASKS: u64 = 4;
    const ROUNDS: u64 = 8;
    let key = ctx.key("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let register = Arc::new(FencedRegister::new());
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let lock = ctx.client().await?;
        let (key, counter, register) = (key.clone(), counter.clone(), register.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(20));
            for _ in 0..ROUNDS {
                let lease = lock.acquire(&key, &opts).await?;
                let read = counter.load(Ordering::SeqCst);
                let fenced = register.read(lease.token())?;
                tokio::time::sleep(Duration::from_millis(3)).await;
                counter.store(read + 1, Ordering::SeqCst);
                register.write(lease.token(), fenced + 1)?;
                lock.release(lease).await?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| Failure(format!("task: {e}")))??;
    }
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == TASKS * ROUNDS,
        "counter {total}, expected {}",
        TASKS * ROUNDS
    );
    ensure!(
        register.value() == TASKS * ROUNDS,
        "fenced register {}",
        register.value()
    );
    Ok(())
}

/// A holder that never extends loses the lock after its TTL; a waiter gets it, not
/// before the old holder's local deadline, with a larger token.
pub async fn ttl_expiry_and_takeover(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let old = must_acquire(&a, &key, ttl).await?;
    let opts = AcquireOptions::new(LONG_TTL).wait(ttl * 4 + Duration::from_secs(2));
    let new = b.acquire(&key, &opts).await?;
    let got_at = Instant::now();
    ensure!(
        got_at >= old.valid_until(),
        "taken over {:?} before the old holder's deadline",
        old.valid_until() - got_at
    );
    ensure!(
        new.token() > old.token(),
        "token {} after {}",
        new.token(),
        old.token()
    );
    b.release(new).await?;
    Ok(())
}

/// Extending an expired lease fails with `LeaseLost` and does not re-acquire it.
pub async fn extend_after_expiry_fails(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let mut lease = must_acquire(&a, &key, ttl).await?;
    // Wait until another client can take it: the server has expired it.
    let taker = b
        .acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(ttl * 4 + Duration::from_secs(2)),
        )
        .await?;
    b.release(taker).await?;
    match a.extend(&mut lease, ttl).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => {
            return Err(Failure(format!(
                "extend after expiry: expected LeaseLost, got {other:?}"
            )))
        }
    }
    ensure!(
        holder(&b, &key).await?.is_none(),
        "extend re-acquired the expired lock"
    );
    Ok(())
}

/// An extension to a shorter TTL, by a copy of the lease (a clone, or a caller whose
/// future was dropped midway), never ends the hold before the deadline the original still
/// counts on — a writer's lease and, where the backend has them, a reader's. (Whether the
/// short extension itself succeeds is the backend's to say.)
pub async fn a_shorter_extension_never_ends_an_earlier_promise(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let short = ctx.short_ttl();
    let long = (short * 8).max(Duration::from_secs(8));
    let shared = a.capabilities().shared;
    for reader in [false, true]
        .into_iter()
        .filter(|&reader| !reader || shared)
    {
        let key = ctx.key(if reader { "short/read" } else { "short/write" });
        let opts = AcquireOptions::new(long).wait(Duration::ZERO);
        let lease = match reader {
            false => a.acquire(&key, &opts).await?,
            true => a.acquire_shared(&key, &opts).await?,
        };
        let mut copy = lease.clone();
        let _ = a.extend(&mut copy, short).await;
        tokio::time::sleep(short * 2).await;
        if let Some(taken) = b.try_acquire(&key, long).await? {
            // Judged once the reply is in: a slow reply past the original's deadline
            // says nothing.
            ensure!(
                Instant::now() >= lease.valid_until(),
                "granted while the original lease (a reader's: {reader}) was in date, after \
                 a copy of it was extended to a shorter TTL"
            );
            b.release(taken).await?;
            return Err(Failure(
                "the original lease ran out before the check: a host too slow for this test".into(),
            ));
        }
        a.release(lease).await?;
    }
    Ok(())
}

/// After expiry and takeover, the old holder's release leaves the new owner's lock alone.
pub async fn releasing_a_stolen_lease_keeps_the_new_owner(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let old = must_acquire(&a, &key, ttl).await?;
    let new = b
        .acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(ttl * 4 + Duration::from_secs(2)),
        )
        .await?;
    match a.release(old).await {
        Ok(ReleaseOutcome::NotHeld) | Err(LockError::LeaseLost { .. }) => {}
        other => {
            return Err(Failure(format!(
                "stale release: expected NotHeld, got {other:?}"
            )))
        }
    }
    ensure!(
        holder(&b, &key).await? == Some(new.owner()),
        "stale release removed the new owner's lock"
    );
    b.release(new).await?;
    Ok(())
}

/// A client that crashes while holding (dropped: no release, no renewal) does not block
/// the key for longer than its TTL.
pub async fn crashed_client_is_freed(ctx: &Ctx<'_>) -> Outcome {
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    {
        let doomed = ctx.client().await?;
        let _lease = must_acquire(&doomed, &key, ttl).await?;
    } // the client and its lease are gone
    let survivor = ctx.client().await?;
    let lease = survivor
        .acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(ttl * 4 + Duration::from_secs(3)),
        )
        .await
        .map_err(|e| Failure(format!("the crashed holder's lock was never freed: {e}")))?;
    survivor.release(lease).await?;
    Ok(())
}

/// An `acquire` cancelled while waiting leaves no ghost waiter or lock behind.
pub async fn cancelled_acquire_leaves_no_ghost(ctx: &Ctx<'_>) -> Outcome {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let key = ctx.key("k");
    let held = must_acquire(&a, &key, LONG_TTL).await?;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        b.acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(20)),
        ),
    )
    .await;
    ensure!(
        cancelled.is_err(),
        "the waiting acquire returned: {cancelled:?}"
    );
    a.release(held).await?;
    // A ghost would hold or block the key for the 30 s TTL.
    let lease = c
        .acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(5)),
        )
        .await
        .map_err(|e| Failure(format!("a ghost blocks the key: {e}")))?;
    ensure!(
        holder(&c, &key).await? == Some(lease.owner()),
        "holder is not the new client"
    );
    c.release(lease).await?;
    Ok(())
}

/// Dropping a guard without `release` frees the lock long before its TTL.
pub async fn drop_without_release_frees_the_lock(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let guard = a.lock(&key, &AcquireOptions::new(LONG_TTL)).await?;
    drop(guard);
    let lease = b
        .acquire(
            &key,
            &AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(5)),
        )
        .await
        .map_err(|e| Failure(format!("dropped guard did not release: {e}")))?;
    b.release(lease).await?;
    Ok(())
}

/// A guard keeps the lock across several TTLs by renewing it.
pub async fn guard_renews_past_the_ttl(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = keepalive_ttl(ctx);
    let guard = a.lock(&key, &AcquireOptions::new(ttl)).await?;
    tokio::time::sleep(ttl * 2).await;
    ensure!(
        !guard.is_lost(),
        "guard lost: {:?}",
        guard.lost_signal().reason()
    );
    ensure!(
        b.try_acquire(&key, ttl).await?.is_none(),
        "lock expired under a renewing guard"
    );
    let outcome = guard.release().await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "release said {outcome:?}"
    );
    Ok(())
}

/// A grant that reaches its holder with less than a third of its TTL left (a slow reply,
/// a pause between `acquire` and the guard) is never reported held past its deadline:
/// the guard renews it at once, or reports it lost by then. Whenever the guard says
/// "held", its deadline is in the future; when it still holds at the end, the server
/// agrees.
pub async fn late_grant_is_never_held_past_its_deadline(ctx: &Ctx<'_>) -> Outcome {
    let (client, observer) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let lease = must_acquire(&client, &key, ttl).await?;
    let (owner, first_deadline) = (lease.owner(), lease.valid_until());
    // The reply "arrives" when only a quarter of the TTL is left.
    tokio::time::sleep(lease.remaining(Instant::now()).saturating_sub(ttl / 4)).await;
    let left = lease.remaining(Instant::now());
    ensure!(
        left < ttl / 3,
        "the late arrival left {left:?} of a {ttl:?} lease (not below a third)"
    );
    let guard = LockGuard::new(client.clone(), lease);
    let until = first_deadline + ttl;
    let mut renewed = false;
    loop {
        let now = Instant::now();
        let held = !guard.is_lost();
        let deadline = guard.deadline();
        ensure!(
            !held || now < deadline,
            "reported held {:?} past its deadline",
            now - deadline
        );
        renewed |= deadline > first_deadline;
        if now >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !guard.is_lost() {
        ensure!(renewed, "held past the first deadline without a renewal");
        let named = holder(&observer, &key).await?;
        // A renewal starved past the deadline meanwhile makes the guard report the loss.
        ensure!(
            named == Some(owner) || guard.is_lost(),
            "the guard says held but the server names {named:?}"
        );
    }
    let _ = guard.release().await;
    Ok(())
}

/// Cutting a holder's link makes its guard report loss, by its own deadline.
pub async fn lost_fires_when_the_link_is_cut(ctx: &Ctx<'_>) -> Outcome {
    let Some(client) = ctx.harness.cuttable_client().await? else {
        return Err(Failure(
            "harness declared link cutting but gave no client".into(),
        ));
    };
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let guard = client.lock.lock(&key, &AcquireOptions::new(ttl)).await?;
    let deadline = guard.lease().await.map(|l| l.valid_until());
    client.link.cut();
    let lost = tokio::time::timeout(ttl * 3, guard.lost()).await;
    client.link.heal();
    ensure!(
        lost.is_ok(),
        "guard did not report loss within 3×ttl of the cut"
    );
    ensure!(client.link.fired(), "the cut did not hold back any traffic");
    if let Some(deadline) = deadline {
        // Loss is reported when a renewal fails for good or at the latest at the (moving)
        // deadline.
        ensure!(
            Instant::now() <= deadline + ttl * 2,
            "loss reported long after the deadline"
        );
    }
    Ok(())
}

/// A holder whose link is black-holed while a waiter waits: its guard reports the loss,
/// and the waiter is granted the lock only after the holder's belief ended (the checker
/// sees no overlap and no belief past the server's promise) and after its lease's own
/// deadline, with a larger token that a fenced store uses to reject the stale holder's
/// write; the stale release, once the link heals, leaves the new holder's lock alone.
pub async fn blackholed_holder_is_taken_over_only_after_its_lease(ctx: &Ctx<'_>) -> Outcome {
    let Some(cut) = ctx.harness.cuttable_client().await? else {
        return Err(Failure(
            "harness declared link cutting but gave no client".into(),
        ));
    };
    let history = History::new();
    let holder = history.recorded(0, cut.lock);
    let waiter = history.recorded(1, ctx.client().await?);
    let key = ctx.key("k");
    let ttl = ctx.short_ttl();
    let fences = holder.capabilities().fencing != FencingKind::None;
    let register = FencedRegister::new();
    let guard = holder.lock(&key, &AcquireOptions::new(ttl)).await?;
    let stale = guard
        .lease()
        .await
        .ok_or_else(|| Failure("the guard had no lease right after the grant".into()))?;
    let seen_by_stale = register.read(stale.token())?;
    // Past any session the holder's lease rides on (a ZooKeeper session can be longer
    // than the TTL: 10 s by default on a user's cluster), however slowly the waiter
    // learns the lock is free. A correct backend is done long before.
    let patience = ttl * 4 + Duration::from_secs(30);
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let lease = waiter
                .acquire(&key, &AcquireOptions::new(LONG_TTL).wait(patience))
                .await;
            (lease, Instant::now())
        })
    };
    cut.link.cut();
    let lost = tokio::time::timeout(patience, guard.lost()).await;
    history.lost(0, Instant::now());
    let waited = waiting
        .await
        .map_err(|e| Failure(format!("waiter task: {e}")));
    cut.link.heal();
    ensure!(cut.link.fired(), "the cut did not hold back any traffic");
    ensure!(lost.is_ok(), "the guard never reported the loss");
    let (fresh, granted_at) = waited?;
    let fresh = fresh?;
    // The holder's last lease (its latest renewal's) bounds what the server may free.
    if let Some(last) = guard.lease().await {
        ensure!(
            granted_at >= last.valid_until(),
            "the waiter was granted {:?} before the stale holder's own deadline",
            last.valid_until() - granted_at
        );
    }
    if fences {
        ensure!(
            fresh.token() > stale.token(),
            "token {} after {}",
            fresh.token(),
            stale.token()
        );
        ensure!(
            register.stale_write_after_takeover(fresh.token(), stale.token(), seen_by_stale)?,
            "the fenced store accepted the stale holder's write"
        );
    }
    let released = guard.release().await;
    ensure!(
        matches!(released, Ok(ReleaseOutcome::NotHeld) | Err(_)),
        "the stale holder's release answered {released:?}"
    );
    let info = waiter.inspect(&key).await?;
    ensure!(
        info.is_some_and(|h| h.owner == fresh.owner()),
        "the stale release freed the new holder's lock"
    );
    waiter.release(fresh).await?;
    // Judged after the stale release: had it freed the new lock, the checker would see
    // the waiter's hold end early, and a later one overlap.
    let report = history.check();
    ensure!(report.is_safe(), "{report}");
    let waiter_holds = history.holds().iter().filter(|h| h.client == 1).count();
    ensure!(
        waiter_holds == 1,
        "the waiter was granted {waiter_holds} times"
    );
    Ok(())
}

/// Waiters queued one after another get the lock in that order (backends declaring FIFO),
/// each with a larger token, one holder at a time, and leave nothing queued. Where the
/// harness can count a key's queue ([`Harness::queued`]), sixteen waiters each start once
/// the one before is queued; otherwise five, 150 ms apart.
pub async fn waiters_are_served_fifo(ctx: &Ctx<'_>) -> Outcome {
    let key = ctx.key("k");
    let counted = ctx.harness.queued(&key).await.is_some();
    let waiters = if counted { 16 } else { 5 };
    let history = History::new();
    let holder: Arc<dyn DistributedLock> = history.recorded(0, ctx.client().await?);
    let held = must_acquire(&holder, &key, LONG_TTL).await?;
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let lock = history.recorded(i + 1, ctx.client().await?);
        let (mine, served) = (key.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(60));
            let lease = lock.acquire(&mine, &opts).await?;
            (served.lock().unwrap_or_else(PoisonError::into_inner)).push((i, lease.token()));
            tokio::time::sleep(Duration::from_millis(5)).await;
            lock.release(lease).await
        }));
        match counted {
            // The holder and waiters 0..=i.
            true => queue_reaches(ctx, &key, |n| n > i + 1, "waiter queued").await?,
            false => tokio::time::sleep(Duration::from_millis(150)).await,
        }
    }
    if counted {
        let queued = ctx.harness.queued(&key).await;
        ensure!(
            matches!(queued, Some(Ok(n)) if n == waiters + 1),
            "the holder and {waiters} waiters queued, but the queue counts {queued:?}"
        );
    }
    let released = holder.release(held.clone()).await?;
    ensure!(released == ReleaseOutcome::Released, "holder: {released:?}");
    for (i, task) in tasks.into_iter().enumerate() {
        let released = task.await.map_err(|e| Failure(format!("task: {e}")))??;
        ensure!(
            released == ReleaseOutcome::Released,
            "waiter {i}: {released:?}"
        );
    }
    let served = served
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let order: Vec<usize> = served.iter().map(|&(i, _)| i).collect();
    ensure!(
        order == (0..waiters).collect::<Vec<_>>(),
        "declared FIFO but served in order {order:?}"
    );
    let tokens: Vec<_> = std::iter::once(held.token())
        .chain(served.iter().map(|&(_, token)| token))
        .collect();
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens do not increase in the order served: {tokens:?}"
    );
    let report = history.check();
    ensure!(report.is_safe(), "{report}");
    ensure!(
        history.holds().len() == waiters + 1,
        "{} grants recorded, {} expected",
        history.holds().len(),
        waiters + 1
    );
    if counted {
        queue_reaches(ctx, &key, |n| n == 0, "nothing left queued").await?;
    }
    Ok(())
}

/// Polls [`Harness::queued`] for `key` (every 10 ms, for up to 10 s) until `done`.
pub(super) async fn queue_reaches(
    ctx: &Ctx<'_>,
    key: &LockKey,
    done: impl Fn(usize) -> bool,
    what: &str,
) -> Outcome {
    let started = Instant::now();
    loop {
        let last = ctx.harness.queued(key).await;
        match last {
            Some(Ok(n)) if done(n) => return Ok(()),
            _ if started.elapsed() > Duration::from_secs(10) => {
                return Err(Failure(format!("{what}: not within 10 s (last: {last:?})")))
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Many keys, several clients, interleaved try/release: no errors, every lock freed.
pub async fn many_keys_stress(ctx: &Ctx<'_>) -> Outcome {
    const KEYS: usize = 60;
    let keys: Arc<Vec<LockKey>> = Arc::new((0..KEYS).map(|i| ctx.key(&format!("k{i}"))).collect());
    let mut tasks = Vec::new();
    for client in 0..3 {
        let lock = ctx.client().await?;
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut granted = Vec::new();
            for round in 0..3 {
                for i in 0..KEYS {
                    let key = &keys[(i * 7 + client * 13 + round) % KEYS];
                    if let Some(lease) = lock.try_acquire(key, LONG_TTL).await? {
                        granted.push((key.clone(), lease.token()));
                        lock.release(lease).await?;
                    }
                }
            }
            Ok::<_, LockError>(granted)
        }));
    }
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.map_err(|e| Failure(format!("task: {e}")))??);
    }
    ensure!(
        grants.len() >= KEYS,
        "only {} grants over {KEYS} keys",
        grants.len()
    );
    grants.sort();
    ensure!(
        grants.windows(2).all(|w| w[0] != w[1]),
        "a token was issued twice for one key"
    );
    let lock = ctx.client().await?;
    for key in keys.iter() {
        ensure!(
            lock.inspect(key).await?.is_none(),
            "`{key}` still held after the stress"
        );
    }
    Ok(())
}

/// A [`Semaphore`] of `permits` on a fresh client.
async fn semaphore(ctx: &Ctx<'_>, permits: u32) -> Result<Semaphore, Failure> {
    Ok(Semaphore::new(ctx.client().await?, permits)?)
}

/// A semaphore of 3 admits exactly 3 holders at once, one per permit; under contention
/// never more than 3 hold, and each permit's tokens strictly increase.
pub async fn semaphore_admits_its_permits_and_no_more(ctx: &Ctx<'_>) -> Outcome {
    const PERMITS: u32 = 3;
    const TASKS: usize = 6;
    const ROUNDS: usize = 4;
    let name = ctx.key("jobs");
    let mut first = Vec::new();
    for _ in 0..PERMITS {
        let s = semaphore(ctx, PERMITS).await?;
        let lease = s.try_acquire(&name, LONG_TTL).await?;
        let lease = lease.ok_or_else(|| Failure("a free permit was refused".into()))?;
        first.push((s, lease));
    }
    let mut keys: Vec<_> = first.iter().map(|(_, l)| l.key().clone()).collect();
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == 3, "3 holders share permits: {keys:?}");
    let extra = semaphore(ctx, PERMITS).await?;
    ensure!(
        extra.try_acquire(&name, LONG_TTL).await?.is_none(),
        "a 4th holder was admitted by a semaphore of 3"
    );
    let mut listed: Vec<_> = extra
        .holders(&name)
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    listed.sort();
    ensure!(
        listed == keys,
        "holders() lists {listed:?}, not the 3 held permits {keys:?}"
    );
    for (s, lease) in first {
        s.release(lease).await?;
    }

    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let s = semaphore(ctx, PERMITS).await?;
        let (name, inside, most, tokens) =
            (name.clone(), inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(20));
            for _ in 0..ROUNDS {
                let lease = s.acquire(&name, &opts).await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let before = tokens
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(lease.key().clone(), lease.token());
                ensure!(
                    before.is_none_or(|t| t < lease.token()),
                    "{}: token {} after {before:?}",
                    lease.key(),
                    lease.token()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                s.release(lease).await?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| Failure(format!("task: {e}")))??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(most <= 3, "{most} holders at once with 3 permits");
    Ok(())
}

/// A crashed holder's permits come back when its leases end.
pub async fn semaphore_permit_of_a_crashed_holder_comes_back(ctx: &Ctx<'_>) -> Outcome {
    let name = ctx.key("jobs");
    let ttl = ctx.short_ttl();
    {
        let doomed = semaphore(ctx, 2).await?;
        for _ in 0..2 {
            let lease = doomed.try_acquire(&name, ttl).await?;
            ensure!(lease.is_some(), "a free permit was refused");
            std::mem::forget(lease);
        }
    } // the client is gone, its permits never released
    let survivor = semaphore(ctx, 2).await?;
    let opts = AcquireOptions::new(LONG_TTL).wait(ttl * 4 + Duration::from_secs(3));
    let lease = survivor
        .acquire(&name, &opts)
        .await
        .map_err(|e| Failure(format!("the crashed holder's permits never came back: {e}")))?;
    survivor.release(lease).await?;
    Ok(())
}

/// A waiter on a full semaphore gets the permit another holder releases, long before
/// the holders' TTL.
pub async fn semaphore_waiter_gets_a_released_permit(ctx: &Ctx<'_>) -> Outcome {
    let name = ctx.key("jobs");
    let (a, b) = (semaphore(ctx, 2).await?, semaphore(ctx, 2).await?);
    let first = a.try_acquire(&name, LONG_TTL).await?;
    let second = a.try_acquire(&name, LONG_TTL).await?;
    let (Some(first), Some(second)) = (first, second) else {
        return Err(Failure("a free permit was refused".into()));
    };
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(20));
        let lease = b.acquire(&name, &opts).await;
        (b, lease)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    if waiter.is_finished() {
        let (_, early) = waiter.await.map_err(|e| Failure(format!("waiter: {e}")))?;
        return Err(Failure(format!(
            "the waiter returned while the semaphore was full: {early:?}"
        )));
    }
    let released = second.key().clone();
    a.release(second).await?;
    let (b, lease) = waiter.await.map_err(|e| Failure(format!("waiter: {e}")))?;
    let lease = lease.map_err(|e| Failure(format!("the waiter never got the permit: {e}")))?;
    ensure!(
        *lease.key() == released,
        "the waiter got {} while only {released} was free",
        lease.key()
    );
    ensure!(
        started.elapsed() < LONG_TTL / 2,
        "the waiter waited {:?}: as if for the TTL",
        started.elapsed()
    );
    b.release(lease).await?;
    a.release(first).await?;
    Ok(())
}

/// Two holders of a semaphore of 2: a run giving 3 is refused (the count's error, naming
/// both counts) and holds nothing, also when it would wait; a run giving 2 waits, and gets
/// the permit a holder releases.
pub async fn semaphore_runs_that_disagree_on_the_count_are_refused(ctx: &Ctx<'_>) -> Outcome {
    let name = ctx.key("pm");
    let (two, three) = (semaphore(ctx, 2).await?, semaphore(ctx, 3).await?);
    let mut held = Vec::new();
    for _ in 0..2 {
        let lease = two.try_acquire(&name, LONG_TTL).await?;
        held.push(lease.ok_or_else(|| Failure("a free permit was refused".into()))?);
    }
    for wait in [Duration::ZERO, Duration::from_secs(5)] {
        let opts = AcquireOptions::new(LONG_TTL).wait(wait);
        let started = Instant::now();
        match three.acquire(&name, &opts).await {
            Err(LockError::Config(message)) => ensure!(
                message.contains("2 permits") && message.contains("gives 3"),
                "the refusal does not name both counts: {message}"
            ),
            other => return Err(Failure(format!("a run of 3 beside 2 of 2: {other:?}"))),
        }
        ensure!(
            started.elapsed() < Duration::from_secs(4),
            "the refusal came after {:?}: it waited",
            started.elapsed()
        );
    }
    let third = three.permit_key(&name, 2)?;
    ensure!(
        holder(&ctx.client().await?, &third).await?.is_none(),
        "the refused run left {third} held"
    );
    let waiter = tokio::spawn({
        let (other, name) = (semaphore(ctx, 2).await?, name.clone());
        async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(20));
            let lease = other.acquire(&name, &opts).await;
            (other, lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "a run of 2 beside 2 of 2 did not wait"
    );
    two.release(held.pop().expect("two held")).await?;
    let (other, lease) = waiter.await.map_err(|e| Failure(format!("waiter: {e}")))?;
    let lease = lease.map_err(|e| Failure(format!("the run of 2 never got the permit: {e}")))?;
    other.release(lease).await?;
    two.release(held.pop().expect("one held")).await?;
    Ok(())
}

/// A grant's label is what `inspect` reports while it is held — also a label full of the
/// separators backends store it with, a longest one, after an extension to a longer TTL,
/// one granted after a wait, and a permit's — and a grant without a label reports none.
pub async fn labels_are_reported_while_held(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("labelled");
    let mut longest = "é".repeat(tenure_api::MAX_LABEL / 2 - 1);
    longest.push_str("::");
    for label in [
        "worker-1",
        "host:4711:pid:9 {x}#permit-0 ",
        longest.as_str(),
    ] {
        let opts = AcquireOptions::new(LONG_TTL)
            .wait(Duration::ZERO)
            .label(label);
        let mut lease = a.acquire(&key, &opts).await?;
        // Extensions keep it, also to a longer TTL (which etcd makes by a new lease).
        a.extend(&mut lease, LONG_TTL * 2).await?;
        let seen = a
            .inspect(&key)
            .await?
            .ok_or_else(|| Failure("held, inspected as free".into()))?;
        ensure!(
            seen.owner == lease.owner(),
            "inspect named {} for {}",
            seen.owner,
            lease.owner()
        );
        ensure!(
            seen.label.as_deref() == Some(label),
            "label {label:?} read back as {:?}",
            seen.label
        );
        a.release(lease).await?;
    }
    let plain = must_acquire(&a, &key, LONG_TTL).await?;
    let seen = a.inspect(&key).await?.map(|h| h.label);
    ensure!(
        seen == Some(None),
        "an unlabelled grant inspected as {seen:?}"
    );
    // A waiter's label is the one recorded when its turn comes.
    let waiter = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let opts = AcquireOptions::new(LONG_TTL)
                .wait(Duration::from_secs(20))
                .label("standby");
            b.acquire(&key, &opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.release(plain).await?;
    let waited = waiter
        .await
        .map_err(|e| Failure(format!("waiter: {e}")))??;
    let seen = a.inspect(&key).await?;
    ensure!(
        seen.as_ref().and_then(|h| h.label.as_deref()) == Some("standby"),
        "the waiter's grant inspected as {seen:?}"
    );
    b.release(waited).await?;
    // A permit carries its holder's label too.
    let permits = semaphore(ctx, 2).await?;
    let name = ctx.key("labelled-permits");
    let opts = AcquireOptions::new(LONG_TTL)
        .wait(Duration::ZERO)
        .label("uploader");
    let permit = permits.acquire(&name, &opts).await?;
    let holders = permits.holders(&name).await?;
    ensure!(
        holders.len() == 1 && holders[0].1.label.as_deref() == Some("uploader"),
        "the permit's holders read {holders:?}"
    );
    permits.release(permit).await?;
    Ok(())
}

/// An empty label, one too long and one with a control character are refused as invalid
/// input, and leave the key free.
pub async fn bad_labels_are_refused_and_grant_nothing(ctx: &Ctx<'_>) -> Outcome {
    let lock = ctx.client().await?;
    let key = ctx.key("badly-labelled");
    let long = "x".repeat(tenure_api::MAX_LABEL + 1);
    for label in ["", long.as_str(), "line\nbreak", "nul\0"] {
        let opts = AcquireOptions::new(LONG_TTL)
            .wait(Duration::ZERO)
            .label(label);
        match lock.acquire(&key, &opts).await {
            Err(LockError::InvalidInput(_)) => {}
            other => return Err(Failure(format!("label {label:?}: {other:?}"))),
        }
        let holder = holder(&lock, &key).await?;
        ensure!(
            holder.is_none(),
            "a refused label left `{key}` held by {holder:?}"
        );
    }
    Ok(())
}

/// Three candidates campaign for one name three times each: one leader at a time, each
/// reported by `leader` with its value and term while it leads, and the terms strictly
/// increase from leader to leader.
pub async fn election_has_one_leader_at_a_time(ctx: &Ctx<'_>) -> Outcome {
    let name = ctx.key("leader");
    let leading = Arc::new(AtomicU64::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for i in 0..3 {
        let election = Election::new(ctx.client().await?)?;
        let (name, leading, terms) = (name.clone(), leading.clone(), terms.clone());
        candidates.push(tokio::spawn(async move {
            let value = format!("candidate-{i}");
            for _ in 0..3 {
                let leadership = election
                    .campaign(&name, &value, Duration::from_secs(20))
                    .await?;
                let others = leading.fetch_add(1, Ordering::SeqCst);
                terms
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((leadership.term(), others));
                let seen = election.leader(&name).await?;
                let expected = (value.as_str(), leadership.term());
                if seen.as_ref().map(|l| (l.value.as_str(), l.term)) != Some(expected) {
                    return Err(Failure(format!("{value} leads; leader() said {seen:?}")));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await?;
            }
            Ok::<_, Failure>(())
        }));
    }
    for candidate in candidates {
        candidate
            .await
            .map_err(|e| Failure(format!("candidate: {e}")))??;
    }
    let terms = terms.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(terms.len() == 9, "{} terms of 9", terms.len());
    ensure!(
        terms.iter().all(|(_, others)| *others == 0),
        "two leaders at once: {terms:?}"
    );
    ensure!(
        terms.windows(2).all(|w| w[0].0 < w[1].0),
        "terms did not increase from leader to leader: {terms:?}"
    );
    Ok(())
}

/// An observer sees the vacancy, then leaders a, b and c in that order, with their terms;
/// each leader resigns once it has been observed. Where the backend pushes its holders
/// ([`DistributedLock::holder_changes`]), the observer would otherwise read only once an
/// hour, so every leader must be pushed. (How briefly a leader may lead and still be seen
/// is each feed's own promise — etcd's: however briefly, which its tests check;
/// ZooKeeper's: as long as it takes to read its node.)
pub async fn election_observers_see_each_leader_in_order(ctx: &Ctx<'_>) -> Outcome {
    let name = ctx.key("observed");
    let election = Election::new(ctx.client().await?)?;
    let observer = ctx.client().await?;
    let pushed = observer.holder_changes(&name).is_some();
    let every = match pushed {
        true => Duration::from_secs(3600),
        false => Duration::from_millis(50),
    };
    let mut changes = Election::new(observer)?.observe(&name, every);
    let first = next_change(&mut changes).await?;
    ensure!(first.is_none(), "a fresh name observed as led by {first:?}");
    let (observed, mut observed_rx) = tokio::sync::watch::channel(0usize);
    let leaders = tokio::spawn(async move {
        let mut terms = Vec::new();
        for (i, value) in ["a", "b", "c"].into_iter().enumerate() {
            let leadership = election
                .campaign(&name, value, Duration::from_secs(10))
                .await?;
            terms.push(leadership.term());
            let seen = observed_rx.wait_for(|n| *n > i);
            if tokio::time::timeout(Duration::from_secs(20), seen)
                .await
                .is_err()
            {
                return Err(Failure(format!("leader {value} was not observed in 20 s")));
            }
            leadership.resign().await?;
        }
        Ok::<_, Failure>(terms)
    });
    let mut seen = Vec::new();
    while seen.len() < 3 {
        if let Some(leader) = next_change(&mut changes).await? {
            seen.push((leader.value, leader.term));
            observed.send_replace(seen.len());
        }
    }
    let terms = leaders
        .await
        .map_err(|e| Failure(format!("leaders: {e}")))??;
    let expected: Vec<(String, _)> = ["a", "b", "c"]
        .iter()
        .map(|v| v.to_string())
        .zip(terms)
        .collect();
    ensure!(seen == expected, "observed {seen:?}, led {expected:?}");
    Ok(())
}

/// The next change an observer gives, within 20 s.
async fn next_change(
    changes: &mut futures::stream::BoxStream<'static, Result<Option<Leader>, LockError>>,
) -> Result<Option<Leader>, Failure> {
    use futures::StreamExt;
    match tokio::time::timeout(Duration::from_secs(20), changes.next()).await {
        Ok(Some(Ok(change))) => Ok(change),
        Ok(Some(Err(e))) => Err(Failure(format!("observing failed: {e}"))),
        Ok(None) => Err(Failure("the observation ended".into())),
        Err(_) => Err(Failure("no change observed within 20 s".into())),
    }
}
