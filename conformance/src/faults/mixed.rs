//! The mixed-fleet trial: no fault, but another recipe's real client on the other side
//! of the lock (Curator, `etcdctl lock`, redis-py), as a fleet in mid-migration runs.

use std::time::Duration;

use tenure_api::{AcquireOptions, LockError};

use super::cell::{Trial, Verdict};
use super::trial::{patience, setup_failed, short};
use super::{Fault, Target};
use crate::LostUpdates;

/// How long tenure holds in a trial: no fault ends it, so long enough that nothing
/// expires while the other client is refused.
const HOLD: Duration = Duration::from_secs(30);

/// How long the other client asks while tenure holds.
const REFUSED_WITHIN: Duration = Duration::from_secs(1);

fn trial(verdict: Verdict, fired: bool, note: Option<String>) -> Trial {
    Trial {
        verdict,
        fired,
        note,
        updates: LostUpdates::default(),
    }
}

/// tenure holds the trial's key while the other recipe's client asks for it, then that
/// client holds it while tenure asks: either granted beside the other is UNSAFE (the
/// other recipe has no token to fence with). The trial fired when the other client held
/// the lock; each side is granted once the other lets go, else UNAVAIL.
pub(super) async fn mixed_fleet(target: &Target, index: usize) -> Trial {
    let Some((name, recipe)) = &target.foreign else {
        return trial(Verdict::Unavail, false, Some("no other recipe".into()));
    };
    let key = target.key(Fault::MixedFleet, 0, index);
    let tenure = match target.client().await {
        Ok(client) => client,
        Err(e) => return setup_failed("tenure's client", e),
    };
    let mut theirs = match recipe(key.clone()).await {
        Ok(theirs) => theirs,
        Err(why) => return trial(Verdict::Unavail, false, Some(format!("{name}: {why}"))),
    };
    let mut violations = Vec::new();
    let failed = |what: &str, e: LockError| setup_failed(what, e);
    let lease = match tenure.try_acquire(&key, HOLD).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return trial(Verdict::Unavail, false, Some("a fresh key was held".into())),
        Err(e) => return failed("tenure's acquire", e),
    };
    if theirs.acquire(REFUSED_WITHIN).await {
        violations.push(format!("{name} granted while tenure held"));
        theirs.release().await;
    }
    if let Err(e) = tenure.release(lease).await {
        return failed("tenure's release", e);
    }
    if !theirs.acquire(patience(target)).await {
        let note = format!("{name} not granted once tenure let go");
        return trial(Verdict::Unavail, false, Some(note));
    }
    match tenure.try_acquire(&key, HOLD).await {
        Ok(None) => {}
        Ok(Some(beside)) => {
            violations.push(format!("tenure granted while {name} held"));
            let _ = tenure.release(beside).await;
        }
        Err(e) => return failed("tenure's acquire beside the other", e),
    }
    theirs.release().await;
    let opts = AcquireOptions::new(HOLD).wait(patience(target));
    let note = match tenure.acquire(&key, &opts).await {
        Ok(lease) => {
            let _ = tenure.release(lease).await;
            None
        }
        Err(e) if violations.is_empty() => {
            let note = format!("tenure not granted once {name} let go: {}", short(&e));
            return trial(Verdict::Unavail, true, Some(note));
        }
        Err(_) => None,
    };
    match violations.is_empty() {
        true => trial(Verdict::Safe, true, note),
        false => trial(Verdict::Unsafe, true, Some(violations.join("; "))),
    }
}
