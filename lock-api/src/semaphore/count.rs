//! A permit's grant records its semaphore's count, so that runs of one name that disagree
//! on the count are refused instead of silently admitting more holders.
//!
//! The count rides in the grant's label (every backend records one): `permits=<N>`, then
//! a space and the holder's own label if it gave one. [`Semaphore`](super::Semaphore)
//! strips it again when it reports holders.

use crate::{validate_label, HolderInfo, LockError, LockKey, MAX_LABEL};

/// What a permit's recorded label starts with.
const TAG: &str = "permits=";

/// The longest own label a permit's holder may give: the count's tag takes the rest.
pub(crate) const MAX_PERMIT_LABEL: usize = MAX_LABEL - TAG.len() - "64 ".len();

/// The label a permit of a semaphore of `permits` is granted with: the count, then the
/// holder's own `label` (checked as any label, and to leave room for the count).
pub(super) fn tagged(permits: u32, label: Option<&str>) -> Result<String, LockError> {
    let Some(label) = label else {
        return Ok(format!("{TAG}{permits}"));
    };
    validate_label(label)?;
    if label.len() > MAX_PERMIT_LABEL {
        return Err(LockError::InvalidInput(format!(
            "a permit's label is 1 to {MAX_PERMIT_LABEL} bytes (the permit count is recorded \
             with it), this one has {}",
            label.len()
        )));
    }
    Ok(format!("{TAG}{permits} {label}"))
}

/// The count a holder's grant recorded and its own label, or `None` when the record has
/// no count (a plain lock's holder, another recipe's client, a tenure before counts were
/// recorded).
fn split(holder: &HolderInfo) -> Option<(u32, Option<&str>)> {
    if holder.foreign {
        return None;
    }
    let rest = holder.label.as_deref()?.strip_prefix(TAG)?;
    let (count, own) = match rest.split_once(' ') {
        Some((count, own)) => (count, Some(own)),
        None => (rest, None),
    };
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((count.parse().ok()?, own))
}

/// The holder as its own client labelled it: the count's tag removed.
pub(super) fn untagged(mut holder: HolderInfo) -> HolderInfo {
    if let Some((_, own)) = split(&holder) {
        holder.label = own.map(str::to_owned);
    }
    holder
}

/// [`LockError::Config`] when `holder` of `permit` (of semaphore `name`) was granted by
/// a semaphore of another count than `permits`.
pub(super) fn refuse_another(
    name: &LockKey,
    permits: u32,
    permit: &LockKey,
    holder: &HolderInfo,
) -> Result<(), LockError> {
    match split(holder) {
        Some((theirs, _)) if theirs != permits => Err(LockError::Config(format!(
            "semaphore `{name}` is held with {theirs} permits (`{permit}`), this run gives \
             {permits}: every run of a name must give the same count; to change it, let \
             the holders drain or use a new name"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnerId;

    fn holder(label: Option<&str>) -> HolderInfo {
        HolderInfo {
            owner: OwnerId::random(),
            token: None,
            remaining: None,
            label: label.map(str::to_owned),
            foreign: false,
        }
    }

    #[test]
    fn a_count_and_a_label_round_trip() {
        let tagged_label = tagged(2, Some("host a permits=9")).unwrap();
        assert_eq!(tagged_label, "permits=2 host a permits=9");
        let seen = holder(Some(&tagged_label));
        assert_eq!(split(&seen), Some((2, Some("host a permits=9"))));
        assert_eq!(untagged(seen).label.as_deref(), Some("host a permits=9"));
        let bare = holder(Some(&tagged(64, None).unwrap()));
        assert_eq!(split(&bare), Some((64, None)));
        assert_eq!(untagged(bare).label, None);
    }

    #[test]
    fn records_without_a_count_are_left_alone() {
        for label in [
            None,
            Some("permits="),
            Some("permits=x2"),
            Some("worker"),
            Some("permits=-1 a"),
        ] {
            let seen = holder(label);
            assert_eq!(split(&seen), None, "{label:?}");
            assert_eq!(untagged(seen.clone()), seen);
        }
        let foreign = HolderInfo {
            foreign: true,
            ..holder(Some("permits=3"))
        };
        assert_eq!(
            split(&foreign),
            None,
            "another recipe's record is not ours to read"
        );
    }

    #[test]
    fn another_count_is_refused_naming_both() {
        let (name, permit) = (
            LockKey::new("pm").unwrap(),
            LockKey::new("pm#permit-0").unwrap(),
        );
        let two = holder(Some("permits=2 cron"));
        assert!(refuse_another(&name, 2, &permit, &two).is_ok());
        let error = refuse_another(&name, 3, &permit, &two).unwrap_err();
        let LockError::Config(message) = &error else {
            panic!("{error:?}")
        };
        assert!(
            message.contains("2 permits") && message.contains("gives 3"),
            "{message}"
        );
        assert!(refuse_another(&name, 3, &permit, &holder(Some("cron"))).is_ok());
    }

    #[test]
    fn a_permit_label_leaves_room_for_the_count() {
        let longest = "x".repeat(MAX_PERMIT_LABEL);
        let recorded = tagged(64, Some(&longest)).unwrap();
        assert!(
            validate_label(&recorded).is_ok(),
            "{} bytes",
            recorded.len()
        );
        let over = "x".repeat(MAX_PERMIT_LABEL + 1);
        assert!(matches!(
            tagged(2, Some(&over)),
            Err(LockError::InvalidInput(_))
        ));
        assert!(matches!(
            tagged(2, Some("")),
            Err(LockError::InvalidInput(_))
        ));
    }
}
