//! A key's files: `<stem>.lock` (the locked file), `<stem>.state` (its last grant),
//! `<stem>.gate` (where writers wait and readers take turns, see [`crate::gate`]) and
//! `<stem>.readers/<token>.reader` (each reader's grant, while it holds).
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
/// The suffix of a key's gate file.
pub(crate) const GATE_SUFFIX: &str = ".gate";
/// The suffix of the directory of a key's readers' records.
pub(crate) const READERS_SUFFIX: &str = ".readers";
/// The suffix of a reader's record, after its token.
pub(crate) const READER_SUFFIX: &str = ".reader";

/// The files of one key in a lock directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyFiles {
    /// The file whose open-file-description lock is the key's lock.
    pub(crate) lock: PathBuf,
    /// The file that records the key's last grant (key, token, holder).
    pub(crate) state: PathBuf,
    /// The file whose byte locks hold readers back behind waiting writers, and give
    /// readers turns at the record.
    pub(crate) gate: PathBuf,
    /// The directory of the key's readers' records (made by the first reader).
    pub(crate) readers_dir: PathBuf,
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
            gate: dir.join(format!("{stem}{GATE_SUFFIX}")),
            readers_dir: dir.join(format!("{stem}{READERS_SUFFIX}")),
        }
    }

    /// The record of the reader granted `token`.
    pub(crate) fn reader(&self, token: u64) -> PathBuf {
        self.readers_dir.join(format!("{token}{READER_SUFFIX}"))
    }

    /// The readers' records, `<token>.reader` in the key's readers' directory, by token
    /// (none without the directory). Something else at its name (a symbolic link, which
    /// could lead to another key's readers) is an error.
    pub(crate) fn readers(&self) -> std::io::Result<Vec<(u64, PathBuf)>> {
        match std::fs::symlink_metadata(&self.readers_dir) {
            Ok(found) if found.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", self.readers_dir.display()),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        let entries = std::fs::read_dir(&self.readers_dir)?;
        let mut readers = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let token = name
                .to_str()
                .and_then(|n| n.strip_suffix(READER_SUFFIX))
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse().ok());
            if let Some(token) = token {
                readers.push((token, entry.path()));
            }
        }
        readers.sort();
        Ok(readers)
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

    #[test]
    fn a_keys_readers_are_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a5) = (
            KeyFiles::of(dir.path(), "a"),
            KeyFiles::of(dir.path(), "a.5"),
        );
        assert_eq!(a.readers().unwrap(), [], "no directory yet");
        std::fs::create_dir(&a.readers_dir).unwrap();
        std::fs::create_dir(&a5.readers_dir).unwrap();
        for name in [
            "5.reader",
            "12.reader",
            "x.reader",
            ".reader",
            ".7.reader.1.tmp",
        ] {
            std::fs::write(a.readers_dir.join(name), "").unwrap();
        }
        std::fs::write(a5.reader(7), "").unwrap();
        let tokens = |files: &KeyFiles| -> Vec<u64> {
            files
                .readers()
                .unwrap()
                .into_iter()
                .map(|(t, _)| t)
                .collect()
        };
        assert_eq!(tokens(&a), [5, 12]);
        assert_eq!(tokens(&a5), [7]);
        assert_eq!(a.reader(12), dir.path().join("a.readers/12.reader"));
        let b = KeyFiles::of(dir.path(), "b");
        std::os::unix::fs::symlink(&a.readers_dir, &b.readers_dir).unwrap();
        assert!(b.readers().is_err(), "a link to another key's readers");
    }
}
