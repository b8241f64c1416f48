//! Whose a queue entry is. tenure's entries are `<queue>/<owner>-<lease hex>-<attempt hex>`
//! holding `<owner>[:<label>]`. Another recipe's — `etcdctl lock` and Go's
//! `concurrency.Mutex` put `<queue>/<lease hex>` holding nothing — share the queue (every
//! one of them orders it by create revision) and are shown as foreign holders.

use tenure_api::backend::{foreign_label, parse_holder_text};
use tenure_api::{LockError, OwnerId};

/// Who a queue entry says holds it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The owner id its name and value carry; for another recipe's entry, one derived
    /// from its key.
    pub(crate) owner: OwnerId,
    /// tenure's label, or another recipe's value as one ([`foreign_label`]).
    pub(crate) label: Option<String>,
    /// Another recipe's entry.
    pub(crate) foreign: bool,
}

/// The owner id an entry named exactly as tenure names them starts with (lower-case hex
/// throughout, as tenure writes it).
fn named_owner(key: &[u8]) -> Option<OwnerId> {
    let name = key.rsplit(|b| *b == b'/').next()?;
    // A reader's key: the same name after the mark.
    let name = name
        .strip_prefix(crate::queue::SHARED_MARK.as_bytes())
        .unwrap_or(name);
    let mut parts = std::str::from_utf8(name).ok()?.splitn(3, '-');
    let (owner, lease, attempt) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = |text: &str| {
        !text.is_empty() && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (owner.len() == 32 && hex(owner) && lease.len() == 16 && hex(lease) && hex(attempt))
        .then_some(())?;
    OwnerId::parse(owner).ok()
}

/// Whose the queue entry `key` holding `value` is: tenure's, when its name is one tenure
/// writes (its value must then name the same owner, else the entry is malformed: a
/// backend error), or another recipe's.
pub(crate) fn recorded(key: &[u8], value: &[u8]) -> Result<Recorded, LockError> {
    let Some(named) = named_owner(key) else {
        return Ok(Recorded {
            owner: OwnerId::derived(key),
            label: foreign_label(value),
            foreign: true,
        });
    };
    let shown = || String::from_utf8_lossy(key).into_owned();
    let text = std::str::from_utf8(value)
        .map_err(|_| LockError::backend(format!("lock entry {}: not UTF-8", shown())))?;
    let (owner, label) = parse_holder_text(text)?;
    if owner != named {
        return Err(LockError::backend(format!(
            "lock entry {}: its value names owner {owner}",
            shown()
        )));
    }
    Ok(Recorded {
        owner,
        label,
        foreign: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_api::backend::holder_text;

    #[test]
    fn tenure_entries_and_other_recipes_entries_are_told_apart() {
        let owner = OwnerId::parse("3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
        let key = format!("app/job/{owner}-{:016x}-{:x}", 0x694d_1234_u64, 7);
        let ours = recorded(
            key.as_bytes(),
            holder_text(owner, Some("host-a")).as_bytes(),
        );
        assert_eq!(
            ours.unwrap(),
            Recorded {
                owner,
                label: Some("host-a".into()),
                foreign: false
            }
        );
        // A reader's key: the same name after `shared-`.
        let reader = key.replace(&owner.to_string(), &format!("shared-{owner}"));
        let read = recorded(reader.as_bytes(), holder_text(owner, None).as_bytes()).unwrap();
        assert!(!read.foreign && read.owner == owner, "{read:?}");
        // `etcdctl lock app/job` and Go's concurrency.Mutex: `<prefix>/<lease hex>`, empty.
        let etcdctl = b"app/job/694d7a3c9e2f1b05";
        let theirs = recorded(etcdctl, b"").unwrap();
        assert!(theirs.foreign && theirs.label.is_none());
        assert_eq!(theirs.owner, OwnerId::derived(etcdctl));
        assert_ne!(
            theirs.owner,
            recorded(b"app/job/694d7a3c9e2f1b06", b"").unwrap().owner
        );
        // `etcdctl elect` puts its proposal: shown as the label.
        let elected = recorded(b"/lock/leader/694d7a3c9e2f1b05", b"node-1\xff").unwrap();
        assert_eq!(elected.label.as_deref(), Some("node-1\u{fffd}"));
        // Named almost as tenure's (upper case): another recipe's.
        let upper = key.replace(&owner.to_string(), &owner.to_string().to_uppercase());
        let value = holder_text(owner, None);
        assert!(
            recorded(upper.as_bytes(), value.as_bytes())
                .unwrap()
                .foreign
        );
        // Named as tenure's, but its value names no owner, or another: malformed.
        for value in [
            &b""[..],
            b"not-an-owner",
            holder_text(OwnerId::random(), None).as_bytes(),
        ] {
            assert!(recorded(key.as_bytes(), value).is_err(), "{value:?}");
        }
    }
}
