//! How long to hold, how long to wait, and how to back off while waiting.

use std::time::{Duration, Instant};

use crate::LockError;

/// The shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest TTL accepted (one week): longer leases are almost always a bug.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Checks a TTL is within [`MIN_TTL`]..=[`MAX_TTL`]; otherwise [`LockError::InvalidInput`].
pub fn validate_ttl(ttl: Duration) -> Result<Duration, LockError> {
    if (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(LockError::InvalidInput(format!(
            "ttl {ttl:?} is outside the accepted range {MIN_TTL:?}..={MAX_TTL:?}"
        )))
    }
}

/// The longest label ([`AcquireOptions::label`]) accepted, in bytes.
pub const MAX_LABEL: usize = 256;

/// Checks a label is 1 to [`MAX_LABEL`] bytes without control characters (which some
/// stores refuse and which would garble what `inspect` prints); otherwise
/// [`LockError::InvalidInput`]. (No label at all is `None`, not an empty one.)
pub fn validate_label(label: &str) -> Result<(), LockError> {
    if label.is_empty() || label.len() > MAX_LABEL {
        return Err(LockError::InvalidInput(format!(
            "a label is 1 to {MAX_LABEL} bytes, this one has {}",
            label.len()
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(LockError::InvalidInput(format!(
            "label {label:?} has a control character"
        )));
    }
    Ok(())
}

/// A label made of what another recipe's client stored in its record (its data, value
/// or token), within a label's bounds: UTF-8 (lossy), control characters replaced with
/// U+FFFD, cut to [`MAX_LABEL`] bytes; `None` when empty.
pub fn foreign_label(data: &[u8]) -> Option<String> {
    let text: String = String::from_utf8_lossy(data)
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    let mut end = text.len().min(MAX_LABEL);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (end > 0).then(|| text[..end].to_string())
}

/// Options for [`crate::DistributedLock::acquire`].
///
/// ```
/// use std::time::Duration;
/// use tenure_api::AcquireOptions;
/// let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
/// assert_eq!(opts.ttl, Duration::from_secs(30));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AcquireOptions {
    /// How long the lease lasts unless extended.
    pub ttl: Duration,
    /// How long to wait for a held lock before giving up with [`LockError::Timeout`].
    /// `Duration::ZERO` makes one attempt; `Duration::MAX` (or any wait too long to be
    /// represented as an instant) waits without bound.
    pub wait: Duration,
    /// Retry pacing for backends that poll (and for retries after transient errors).
    pub backoff: Backoff,
    /// A short text recorded with the grant, for [`crate::DistributedLock::inspect`] to
    /// report as [`crate::HolderInfo::label`] (who holds it, in words: a host name, an
    /// address; an [`Election`](crate::Election)'s leader value). At most [`MAX_LABEL`]
    /// bytes without control characters ([`validate_label`]). Only backends whose
    /// [`Capabilities::labels`](crate::Capabilities::labels) is true take one; the others
    /// refuse the acquire.
    pub label: Option<String>,
}

impl AcquireOptions {
    /// Options with the given TTL, a wait of 10 s, and the default backoff.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            wait: Duration::from_secs(10),
            backoff: Backoff::default(),
            label: None,
        }
    }

    /// Sets the wait bound.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the label recorded with the grant.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Checks the TTL (see [`validate_ttl`]), the backoff (see [`Backoff::validate`]) and
    /// the label (see [`validate_label`]).
    pub fn validate(&self) -> Result<(), LockError> {
        validate_ttl(self.ttl)?;
        self.backoff.validate()?;
        self.label.as_deref().map_or(Ok(()), validate_label)
    }

    /// For a backend without labels: [`LockError::InvalidInput`] naming `backend` if these
    /// options carry a label, since recording none would silently drop it.
    pub fn refuse_label(&self, backend: &str) -> Result<(), LockError> {
        match &self.label {
            Some(_) => Err(LockError::InvalidInput(format!(
                "the {backend} backend does not record labels: acquire without one"
            ))),
            None => Ok(()),
        }
    }

    /// When a wait that starts at `started` ends. A wait too long to be represented (such
    /// as `Duration::MAX`) saturates at a century from `started`: wait without bound.
    pub fn wait_deadline(&self, started: Instant) -> Instant {
        started
            .checked_add(self.wait)
            .or_else(|| started.checked_add(FOREVER))
            .unwrap_or(started)
    }
}

/// What an unbounded wait is clamped to: a century, far beyond any process's life.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Default for AcquireOptions {
    fn default() -> Self {
        Self::new(Duration::from_secs(30))
    }
}

/// Exponential backoff with jitter: attempt `n` waits a random time in
/// `[d·(1−jitter), d]` where `d = min(initial·2ⁿ, max)`. Random delays keep competing
/// clients from retrying in lock-step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Upper bound of a delay.
    pub max: Duration,
    /// Fraction of each delay that is randomised, in `0.0..=1.0`.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(200),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// Checks that `jitter` is a number in `0.0..=1.0`; otherwise
    /// [`LockError::InvalidInput`].
    pub fn validate(&self) -> Result<(), LockError> {
        if (0.0..=1.0).contains(&self.jitter) {
            Ok(())
        } else {
            Err(LockError::InvalidInput(format!(
                "backoff jitter {} is not a fraction in 0.0..=1.0",
                self.jitter
            )))
        }
    }

    /// The delay before retry number `attempt` (0-based). Never panics: a jitter outside
    /// `0.0..=1.0` (which [`validate`](Self::validate) rejects) is clamped, NaN counts as 0.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(20));
        let base = self.initial.saturating_mul(factor).min(self.max);
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        let keep = 1.0 - jitter * rand::random::<f64>();
        // f64 rounding may land just above `base`: never exceed it.
        Duration::try_from_secs_f64(base.as_secs_f64() * keep.clamp(0.0, 1.0))
            .map_or(base, |delay| delay.min(base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another recipe's record is shown as a label within a label's bounds.
    #[test]
    fn foreign_records_become_valid_labels() {
        assert_eq!(foreign_label(b""), None);
        assert_eq!(foreign_label(b"127.0.1.1").as_deref(), Some("127.0.1.1"));
        let shown = foreign_label(b"a\nb\xff").unwrap();
        assert_eq!(shown, "a\u{fffd}b\u{fffd}");
        let long = foreign_label("é".repeat(200).as_bytes()).unwrap();
        assert!(long.len() <= MAX_LABEL && long.chars().all(|c| c == 'é'));
        for label in [shown, long] {
            validate_label(&label).unwrap();
        }
    }

    #[test]
    fn labels_are_checked_with_the_options() {
        let opts = |label: &str| AcquireOptions::default().label(label).validate();
        assert!(opts("host-a:4711 ✓").is_ok());
        assert!(opts(&"é".repeat(MAX_LABEL / 2)).is_ok(), "256 bytes");
        for bad in ["", "tab\there", "\u{7f}", &"x".repeat(MAX_LABEL + 1)] {
            assert!(
                matches!(opts(bad), Err(LockError::InvalidInput(_))),
                "{bad:?}"
            );
        }
        assert!(AcquireOptions::default().refuse_label("x").is_ok());
        let refused = AcquireOptions::default().label("a").refuse_label("acme");
        assert!(matches!(refused, Err(LockError::InvalidInput(m)) if m.contains("acme")));
    }

    #[test]
    fn holder_texts_round_trip_with_and_without_a_label() {
        let owner = crate::OwnerId::random();
        for label in [None, Some("a"), Some("a:b::c")] {
            let text = crate::backend::holder_text(owner, label);
            let parsed = crate::backend::parse_holder_text(&text).unwrap();
            assert_eq!(parsed, (owner, label.map(str::to_owned)));
        }
        assert!(crate::backend::parse_holder_text("not-an-owner:label").is_err());
    }
}
