//! The history checker: what clients believed, on one monotonic clock, turned into
//! verdicts — mutual exclusion, token order, and a fenced register that must lose no
//! update.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tenure_api::{FencingToken, OwnerId};

/// One grant as a client experienced it. Times are offsets from the history's origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    /// Which client held it.
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
    /// The lease's local deadline.
    pub deadline: Duration,
}

/// A shared, append-only record of holds.
#[derive(Clone, Debug)]
pub struct History {
    origin: Instant,
    holds: Arc<Mutex<Vec<Hold>>>,
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
        lease: &tenure_api::Lease,
        acquire_invoked: Instant,
        acquire_completed: Instant,
        believed_until: Instant,
    ) {
        assert!(
            acquire_invoked >= self.origin,
            "History::record: the acquire was invoked before the history was created"
        );
        let deadline = self.offset(lease.valid_until());
        let hold = Hold {
            client,
            owner: lease.owner(),
            token: lease.token(),
            acquire_invoked: self.offset(acquire_invoked),
            acquire_completed: self.offset(acquire_completed),
            believed_until: self.offset(believed_until).min(deadline),
            deadline,
        };
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hold);
    }

    /// A copy of the holds recorded so far.
    pub fn holds(&self) -> Vec<Hold> {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Checks the history.
    pub fn check(&self) -> Report {
        check(&self.holds())
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
    /// Two grants carry the same token.
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
        self.definite.len() - self.overlaps()
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

/// Checks mutual exclusion of believed-hold intervals, token uniqueness, and token order.
pub fn check(holds: &[Hold]) -> Report {
    let mut sorted = holds.to_vec();
    sorted.sort_by_key(|h| h.acquire_completed);
    let mut report = Report {
        holds: sorted.len(),
        ..Report::default()
    };
    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            // b.acquire_completed >= a.acquire_completed.
            if b.acquire_completed < a.believed_until && a.owner != b.owner {
                report.definite.push(Violation::Overlap {
                    first: a.clone(),
                    second: b.clone(),
                });
            } else if b.acquire_invoked < a.believed_until && a.owner != b.owner {
                report.possible += 1;
            }
            if a.token == b.token && a.owner != b.owner {
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
}
