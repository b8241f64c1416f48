//! A key's files: `<stem>.lock` (the locked file) and `<stem>.state` (its last grant).
//!
//! The stem is the key with every byte outside `[A-Za-z0-9_.-]` written `%XX` (and a
//! leading `.` too, so no stem is hidden or `..`); a stem longer than [`MAX_STEM`] bytes is
//! `~` and the key's SHA-256 in hex instead. Either way the key itself is in the state
//! file, which is how a listing reads it back.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The longest escaped stem kept as it is (file names may have 255 bytes; the suffixes
/// and a temporary file's `.<stem>.<pid>.<n>.tmp` need the rest).
pub(crate) const MAX_STEM: usize = 200;

/// The suffix of a key's locked file.
pub(crate) const LOCK_SUFFIX: &str = ".lock";
/// The suffix of a key's state file.
pub(crate) const STATE_SUFFIX: &str = ".state";

/// The files of one key in a lock directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyFiles {
    /// The file whose open-file-description lock is the key's lock.
    pub(crate) lock: PathBuf,
    /// The file that records the key's last grant (key, token, holder).
    pub(crate) state: PathBuf,
}

impl KeyFiles {
    /// The files of the key named `name` (the configured prefix, then the key) under
    /// `dir`.
    pub(crate) fn of(dir: &Path, name: &str) -> Self {
        Self::of_stem(dir, &stem(name))
    }

    /// The files whose name starts with `stem` under `dir`.
    pub(crate) fn of_stem(dir: &Path, stem: &str) -> Self {
        Self {
            lock: dir.join(format!("{stem}{LOCK_SUFFIX}")),
            state: dir.join(format!("{stem}{STATE_SUFFIX}")),
        }
    }
}

/// The file-name stem of a key named `key`.
pub(crate) fn stem(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for (i, b) in key.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if plain {
            escaped.push(char::from(b));
        } else {
            let _ = write!(escaped, "%{b:02X}");
        }
    }
    if escaped.len() <= MAX_STEM {
        return escaped;
    }
    let mut hashed = String::from("~");
    for b in Sha256::digest(key.as_bytes()) {
        let _ = write!(hashed, "{b:02x}");
    }
    hashed
}

#[cfg(test)]
mod tests {
    use tenure_api::LockKey;

    use super::*;

    #[test]
    fn a_stem_is_a_safe_file_name_and_tells_keys_apart() {
        assert_eq!(stem("nightly-report"), "nightly-report");
        assert_eq!(stem("jobs/nightly"), "jobs%2Fnightly");
        assert_eq!(stem(".."), "%2E.");
        assert_eq!(stem("a%2Fb"), "a%252Fb");
        assert_eq!(stem("ä"), "%C3%A4");
        let long = "k".repeat(MAX_STEM + 1);
        let hashed = stem(&long);
        assert_eq!(hashed.len(), 65);
        assert!(hashed.starts_with('~'), "{hashed}");
        assert_ne!(hashed, stem(&"k".repeat(MAX_STEM + 2)));
        assert_eq!(stem(&"k".repeat(MAX_STEM)), "k".repeat(MAX_STEM));
        // Every escaped stem, and every hashed one, fits in a file name with its suffixes.
        let widest = "/".repeat(LockKey::MAX_LEN);
        assert!(stem(&widest).len() + STATE_SUFFIX.len() + 32 < 255);
    }
}
