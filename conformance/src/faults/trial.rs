//! The trial machinery shared by every fault: the record of a holder/contender pair, the
//! holder's lease and its stale write, the contender's request, and the verdict.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, Lease, LockError, LockExt, LockKey};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::cell::{Trial, Verdict};
use super::Target;
use crate::history::{Report, Violation};
use crate::{Counter, History, Increment, LostUpdates};

/// The clients of a trial, as its history records them.
pub(super) const HOLDER: usize = 0;
pub(super) const CONTENDER: usize = 1;
pub(super) const WITNESS: usize = 2;

/// What a trial records: every grant, renewal, release and loss of its clients on one
/// clock, and a counter the holder and the contender increment with their tokens.
pub(super) struct Record {
    pub(super) history: History,
    pub(super) counter: Arc<Counter>,
    pub(super) key: LockKey,
    /// The witness's client, made before the fault (a fresh one of the target when the
    /// witness asks, if none).
    pub(super) witness: Option<Arc<dyn DistributedLock>>,
}

impl Record {
    pub(super) fn new(key: LockKey) -> Self {
        Self {
            history: History::new(),
            counter: Arc::new(Counter::new()),
            key,
            witness: None,
        }
    }

    /// `lock`, recorded as `client`.
    pub(super) fn client(
        &self,
        client: usize,
        lock: Arc<dyn DistributedLock>,
    ) -> Arc<dyn DistributedLock> {
        self.history.recorded(client, lock)
    }

    /// Judges the trial. Each client's increment of the counter spans its work: read when
    /// granted, written when the work ends if the client still believes it holds the
    /// lock. The holder writes first, if it believed it held the lock when the contender
    /// was granted (it checked then, and wrote later) or still believes; then it ends; a
    /// witness asks for the lock while the contender still holds it (and increments at
    /// once if granted); the contender writes last and releases. Then the checker examines every hold the history recorded, on intervals:
    /// any two clients' believed holds that overlap are a double grant (F-SAFE when
    /// their tokens let a fence reject the stale one, else UNSAFE), as are a duplicate or
    /// regressed token and a belief past what the server promised (UNSAFE).
    pub(super) async fn judge(
        &self,
        target: &Target,
        holder: Holder,
        contender: &Arc<dyn DistributedLock>,
        mut outcome: Contended,
        fired: bool,
    ) -> Trial {
        let holder_believed = self.history.believed_at(HOLDER, outcome.at);
        let mut holder = holder;
        let writes = holder_believed || self.history.believed_at(HOLDER, Instant::now());
        if let Some(increment) = holder.increment.take().filter(|_| writes) {
            let _ = self.counter.write(increment);
        }
        let stale_write = holder.stale_write;
        let limit = patience(target);
        let mut stuck = None;
        let granted = match tokio::time::timeout(limit, holder.finish()).await {
            Ok(granted) => granted,
            Err(_) => {
                stuck = Some("the holder's release did not return");
                None
            }
        };
        if let Some(lease) = outcome.granted.clone() {
            let increment = outcome.increment.take();
            let after_takeover = async {
                self.witness(target).await;
                // Like every client, it checks its lease before it writes.
                let believes = self.history.believed_at(CONTENDER, Instant::now());
                if let Some(increment) = increment.filter(|_| believes) {
                    let _ = self.counter.write(increment);
                }
                let _ = contender.release(lease).await;
                if let Some((lock, stale)) = granted {
                    stale_extend(target, &lock, stale).await;
                }
            };
            if tokio::time::timeout(limit * 2, after_takeover)
                .await
                .is_err()
            {
                stuck = Some("the witness, the contender's release or the stale extend hung");
            }
        }
        let report = self.history.check();
        let (verdict, note) = verdict(&report, &outcome, stale_write, holder_believed);
        Trial {
            verdict,
            fired,
            note: note.or(stuck.map(String::from)),
            updates: self.counter.lost(),
        }
    }

    /// A third client asks once for the lock the contender holds: a grant is a double
    /// grant the checker sees (a release that freed someone else's lock, a shared value).
    /// Granted, it increments the counter at once, inside the contender's increment.
    pub(super) async fn witness(&self, target: &Target) {
        let client = match &self.witness {
            Some(client) => client.clone(),
            None => match target.client().await {
                Ok(client) => client,
                Err(_) => return,
            },
        };
        let witness = self.client(WITNESS, client);
        if let Ok(Some(lease)) = witness.try_acquire(&self.key, target.ttl).await {
            let _ = self.counter.increment(lease.token());
            let _ = witness.release(lease).await;
        }
    }
}

/// The holder tries once to extend the lease the contender has since taken and given
/// back (retrying only while its connection recovers from the fault): a correct backend
/// refuses; a success tells the holder it held all along, and the checker sees its hold
/// span the contender's.
pub(super) async fn stale_extend(
    target: &Target,
    lock: &Arc<dyn DistributedLock>,
    mut stale: Lease,
) {
    let give_up = Instant::now() + patience(target);
    loop {
        match lock.extend(&mut stale, target.ttl).await {
            Ok(()) => {
                let _ = lock.release(stale).await;
                return;
            }
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return,
        }
    }
}

/// The verdict on a trial from the checker's report, the contender's outcome and, for a
/// paused holder, whether its write after waking was accepted by the fenced store.
pub(super) fn verdict(
    report: &Report,
    outcome: &Contended,
    stale_write: Option<bool>,
    holder_believed: bool,
) -> (Verdict, Option<String>) {
    let granted = outcome.granted.is_some();
    // A holder frozen between its check and its write writes after the takeover.
    let stale = stale_write.filter(|_| granted);
    let mut contained = report.fencing_contained();
    if let Some(accepted) = stale {
        contained = Some(contained.unwrap_or(true) && !accepted);
    }
    let note = report.definite.first().map(describe).or(match stale {
        Some(true) => Some("the woken holder's write after the takeover was accepted".into()),
        Some(false) => Some("the woken holder's write after the takeover was fenced off".into()),
        None => None,
    });
    match contained {
        Some(true) => return (Verdict::FencedSafe, note),
        Some(false) => return (Verdict::Unsafe, note),
        None => {}
    }
    match &outcome.error {
        _ if granted => (Verdict::Safe, None),
        // Still held by the holder: that is mutual exclusion working.
        Some(LockError::Timeout { .. }) if holder_believed => (Verdict::Safe, None),
        Some(LockError::Timeout { .. }) => (
            Verdict::Unavail,
            Some("the lock stayed held after its holder lost it".into()),
        ),
        Some(error) => (Verdict::Unavail, Some(short(error))),
        None => (Verdict::Unavail, None),
    }
}

/// A violation in a few words, without the times that make every note distinct.
pub(super) fn describe(violation: &Violation) -> String {
    let who = |client: usize| match client {
        HOLDER => "holder",
        CONTENDER => "contender",
        WITNESS => "witness",
        _ => "client",
    };
    match violation {
        Violation::Overlap { first, second } => format!(
            "checker: {} and {} held at once; {}",
            who(first.client),
            who(second.client),
            if first.token == second.token {
                "same token: no fence can tell them apart"
            } else {
                "the stale write was fenced off"
            }
        ),
        Violation::DuplicateToken { .. } => "checker: a token was issued twice".into(),
        Violation::TokenRegressed { earlier, later } => format!(
            "fence regressed: token {} after {}",
            later.token, earlier.token
        ),
        Violation::BelievedPastPromise { hold } => format!(
            "checker: the {} believed its lease past the TTL its server promised",
            who(hold.client)
        ),
    }
}

/// The holder of a trial.
pub(super) struct Holder {
    pub(super) lock: Arc<dyn DistributedLock>,
    pub(super) ending: Ending,
    /// Its increment of the trial's counter, read when it was granted.
    pub(super) increment: Option<Increment>,
    /// For a paused holder: whether its write after waking was accepted.
    pub(super) stale_write: Option<bool>,
}

impl Holder {
    /// Until when it believes it holds the lock, as far as its lease says (now for a
    /// guard, which may learn of a loss at any time, or for no lease).
    pub(super) fn believed_until(&self) -> Instant {
        match &self.ending {
            Ending::Lease(lease) => lease.valid_until(),
            Ending::Guard(..) | Ending::Nothing => Instant::now(),
        }
    }

    /// A holder that has nothing to write when its work ends.
    pub(super) fn idle(lock: Arc<dyn DistributedLock>, ending: Ending) -> Self {
        Self {
            lock,
            ending,
            increment: None,
            stale_write: None,
        }
    }
}

/// How the holder's part of a trial ends.
pub(super) enum Ending {
    /// A renewing guard, watched by a task that records its loss (the holder stops
    /// believing then) and releases when told at the end of the trial, like an
    /// application whose work ends after it learned of the loss.
    Guard(oneshot::Sender<()>, JoinHandle<()>, Option<Lease>),
    /// A bare lease, released at the end of the trial.
    Lease(Lease),
    /// Nothing left to release.
    Nothing,
}

impl Holder {
    /// Ends the trial for the holder: releases what it may still hold. Returns the lease
    /// it was granted, with its client, for the stale-extend probe.
    pub(super) async fn finish(self) -> Option<(Arc<dyn DistributedLock>, Lease)> {
        let granted = match self.ending {
            Ending::Guard(done, task, granted) => {
                let _ = done.send(());
                let _ = task.await;
                granted
            }
            Ending::Lease(lease) => {
                let _ = self.lock.release(lease.clone()).await;
                Some(lease)
            }
            Ending::Nothing => None,
        };
        granted.map(|lease| (self.lock, lease))
    }
}

/// What the contender got, and when its call returned.
pub(super) struct Contended {
    pub(super) at: Instant,
    pub(super) granted: Option<Lease>,
    pub(super) error: Option<LockError>,
    /// Its increment of the trial's counter, read when it was granted.
    pub(super) increment: Option<Increment>,
}

/// Asks for the trial's key with `lock` (the contender, recorded), waiting up to
/// [`patience`]; if granted, starts its increment of the trial's counter at once (it
/// writes when its work ends, see [`Record::judge`]). It takes a lease longer than the
/// holder's, so that the witness asks while it still holds.
pub(super) async fn contend(
    target: &Target,
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
) -> Contended {
    contend_for(target, lock, record, target.ttl * 4).await
}

/// [`contend`] with a lease of `ttl`.
pub(super) async fn contend_for(
    target: &Target,
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
    ttl: Duration,
) -> Contended {
    contend_with(
        lock,
        record,
        &AcquireOptions::new(ttl).wait(patience(target)),
    )
    .await
}

/// [`contend`] with these options.
pub(super) async fn contend_with(
    lock: &Arc<dyn DistributedLock>,
    record: &Record,
    opts: &AcquireOptions,
) -> Contended {
    let result = lock.acquire(&record.key, opts).await;
    let at = Instant::now();
    match result {
        Ok(lease) => Contended {
            at,
            increment: Some(record.counter.read(lease.token())),
            granted: Some(lease),
            error: None,
        },
        Err(error) => Contended {
            at,
            granted: None,
            error: Some(error),
            increment: None,
        },
    }
}

pub(super) fn short(error: &LockError) -> String {
    let text = error.to_string();
    match text.char_indices().nth(90) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// Takes the trial's key for its holder (`lock`, recorded), with a renewing guard or as a
/// bare lease, and starts its increment.
pub(super) async fn hold(
    record: &Record,
    lock: Arc<dyn DistributedLock>,
    ttl: Duration,
    guard: bool,
) -> Result<Holder, LockError> {
    let lock = record.client(HOLDER, lock);
    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
    let (token, ending) = if guard {
        let guard = lock.lock(&record.key, &opts).await?;
        let token = guard.fencing_token();
        let granted = guard.lease().await;
        let (done, finished) = oneshot::channel();
        let history = record.history.clone();
        let task = tokio::spawn(async move {
            let mut finished = finished;
            let ended = tokio::select! {
                _ = guard.lost() => {
                    history.lost(HOLDER, Instant::now());
                    false
                }
                _ = &mut finished => true,
            };
            // It stops believing at the loss, but releases when its work ends with the
            // trial (after any takeover): a release that frees another client's lock is
            // then the witness's to see.
            if !ended {
                let _ = finished.await;
            }
            let _ = guard.release().await;
        });
        (token, Ending::Guard(done, task, granted))
    } else {
        let lease = lock.acquire(&record.key, &opts).await?;
        (lease.token(), Ending::Lease(lease))
    };
    Ok(Holder {
        lock,
        ending,
        increment: Some(record.counter.read(token)),
        stale_write: None,
    })
}

/// A trial that could not be set up (a client or the holder's lock failed before any
/// fault): counted as not fired, with the reason in the notes.
pub(super) fn setup_failed(what: &str, error: LockError) -> Trial {
    Trial {
        verdict: Verdict::Unavail,
        fired: false,
        note: Some(format!("{what}: {}", short(&error))),
        updates: LostUpdates::default(),
    }
}

/// A round that could not be set up: each of its `pairs` trials counts as not fired (so a
/// cell keeps its number of trials).
pub(super) fn round_failed(pairs: usize, what: &str, error: LockError) -> Vec<Trial> {
    vec![setup_failed(what, error); pairs]
}

/// How long a contender waits: past any TTL or session expiry in play.
pub(super) fn patience(target: &Target) -> Duration {
    target.ttl * 4 + Duration::from_secs(3)
}
