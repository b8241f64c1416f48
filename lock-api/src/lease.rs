//! What a successful acquire hands back: a [`Lease`] with its [`FencingToken`].

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::{LockError, LockKey};

/// A number that strictly increases with every grant of the same key, across release,
/// expiry and client crashes. Pass it to the resource you protect and have the resource
/// reject any write carrying a token lower than the highest it has seen: that is what
/// keeps a paused or partitioned former holder from doing damage.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The raw value.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Who holds a lease: 128 random bits from the OS CSPRNG, fresh for every acquire call
/// and reused by that call's retries, so a retry after a lost reply is recognised as ours.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub [u8; 16]);

impl OwnerId {
    /// A new random owner id.
    ///
    /// # Panics
    /// Never in practice: if the OS random source fails, it falls back to `rand`'s
    /// thread-local generator (itself seeded from the OS).
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            bytes = rand::random();
        }
        Self(bytes)
    }

    /// The 32-character lowercase hex form (as `Display` writes it), without allocating.
    pub fn hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, byte) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(byte >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
        }
        out
    }

    /// An owner id for a record that names none (another recipe's): derived from the
    /// record's `name` with FNV-1a, the same in every build and on every host.
    pub fn derived(name: &[u8]) -> Self {
        let fnv = |basis: u64| {
            name.iter().fold(basis, |hash, byte| {
                (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
        bytes[8..].copy_from_slice(&fnv(0x8422_2325_cbf2_9ce4).to_be_bytes());
        Self(bytes)
    }

    /// Parses the 32-character lowercase hex form produced by `Display`.
    pub fn parse(text: &str) -> Result<Self, LockError> {
        let bad = || LockError::backend(format!("malformed owner id {text:?}"));
        if text.len() != 32 || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

/// Small backend-specific data a lease carries, so `Lease` stays plain data: the etcd
/// lease id and key revision, the ZooKeeper node path, the Postgres slot, and so on.
/// Backends define what each field means for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseHandle {
    /// A backend path or key name (ZooKeeper node path, etcd key).
    pub path: String,
    /// A backend id (etcd lease id, Postgres slot).
    pub id: i64,
    /// A backend revision (etcd create revision).
    pub revision: i64,
}

/// A held lock: plain data that identifies the grant. Pass it back to
/// [`crate::DistributedLock::extend`] and [`crate::DistributedLock::release`].
///
/// The deadline is conservative: it counts from the moment the acquire request was
/// *sent* (not when the reply arrived) and subtracts an allowance for clock drift, so
/// while `valid_until` has not passed on the local clock the server still considers
/// the lock ours (under the backend's timing assumptions).
#[derive(Clone, Debug)]
pub struct Lease {
    key: LockKey,
    owner: OwnerId,
    token: FencingToken,
    acquired_at: Instant,
    valid_until: Instant,
    ttl: Duration,
    handle: LeaseHandle,
    tie: Option<LeaseTie>,
    shared: bool,
}

impl Lease {
    /// Builds a lease granted with `ttl` by a request sent at `sent_at`; the deadline is
    /// `sent_at + ttl - drift`.
    pub fn new(
        key: LockKey,
        owner: OwnerId,
        token: FencingToken,
        sent_at: Instant,
        ttl: Duration,
        drift: Duration,
    ) -> Self {
        Self {
            key,
            owner,
            token,
            acquired_at: sent_at,
            valid_until: deadline(sent_at, ttl, drift),
            ttl,
            handle: LeaseHandle::default(),
            tie: None,
            shared: false,
        }
    }

    /// Marks the lease as a shared grant: one reader's hold on a key it may share with
    /// other readers ([`crate::DistributedLock::acquire_shared`]). Backends set it on
    /// what `acquire_shared` returns.
    pub fn into_shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Whether this is a shared grant (a reader's, from
    /// [`crate::DistributedLock::acquire_shared`]) rather than the key's one exclusive
    /// holder.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Ties the lease to a backend resource (see [`LeaseTie`]).
    pub fn with_tie(mut self, tie: LeaseTie) -> Self {
        self.tie = Some(tie);
        self
    }

    /// Fires as soon as the backend learns the lease is gone (a closed connection), where
    /// the backend can tell; [`crate::LockGuard`] reports it at once.
    pub fn loss_notice(&self) -> Option<&LossNotice> {
        self.tie.as_ref().map(|t| &t.inner.lost)
    }

    /// The same grant under another token. Only for tests of deliberately broken
    /// fencing (a wrapper handing out tokens of its own); backends never need it.
    #[doc(hidden)]
    pub fn with_token(mut self, token: FencingToken) -> Self {
        self.token = token;
        self
    }

    /// Attaches backend data.
    pub fn with_handle(mut self, handle: LeaseHandle) -> Self {
        self.handle = handle;
        self
    }

    /// Records a successful extension whose request was sent at `sent_at`.
    pub fn renewed(&mut self, sent_at: Instant, ttl: Duration, drift: Duration) {
        self.valid_until = deadline(sent_at, ttl, drift);
        self.ttl = ttl;
    }

    /// Moves the local deadline `by` earlier (never before [`acquired_at`](Self::acquired_at)):
    /// an extra allowance for clock drift or pauses, applied by wrappers.
    pub fn tighten(&mut self, by: Duration) {
        self.valid_until = self
            .valid_until
            .checked_sub(by)
            .map_or(self.acquired_at, |at| at.max(self.acquired_at));
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner id this grant was made to.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the acquire request was sent (local monotonic clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The local deadline after which the lease must be presumed lost.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The TTL of the last grant or extension.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Time left before `valid_until`, as seen at `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.valid_until.saturating_duration_since(now)
    }

    /// Backend data.
    pub fn handle(&self) -> &LeaseHandle {
        &self.handle
    }
}

/// Fired by a backend the moment it learns a lease is gone (e.g. the connection whose
/// transaction held the lock closed), with the reason. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct LossNotice {
    token: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl LossNotice {
    /// A notice not yet fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the notice (the first reason wins).
    pub fn fire(&self, reason: impl Into<String>) {
        let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        drop(slot);
        self.token.cancel();
    }

    /// True once fired.
    pub fn is_fired(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The reason, once fired.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Completes when the notice fires.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn fired(&self) {
        self.token.cancelled().await
    }
}

/// A backend's live link to a lease, carried by every clone of the [`Lease`]: its
/// [`LossNotice`], and a [`LeaseDropped`] signal that completes once every clone of the
/// lease is gone (so the backend can reclaim what the lease held).
#[derive(Clone, Debug)]
pub struct LeaseTie {
    inner: Arc<TieInner>,
}

#[derive(Debug)]
struct TieInner {
    lost: LossNotice,
    dropped: CancellationToken,
}

impl Drop for TieInner {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

impl LeaseTie {
    /// A tie reporting through `lost`, and the signal of its last clone's drop.
    pub fn new(lost: LossNotice) -> (Self, LeaseDropped) {
        let dropped = CancellationToken::new();
        let tie = Self {
            inner: Arc::new(TieInner {
                lost,
                dropped: dropped.clone(),
            }),
        };
        (tie, LeaseDropped(dropped))
    }
}

/// Completes once every clone of a tied [`Lease`] has been dropped.
#[derive(Clone, Debug)]
pub struct LeaseDropped(CancellationToken);

impl LeaseDropped {
    /// True once every clone of the lease is gone.
    pub fn is_dropped(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Completes once every clone of the lease is gone.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn wait(&self) {
        self.0.cancelled().await
    }
}

/// `sent_at + ttl - drift`, never earlier than `sent_at`.
pub fn deadline(sent_at: Instant, ttl: Duration, drift: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift)
}

/// The default clock-drift allowance for a TTL: 1 % of it plus 2 ms (the Redlock paper's
/// rule), used by backends whose expiry runs on another machine's clock.
pub fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How backends that keep one text per grant store its holder: the owner id's hex form,
/// then `:` and the label if the grant has one ([`crate::AcquireOptions::label`]).
pub fn holder_text(owner: OwnerId, label: Option<&str>) -> String {
    match label {
        Some(label) => format!("{owner}:{label}"),
        None => owner.to_string(),
    }
}

/// Parses what [`holder_text`] wrote: the owner id and the label, if any.
pub fn parse_holder_text(text: &str) -> Result<(OwnerId, Option<String>), LockError> {
    match text.split_once(':') {
        Some((owner, label)) => Ok((OwnerId::parse(owner)?, Some(label.to_owned()))),
        None => Ok((OwnerId::parse(text)?, None)),
    }
}

/// What [`crate::DistributedLock::release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock was ours and is now free.
    Released,
    /// The lock was no longer ours (expired, or taken over): nothing was deleted.
    NotHeld,
}

/// Who holds a key now, for inspection and monitoring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's owner id.
    pub owner: OwnerId,
    /// The holder's fencing token, where the backend can tell it.
    pub token: Option<FencingToken>,
    /// Time left before the server frees the lock, where it has a TTL.
    pub remaining: Option<Duration>,
    /// The label the holder acquired with ([`AcquireOptions::label`](crate::AcquireOptions::label)),
    /// if any; for a foreign holder, what its record holds, as text.
    pub label: Option<String>,
    /// Held by a client of another recipe sharing the lock (`etcdctl lock`, Curator,
    /// kazoo, …), as far as the backend can tell from its record: `owner` is then the
    /// UUID the record names, else [`OwnerId::derived`] from the record's name.
    pub foreign: bool,
}
