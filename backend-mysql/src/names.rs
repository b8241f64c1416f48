//! A lock's `GET_LOCK` name: the name itself where the server keeps it apart from every
//! other, a hash where it would not.

use sha2::{Digest, Sha256};

/// The longest name `GET_LOCK` takes (MySQL refuses longer ones).
pub(crate) const MAX_LOCK_NAME: usize = 64;

/// The `GET_LOCK` name of the lock called `name`. The server compares these names
/// case-insensitively (and, under its collation, may equate other characters and ignore
/// trailing spaces), and refuses more than 64 characters. So `name` is used as it is only
/// when it is 1 to 64 printable ASCII characters with no capital letter, no space, and no
/// leading `#`; any other name becomes `#` and the first 63 hex digits of its SHA-256.
/// Two names never share a lock name, except by a collision of 252-bit hashes. Another
/// language can compute the same: see the crate docs.
pub(crate) fn lock_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= MAX_LOCK_NAME
        && !name.starts_with('#')
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase());
    if plain {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("#{}", &hex[..MAX_LOCK_NAME - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_server_could_confuse_are_hashed() {
        assert_eq!(lock_name("nightly-job:42"), "nightly-job:42");
        for name in ["Job", "job ", "ä", "#x", &"x".repeat(65)] {
            let hashed = lock_name(name);
            assert!(hashed.starts_with('#'), "{name}: {hashed}");
            assert_eq!(hashed.len(), MAX_LOCK_NAME, "{name}");
        }
        assert_ne!(lock_name("Job"), lock_name("job"));
        assert_ne!(lock_name("Job"), lock_name("JOB"));
        // SHA-256("Job"), as any language computes it (Python: hashlib.sha256).
        assert_eq!(
            lock_name("Job"),
            "#ad617a0fdd57e3f4b8ebb27f6f60470bc4468aadec290db57e612f751767745"
        );
        assert_eq!(lock_name(&"x".repeat(64)), "x".repeat(64));
    }
}
