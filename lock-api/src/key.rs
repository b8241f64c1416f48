//! Validated lock names.

use std::fmt;

use crate::LockError;

/// The name of a lock: non-empty, at most [`LockKey::MAX_LEN`] bytes of UTF-8, with no NUL
/// or other control characters.
///
/// Backends map a key into their own namespace (a Redis key, an etcd prefix, a ZooKeeper
/// path, a Postgres row), always under their configured prefix.
///
/// ```
/// use tenure_api::LockKey;
/// assert!(LockKey::new("jobs/nightly-report").is_ok());
/// assert!(LockKey::new("").is_err());
/// assert!(LockKey::new("bad\0key").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(String);

impl LockKey {
    /// The longest key accepted, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Validates `name` and wraps it. A bad name is [`LockError::InvalidInput`].
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let name = name.into();
        if name.is_empty() {
            return Err(LockError::InvalidInput("lock key is empty".into()));
        }
        if name.len() > Self::MAX_LEN {
            return Err(LockError::InvalidInput(format!(
                "lock key is {} bytes long; the limit is {}",
                name.len(),
                Self::MAX_LEN
            )));
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(LockError::InvalidInput(format!(
                "lock key contains the control character {:?}",
                c
            )));
        }
        Ok(Self(name))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", self.0)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = LockError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<String> for LockKey {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
