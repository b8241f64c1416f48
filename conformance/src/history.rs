//! The history checker: what clients believed, on one monotonic clock, turned into
//! verdicts — mutual exclusion, token order, and a fenced register that must lose no
//! update.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tenure_api::{
    async_trait, AcquireOptions, Capabilities, DistributedLock, FencingToken, HolderInfo, Lease,
    LockError, LockKey, LostSignal, OwnerId, ReleaseOutcome,
};

/// How far a believed hold may reach past what the server promised before the checker
/// calls it a violation: the wrapper reads the clock a little before the backend does.
const PROMISE_SLACK: Duration = Duration::from_millis(5);

/// One grant as a client experienced it. Times are offsets from the history's origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    /// Which client held it. Holds are told apart by client, never by owner id: two
    /// clients that share an owner id are still two holders.
    pub client: usize,
    /// The grant's owner id.
    pub owner: OwnerId,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// When the acquire call was made.
    pub acquire_invoked: Duration,
    /// When the acquire call returned the lease.
    pub acquire_completed: Duration,
    /// When the client stopped believing it held the lock: the release call, the loss
    /// signal, or the lease's local deadline, whichever came first.
    pub believed_until: Duration,
    /// The lease's local deadline (the backend's `valid_until`, after its last renewal).
    pub deadline: Duration,
    /// What the server promised, measured by the checker rather than the backend: the
    /// invocation of the last single-attempt grant or renewal plus its TTL. `None` when
    /// the grant came from a waiting `acquire` (its attempts are not visible).
    pub promised_until: Option<Duration>,
}

/// A hold being recorded: the hold, and whether its belief ended before the deadline.
#[derive(Clone, Debug)]
struct Entry {
    hold: Hold,
    ended: Option<Duration>,
}

impl Entry {
    fn finished(&self) -> Hold {
        let mut hold = self.hold.clone();
        hold.believed_until = self.ended.map_or(hold.deadline, |e| e.min(hold.deadline));
        hold
    }
}

/// A shared, append-only record of holds.
#[derive(Clone, Debug)]
pub struct History {
    origin: Instant,
    holds: Arc<Mutex<Vec<Entry>>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            holds: Arc::default(),
        }
    }

    /// `at` as an offset on this history's clock.
    pub fn offset(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a hold. `believed_until` is capped at the lease's local deadline: a client
    /// may not believe in a lease past it.
    ///
    /// # Panics
    /// If `acquire_invoked` precedes the history's creation: every offset would collapse
    /// to zero and the checks would prove nothing. Create the history before the first
    /// acquire it records.
    pub fn record(
        &self,
        client: usize,
        lease: &Lease,
        acquire_invoked: Instant,
        acquire_completed: Instant,
        believed_until: Instant,
    ) {
        let ended = Some(self.offset(believed_until));
        self.open(
            client,
            lease,
            acquire_invoked,
            acquire_completed,
            None,
            ended,
        );
    }

    fn open(
        &self,
        client: usize,
        lease: &Lease,
        invoked: Instant,
        completed: Instant,
        promised_ttl: Option<Duration>,
        ended: Option<Duration>,
    ) {
        assert!(
            invoked >= self.origin,
            "History: the acquire was invoked before the history was created"
        );
        let deadline = self.offset(lease.valid_until());
        let hold = Hold {
            client,
            owner: lease.owner(),
            token: lease.token(),
            acquire_invoked: self.offset(invoked),
            acquire_completed: self.offset(completed),
            believed_until: deadline,
            deadline,
            promised_until: promised_ttl.map(|ttl| self.offset(invoked) + ttl),
        };
        self.entries().push(Entry { hold, ended });
    }

    /// Applies `f` to the latest hold of `client` with `token`, if any.
    fn update(&self, client: usize, token: FencingToken, f: impl FnOnce(&mut Entry)) {
        let mut entries = self.entries();
        let latest = entries
            .iter_mut()
            .rev()
            .find(|e| e.hold.client == client && e.hold.token == token);
        if let Some(entry) = latest {
            f(entry);
        }
    }

    /// Records that `client` learned at `at` that its lease was lost (its guard's lost
    /// signal fired): every hold it still believed in ends there.
    pub fn lost(&self, client: usize, at: Instant) {
        let at = self.offset(at);
        for entry in self.entries().iter_mut() {
            if entry.hold.client == client && entry.ended.is_none() {
                entry.ended = Some(at);
            }
        }
    }

    /// Records `client`'s loss (as [`History::lost`]) when `signal`, its guard's lost
    /// signal, fires. Await the handle before checking a history that needs the loss.
    pub fn lost_on(&self, client: usize, signal: LostSignal) -> tokio::task::JoinHandle<()> {
        let history = self.clone();
        tokio::spawn(async move {
            signal.lost().await;
            history.lost(client, Instant::now());
        })
    }

    /// Whether `client` believed at `at` that it held the lock (a hold still open counts
    /// until its deadline).
    pub fn believed_at(&self, client: usize, at: Instant) -> bool {
        let at = self.offset(at);
        self.holds()
            .iter()
            .any(|h| h.client == client && h.acquire_completed <= at && at < h.believed_until)
    }

    /// A client whose every call is recorded as `client` in this history.
    pub fn recorded(&self, client: usize, inner: Arc<dyn DistributedLock>) -> Arc<Recorded> {
        Arc::new(Recorded {
            inner,
            client,
            history: self.clone(),
        })
    }

    /// A copy of the holds recorded so far (an open hold believed until its deadline).
    pub fn holds(&self) -> Vec<Hold> {
        self.entries().iter().map(Entry::finished).collect()
    }

    /// Checks the history.
    pub fn check(&self) -> Report {
        check(&self.holds())
    }
}

/// A [`DistributedLock`] that records every grant, renewal and release of one client in a
/// [`History`], so the checker judges what the client was told, on its own clock, without
/// trusting the backend's bookkeeping. Hand it to a [`tenure_api::LockGuard`] to record a
/// renewing holder.
#[derive(Debug)]
pub struct Recorded {
    inner: Arc<dyn DistributedLock>,
    client: usize,
    history: History,
}

impl Recorded {
    /// The client id its calls are recorded under.
    pub fn client(&self) -> usize {
        self.client
    }

    /// Records the grant of an acquire invoked at `invoked` that returned `result`.
    fn opened(
        &self,
        invoked: Instant,
        result: Result<Lease, LockError>,
    ) -> Result<Lease, LockError> {
        if let Ok(lease) = &result {
            let completed = Instant::now();
            self.history
                .open(self.client, lease, invoked, completed, None, None);
        }
        result
    }
}

#[async_trait]
impl DistributedLock for Recorded {
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let invoked = Instant::now();
        let result = self.inner.try_acquire(key, ttl).await;
        if let Ok(Some(lease)) = &result {
            let completed = Instant::now();
            self.history
                .open(self.client, lease, invoked, completed, Some(ttl), None);
        }
        result
    }

    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        let invoked = Instant::now();
        self.opened(invoked, self.inner.acquire(key, opts).await)
    }

    async fn acquire_any(
        &self,
        keys: &[LockKey],
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let invoked = Instant::now();
        self.opened(invoked, self.inner.acquire_any(keys, opts).await)
    }

    /// Recorded as any hold: the checker takes every hold for exclusive, so a history
    /// may hold at most one reader of a key at a time (a paused reader against writers).
    /// [`capabilities`](DistributedLock::capabilities) says `shared: false`, so that
    /// `RwLock`, `MultiLock::shared` and the suite's read-write scenarios refuse a
    /// recorded client rather than record readers side by side.
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        let invoked = Instant::now();
        self.opened(invoked, self.inner.acquire_shared(key, opts).await)
    }

    fn holder_changes(&self, key: &LockKey) -> Option<tenure_api::HolderFeed> {
        self.inner.holder_changes(key)
    }

    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        let invoked = Instant::now();
        let before = lease.token();
        let result = self.inner.extend(lease, ttl).await;
        if result.is_ok() {
            // An extended lease is one hold since its grant: even after a release or a
            // loss, a successful extend tells the client it held all along (a correct
            // backend extends only what nobody else was granted meanwhile).
            let history = &self.history;
            let deadline = history.offset(lease.valid_until());
            let sent = history.offset(invoked);
            history.update(self.client, before, |entry| {
                match entry.ended {
                    // A renewal already on its way when the client gave up: the client
                    // (its guard) no longer believes, whatever the answer.
                    Some(ended) if sent < ended => return,
                    // An extend of a lease the client had released or lost: it now
                    // believes it held all along.
                    Some(_) => entry.ended = None,
                    None => {}
                }
                entry.hold.deadline = deadline;
                entry.hold.promised_until = Some(sent + ttl);
            });
            if lease.token() != before {
                // The backend handed out a different grant under the same lease.
                let completed = Instant::now();
                history.open(self.client, lease, invoked, completed, Some(ttl), None);
            }
        }
        result
    }

    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let at = self.history.offset(Instant::now());
        self.history.update(self.client, lease.token(), |entry| {
            entry.ended = Some(entry.ended.map_or(at, |ended| ended.min(at)));
        });
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(key).await
    }

    fn capabilities(&self) -> Capabilities {
        // The checker knows exclusive holds only (see `acquire_shared`).
        Capabilities {
            shared: false,
            ..self.inner.capabilities()
        }
    }
}

/// A problem the checker found.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// Two clients certainly believed they held the lock at the same time: each had its
    /// acquire return before the other stopped believing.
    Overlap {
        /// The earlier grant.
        first: Hold,
        /// The later grant.
        second: Hold,
    },
    /// Two grants to different clients carry the same token.
    DuplicateToken {
        /// The token.
        token: FencingToken,
    },
    /// A grant that certainly came later (its acquire began after the other's returned)
    /// has a token that is not larger.
    TokenRegressed {
        /// The earlier grant.
        earlier: Hold,
        /// The later grant.
        later: Hold,
    },
    /// A client believed it held the lock past what the server promised: the invocation
    /// of its last grant or renewal plus the TTL (a deadline counted from the reply).
    BelievedPastPromise {
        /// The hold.
        hold: Hold,
    },
}

impl Violation {
    /// For a double grant, whether a fenced resource contained it: the earlier holder's
    /// write, made after the later holder's, was rejected. `None` for token violations,
    /// which no fence can contain.
    pub fn fenced(&self) -> Option<bool> {
        match self {
            Self::Overlap { first, second } => Some(
                FencedRegister::new()
                    .stale_write_after_takeover(second.token, first.token, 0)
                    .unwrap_or(false),
            ),
            Self::BelievedPastPromise { .. } => None,
            Self::DuplicateToken { .. } | Self::TokenRegressed { .. } => Some(false),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overlap { first, second } => write!(
                f,
                "two holders: client {} (token {}, held {:?}..{:?}) and client {} (token {}, from {:?})",
                first.client,
                first.token,
                first.acquire_completed,
                first.believed_until,
                second.client,
                second.token,
                second.acquire_completed
            ),
            Self::DuplicateToken { token } => write!(f, "token {token} was issued twice"),
            Self::TokenRegressed { earlier, later } => write!(
                f,
                "token regressed: a later grant got {} after an earlier grant got {}",
                later.token, earlier.token
            ),
            Self::BelievedPastPromise { hold } => write!(
                f,
                "client {} believed its lease until {:?}, past the {:?} its server promised",
                hold.client,
                hold.believed_until,
                hold.promised_until.unwrap_or_default()
            ),
        }
    }
}

/// The checker's verdict on a history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Holds examined.
    pub holds: usize,
    /// Certain violations.
    pub definite: Vec<Violation>,
    /// Pairs whose hold windows overlap only within the uncertainty of when a grant or
    /// loss really took effect on the server (informational).
    pub possible: usize,
}

impl Report {
    /// True when no definite violation was found.
    pub fn is_safe(&self) -> bool {
        self.definite.is_empty()
    }

    /// Definite overlaps (two holders at once).
    pub fn overlaps(&self) -> usize {
        self.definite
            .iter()
            .filter(|v| matches!(v, Violation::Overlap { .. }))
            .count()
    }

    /// Token violations (duplicates or regressions).
    pub fn token_violations(&self) -> usize {
        self.definite
            .iter()
            .filter(|v| {
                matches!(
                    v,
                    Violation::DuplicateToken { .. } | Violation::TokenRegressed { .. }
                )
            })
            .count()
    }

    /// Whether every violation found was a double grant that fencing contained (`None`
    /// when there was none).
    pub fn fencing_contained(&self) -> Option<bool> {
        if self.definite.is_empty() {
            return None;
        }
        Some(self.definite.iter().all(|v| v.fenced() == Some(true)))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds, {} definite violation(s), {} possible",
            self.holds,
            self.definite.len(),
            self.possible
        )?;
        for violation in self.definite.iter().take(5) {
            write!(f, "\n  - {violation}")?;
        }
        Ok(())
    }
}

/// Checks mutual exclusion of believed-hold intervals (between clients), token
/// uniqueness and order, and that no belief outlived the server's promise.
pub fn check(holds: &[Hold]) -> Report {
    let mut sorted = holds.to_vec();
    sorted.sort_by_key(|h| h.acquire_completed);
    let mut report = Report {
        holds: sorted.len(),
        ..Report::default()
    };
    for (i, a) in sorted.iter().enumerate() {
        if a.promised_until.is_some_and(|p| {
            a.believed_until > p + PROMISE_SLACK && a.believed_until > a.acquire_completed
        }) {
            report
                .definite
                .push(Violation::BelievedPastPromise { hold: a.clone() });
        }
        for b in &sorted[i + 1..] {
            let others = a.client != b.client;
            // b.acquire_completed >= a.acquire_completed.
            let b_believed = b.acquire_completed < b.believed_until;
            if others && b.acquire_completed < a.believed_until && b_believed {
                report.definite.push(Violation::Overlap {
                    first: a.clone(),
                    second: b.clone(),
                });
            } else if others && b.acquire_invoked < a.believed_until {
                report.possible += 1;
            }
            if others && a.token == b.token {
                report
                    .definite
                    .push(Violation::DuplicateToken { token: a.token });
            } else if a.acquire_completed <= b.acquire_invoked && b.token <= a.token {
                report.definite.push(Violation::TokenRegressed {
                    earlier: a.clone(),
                    later: b.clone(),
                });
            }
        }
    }
    report
}

/// A resource that protects itself with fencing tokens, like a database row with a
/// `last_fence` column: every read and write must carry a token at least as large as
/// the largest seen, or it is rejected. A read-modify-write done by a stale holder is
/// therefore rejected instead of silently losing a newer holder's update.
#[derive(Debug, Default)]
pub struct FencedRegister {
    state: Mutex<RegisterState>,
}

#[derive(Debug, Default)]
struct RegisterState {
    highest: u64,
    value: u64,
    accepted_writes: u64,
    rejected: u64,
}

/// A fenced operation was refused because a newer token had been seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rejected stale token {token}: the register has seen {highest}")]
pub struct Rejected {
    /// The stale token.
    pub token: u64,
    /// The highest token seen.
    pub highest: u64,
}

impl FencedRegister {
    /// A register holding 0.
    pub fn new() -> Self {
        Self::default()
    }

    fn admit(state: &mut RegisterState, token: FencingToken) -> Result<(), Rejected> {
        if token.get() < state.highest {
            state.rejected += 1;
            return Err(Rejected {
                token: token.get(),
                highest: state.highest,
            });
        }
        state.highest = token.get();
        Ok(())
    }

    /// Reads the value, fenced by `token`.
    pub fn read(&self, token: FencingToken) -> Result<u64, Rejected> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Self::admit(&mut state, token)?;
        Ok(state.value)
    }

    /// Writes the value, fenced by `token`.
    pub fn write(&self, token: FencingToken, value: u64) -> Result<(), Rejected> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Self::admit(&mut state, token)?;
        state.value = value;
        state.accepted_writes += 1;
        Ok(())
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .value
    }

    /// Writes accepted so far.
    pub fn accepted_writes(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .accepted_writes
    }

    /// A takeover as a fenced store sees it: the new holder (`fresh`) does a
    /// read-modify-write, then the stale holder writes what it computed from `stale_read`
    /// while it still held the lock. `Ok(true)`: fencing rejected the stale write. An
    /// error: the new holder itself was rejected (its token is not the highest).
    pub fn stale_write_after_takeover(
        &self,
        fresh: FencingToken,
        stale: FencingToken,
        stale_read: u64,
    ) -> Result<bool, Rejected> {
        let seen = self.read(fresh)?;
        self.write(fresh, seen + 1)?;
        Ok(self.write(stale, stale_read + 1).is_err())
    }

    /// Reads and writes rejected so far (evidence that fencing contained a stale holder).
    pub fn rejected(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rejected
    }
}

/// Jepsen's lock workload on one counter, kept in two stores: a [`FencedRegister`] and a
/// store that ignores tokens, as most stores do. Each holder reads when it is granted and
/// later writes what it read plus one; an increment a store acknowledged but its final
/// value does not count is a lost update. Two holders whose read-modify-writes interleave
/// lose one in the plain store; the fenced store rejects the stale one, unless the two
/// tokens cannot tell the holders apart.
#[derive(Debug, Default)]
pub struct Counter {
    fenced: FencedRegister,
    plain: Mutex<PlainStore>,
}

#[derive(Debug, Default)]
struct PlainStore {
    value: u64,
    writes: u64,
}

/// An increment under way: what each store held when its holder read.
#[derive(Clone, Copy, Debug)]
#[must_use = "an increment counts once it is written"]
pub struct Increment {
    token: FencingToken,
    fenced: Result<u64, Rejected>,
    plain: u64,
}

/// What a [`Counter`]'s stores lost (in JSON: `written`, `lost_unfenced`, `lost_fenced`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LostUpdates {
    /// Increments written (each acknowledged by the plain store).
    #[serde(rename = "written")]
    pub updates: u64,
    /// Increments the plain store acknowledged that its value does not count.
    #[serde(rename = "lost_unfenced")]
    pub unfenced: u64,
    /// Increments the fenced store accepted that its value does not count.
    #[serde(rename = "lost_fenced")]
    pub fenced: u64,
}

impl std::ops::AddAssign for LostUpdates {
    fn add_assign(&mut self, other: Self) {
        self.updates += other.updates;
        self.unfenced += other.unfenced;
        self.fenced += other.fenced;
    }
}

impl Counter {
    /// A counter at 0 in both stores.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts an increment: reads both stores, the fenced one with `token`.
    pub fn read(&self, token: FencingToken) -> Increment {
        let plain = self
            .plain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .value;
        Increment {
            token,
            fenced: self.fenced.read(token),
            plain,
        }
    }

    /// Finishes `increment`: writes what each store held plus one. The plain store always
    /// accepts; the result is the fenced store's answer (a rejected read is not written).
    pub fn write(&self, increment: Increment) -> Result<(), Rejected> {
        {
            let mut plain = self.plain.lock().unwrap_or_else(PoisonError::into_inner);
            plain.value = increment.plain + 1;
            plain.writes += 1;
        }
        self.fenced.write(increment.token, increment.fenced? + 1)
    }

    /// A read and its write at once.
    pub fn increment(&self, token: FencingToken) -> Result<(), Rejected> {
        self.write(self.read(token))
    }

    /// What each store has lost so far.
    pub fn lost(&self) -> LostUpdates {
        let plain = self.plain.lock().unwrap_or_else(PoisonError::into_inner);
        LostUpdates {
            updates: plain.writes,
            unfenced: plain.writes - plain.value,
            fenced: self.fenced.accepted_writes() - self.fenced.value(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(client: usize, token: u64, invoked: u64, acquired: u64, until: u64) -> Hold {
        let ms = Duration::from_millis;
        Hold {
            client,
            owner: OwnerId([client as u8; 16]),
            token: FencingToken(token),
            acquire_invoked: ms(invoked),
            acquire_completed: ms(acquired),
            believed_until: ms(until),
            deadline: ms(until + 1000),
            promised_until: None,
        }
    }

    #[test]
    fn sequential_holds_are_safe() {
        let report = check(&[
            hold(1, 1, 0, 1, 10),
            hold(2, 2, 2, 11, 20),
            hold(1, 3, 12, 21, 30),
        ]);
        assert!(report.is_safe(), "{report}");
        assert_eq!(report.holds, 3);
    }

    #[test]
    fn overlapping_holds_are_a_definite_violation() {
        let report = check(&[hold(1, 1, 0, 1, 10), hold(2, 2, 0, 5, 20)]);
        assert_eq!(report.overlaps(), 1, "{report}");
    }

    #[test]
    fn duplicate_and_regressed_tokens_are_caught() {
        let report = check(&[hold(1, 5, 0, 1, 10), hold(2, 5, 11, 12, 20)]);
        assert!(matches!(
            report.definite[..],
            [Violation::DuplicateToken { .. }]
        ));
        let report = check(&[hold(1, 5, 0, 1, 10), hold(2, 3, 11, 12, 20)]);
        assert!(matches!(
            report.definite[..],
            [Violation::TokenRegressed { .. }]
        ));
    }

    #[test]
    fn concurrent_acquires_do_not_constrain_token_order() {
        // Client 2 began acquiring before client 1's acquire returned: either order is fine.
        let report = check(&[hold(1, 5, 0, 3, 10), hold(2, 4, 2, 11, 20)]);
        assert!(report.is_safe(), "{report}");
    }

    #[test]
    fn clients_sharing_an_owner_id_are_still_two_holders() {
        let mut second = hold(2, 2, 0, 5, 20);
        second.owner = hold(1, 1, 0, 1, 10).owner;
        let report = check(&[hold(1, 1, 0, 1, 10), second]);
        assert_eq!(report.overlaps(), 1, "{report}");
        assert_eq!(report.fencing_contained(), Some(true), "{report}");
    }

    #[test]
    fn a_belief_past_the_servers_promise_is_a_violation() {
        let mut late = hold(1, 1, 0, 600, 1100);
        late.promised_until = Some(Duration::from_millis(500));
        let report = check(&[late.clone()]);
        assert!(
            matches!(report.definite[..], [Violation::BelievedPastPromise { .. }]),
            "{report}"
        );
        // A late grant the client knew had expired (deadline before the reply) is fine.
        late.believed_until = Duration::from_millis(450);
        assert!(check(&[late]).is_safe());
    }

    #[test]
    fn an_unfenced_overlap_is_not_contained() {
        // The later holder got the smaller token: the earlier holder's write wins.
        let report = check(&[hold(1, 5, 0, 1, 10), hold(2, 4, 0, 5, 20)]);
        assert_eq!(report.fencing_contained(), Some(false), "{report}");
    }

    #[tokio::test]
    async fn recorded_clients_record_grants_renewals_releases_and_losses() {
        let memory: Arc<dyn DistributedLock> = Arc::new(tenure_api::MemoryLock::new());
        let history = History::new();
        let (a, b) = (
            history.recorded(0, memory.clone()),
            history.recorded(1, memory.clone()),
        );
        let key = LockKey::new("recorded").unwrap();
        let ttl = Duration::from_secs(5);
        let mut lease = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        a.extend(&mut lease, ttl).await.unwrap();
        assert!(history.believed_at(0, Instant::now()));
        a.release(lease).await.unwrap();
        assert!(!history.believed_at(0, Instant::now()));
        let lease = b.try_acquire(&key, ttl).await.unwrap().unwrap();
        history.lost(1, Instant::now());
        let holds = history.holds();
        assert_eq!(holds.len(), 2);
        assert!(holds[0].promised_until.is_some());
        assert!(holds.iter().all(|h| h.believed_until < h.deadline));
        assert!(history.check().is_safe(), "{}", history.check());
        drop(lease);
    }

    #[tokio::test]
    async fn a_release_after_a_loss_does_not_extend_the_belief() {
        let memory: Arc<dyn DistributedLock> = Arc::new(tenure_api::MemoryLock::new());
        let history = History::new();
        let a = history.recorded(0, memory);
        let key = LockKey::new("lost-then-released").unwrap();
        let lease = a
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        let lost = Instant::now();
        history.lost(0, lost);
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.release(lease).await.unwrap();
        assert_eq!(history.holds()[0].believed_until, history.offset(lost));
    }

    #[tokio::test]
    async fn an_extend_after_another_clients_hold_is_an_overlap() {
        let memory: Arc<dyn DistributedLock> = Arc::new(tenure_api::MemoryLock::new());
        let history = History::new();
        let (a, b) = (
            history.recorded(0, memory.clone()),
            history.recorded(1, memory.clone()),
        );
        let key = LockKey::new("revived").unwrap();
        let ttl = Duration::from_secs(5);
        let first = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        let mut stale = first.clone();
        a.release(first).await.unwrap();
        let second = b.try_acquire(&key, ttl).await.unwrap().unwrap();
        b.release(second).await.unwrap();
        assert!(history.check().is_safe(), "{}", history.check());
        // A backend that revives the released lease (here: the client is told so by a
        // successful extend) makes the first hold span the second.
        let revived = history.recorded(0, Arc::new(Reviving(memory)));
        revived.extend(&mut stale, ttl).await.unwrap();
        assert_eq!(history.check().overlaps(), 1, "{}", history.check());
    }

    /// A lock whose `extend` re-acquires a lost lock (a classic bug).
    #[derive(Debug)]
    struct Reviving(Arc<dyn DistributedLock>);

    #[async_trait]
    impl DistributedLock for Reviving {
        async fn try_acquire(
            &self,
            key: &LockKey,
            ttl: Duration,
        ) -> Result<Option<Lease>, LockError> {
            self.0.try_acquire(key, ttl).await
        }
        async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
            self.0.acquire(key, opts).await
        }
        async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
            match self.0.try_acquire(lease.key(), ttl).await? {
                Some(fresh) => {
                    *lease = fresh;
                    Ok(())
                }
                None => Err(LockError::lost("held by another")),
            }
        }
        async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
            self.0.release(lease).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
            self.0.inspect(key).await
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                shared: false,
                ..self.0.capabilities()
            }
        }
    }

    #[test]
    fn fenced_register_rejects_a_stale_read_modify_write() {
        let register = FencedRegister::new();
        let stale = FencingToken(1);
        let fresh = FencingToken(2);
        let seen_by_stale = register.read(stale).unwrap();
        let seen_by_fresh = register.read(fresh).unwrap();
        register.write(fresh, seen_by_fresh + 1).unwrap();
        assert!(register.write(stale, seen_by_stale + 1).is_err());
        assert_eq!(register.value(), register.accepted_writes());
        assert_eq!(register.rejected(), 1);
    }

    #[test]
    fn a_stale_increment_is_lost_only_where_tokens_are_ignored() {
        let counter = Counter::new();
        let stale = counter.read(FencingToken(1));
        counter.increment(FencingToken(2)).unwrap();
        assert!(counter.write(stale).is_err(), "the fence rejects it");
        let lost = counter.lost();
        assert_eq!((lost.updates, lost.unfenced, lost.fenced), (2, 1, 0));

        // One token for two holders: no fence can tell them apart.
        let counter = Counter::new();
        let first = counter.read(FencingToken(3));
        counter.increment(FencingToken(3)).unwrap();
        counter.write(first).unwrap();
        let lost = counter.lost();
        assert_eq!((lost.updates, lost.unfenced, lost.fenced), (2, 1, 1));

        // One after the other, nothing is lost.
        let counter = Counter::new();
        counter.increment(FencingToken(1)).unwrap();
        counter.increment(FencingToken(2)).unwrap();
        assert_eq!(
            counter.lost(),
            LostUpdates {
                updates: 2,
                unfenced: 0,
                fenced: 0
            }
        );
    }
}
