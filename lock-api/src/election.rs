//! Leader election on any lock: one leader per name, its term a fencing token.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use crate::{
    validate_ttl, AcquireOptions, DistributedLock, FencingKind, FencingToken, HolderInfo,
    LockError, LockExt, LockGuard, LockKey, LostSignal, OwnerId, ReleaseOutcome,
};

/// Leader election for names on any [`DistributedLock`] that records labels and hands out
/// fencing tokens: leading `name` is holding the lock `name`, the leader's value is the
/// grant's [label](AcquireOptions::label), and its **term is the grant's fencing token**.
///
/// A [`Leadership`] is a renewing [`LockGuard`]: while it is not lost, no other candidate's
/// term overlaps its own on the server (under the backend's assumptions, which the decision
/// matrix measures); it is reported lost at its deadline at the latest, before the server
/// can elect another leader. Under a fault that breaks those assumptions (a paused leader,
/// a failover), two leaders can *believe* at once, and the term contains it: pass the term
/// with every write and have the resource refuse terms lower than the highest it has seen.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure_api::{Election, LockKey, MemoryLock};
///
/// # tokio_test_block_on(async {
/// let election = Election::new(Arc::new(MemoryLock::new()))?;
/// let name = LockKey::new("scheduler")?;
/// let leadership = election.campaign(&name, "host-a:8080", Duration::from_secs(5)).await?;
/// let leader = election.leader(&name).await?.expect("a leader");
/// assert_eq!((leader.value.as_str(), leader.term), ("host-a:8080", leadership.term()));
/// leadership.resign().await?;
/// assert!(election.leader(&name).await?.is_none());
/// # Ok::<(), tenure_api::LockError>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    lock: Arc<dyn DistributedLock>,
    ttl: Duration,
}

/// Who leads a name: the value it campaigned with, its term, its owner id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader campaigned with.
    pub value: String,
    /// The leader's term: the fencing token of its grant.
    pub term: FencingToken,
    /// The owner id of the leader's grant.
    pub owner: OwnerId,
}

impl Election {
    /// The default TTL of a leadership's lease: how long a leader that stops renewing
    /// (crashed, paused, cut off) keeps the name before another can be elected.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

    /// Elections on `lock`. [`LockError::Config`] if the backend records no labels (the
    /// leader's value) or has no fencing tokens (the terms).
    pub fn new(lock: Arc<dyn DistributedLock>) -> Result<Self, LockError> {
        let caps = lock.capabilities();
        if !caps.labels {
            return Err(LockError::Config(format!(
                "the {} backend does not record labels, which hold an election's leader value",
                caps.backend
            )));
        }
        if caps.fencing == FencingKind::None {
            return Err(LockError::Config(format!(
                "an election's terms are fencing tokens, and this {} configuration has none \
                 (for Redlock: fencing=true; for Redis: not fence=none)",
                caps.backend
            )));
        }
        Ok(Self {
            lock,
            ttl: Self::DEFAULT_TTL,
        })
    }

    /// Sets the leadership lease's TTL (see [`DEFAULT_TTL`](Self::DEFAULT_TTL));
    /// [`LockError::InvalidInput`] outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL).
    pub fn with_ttl(mut self, ttl: Duration) -> Result<Self, LockError> {
        self.ttl = validate_ttl(ttl)?;
        Ok(self)
    }

    /// Campaigns for `name` with `value` (a [label](crate::validate_label): 1 to 256 bytes,
    /// no control characters), waiting up to `wait` (`Duration::MAX`: without bound) for
    /// the current leader to resign or lose its term — woken by push where the backend
    /// has it, and in arrival order where it is FIFO. [`LockError::Timeout`] if the name
    /// was still led when the wait ran out.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`]: a dropped campaign leaves no candidate behind.
    pub async fn campaign(
        &self,
        name: &LockKey,
        value: &str,
        wait: Duration,
    ) -> Result<Leadership, LockError> {
        let guard = self
            .lock
            .lock(name, &self.campaign_options(value, wait))
            .await?;
        Ok(Leadership {
            guard,
            value: value.to_owned(),
        })
    }

    /// What a campaign acquires the name with: this election's TTL, `wait`, and `value` as
    /// the grant's label. For code that holds the name its own way (`tenure elect` runs a
    /// command under it) and is still a candidate of this election.
    pub fn campaign_options(&self, value: &str, wait: Duration) -> AcquireOptions {
        AcquireOptions::new(self.ttl).wait(wait).label(value)
    }

    /// The current leader of `name`, or `None` while nobody leads it.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        leader_of(name, self.lock.inspect(name).await?)
    }

    /// The leadership of `name` as it changes: the current state first, then each new
    /// leader or vacancy. Terms in the stream strictly increase (a reading older than one
    /// already given is skipped). A failed reading is an `Err` item, and the stream goes
    /// on.
    ///
    /// On a backend that pushes its holders ([`DistributedLock::holder_changes`]) `every`
    /// is not used, and leaders are seen as the server saw them: a candidate whose
    /// campaign timed out just as it came first shows as a leader it never learned it was.
    /// On etcd every leader is seen, however briefly it led; on ZooKeeper every leader
    /// whose node outlives the observer's read of it, made when its creation reaches the
    /// observer (after the changes before it). Elsewhere the leader is read every
    /// `every`: a leader that holds the name for at least `every` is always seen, in
    /// order; one that comes and goes between two readings can be missed.
    pub fn observe(
        &self,
        name: &LockKey,
        every: Duration,
    ) -> BoxStream<'static, Result<Option<Leader>, LockError>> {
        let readings = self.lock.holder_changes(name).unwrap_or_else(|| {
            let lock = self.lock.clone();
            let name = name.clone();
            // Every reading after the first waits `every`, a failed one too.
            stream::unfold(false, move |read| {
                let (lock, name) = (lock.clone(), name.clone());
                async move {
                    if read {
                        tokio::time::sleep(every).await;
                    }
                    Some((lock.inspect(&name).await, true))
                }
            })
            .boxed()
        });
        let name = name.clone();
        let mut terms = Terms::default();
        readings
            .filter_map(move |reading| {
                let leader = reading.and_then(|holder| leader_of(&name, holder));
                let given = match leader {
                    Ok(leader) => terms
                        .next(leader.as_ref().map(|l| l.term))
                        .then_some(Ok(leader)),
                    Err(e) => Some(Err(e)),
                };
                std::future::ready(given)
            })
            .boxed()
    }
}

/// The leader a holder of `name` is: `None` when free, an error for a holder without a
/// value or term (a plain lock on the name).
fn leader_of(name: &LockKey, holder: Option<HolderInfo>) -> Result<Option<Leader>, LockError> {
    let Some(holder) = holder else {
        return Ok(None);
    };
    let (Some(value), Some(term)) = (holder.label, holder.token) else {
        return Err(LockError::backend(format!(
            "`{name}` is held by {} without a leader value or term: a plain lock, not a \
             leadership",
            holder.owner
        )));
    };
    Ok(Some(Leader {
        value,
        term,
        owner: holder.owner,
    }))
}

/// Which terms [`Election::observe`] gives: each change once, terms increasing.
#[derive(Default)]
struct Terms {
    /// What was last given (`None` before the first reading).
    shown: Option<Option<FencingToken>>,
    /// The highest term given so far.
    highest: Option<FencingToken>,
}

impl Terms {
    /// Whether a reading of `term` (`None`: vacant) is given.
    fn next(&mut self, term: Option<FencingToken>) -> bool {
        if term.is_some() && term <= self.highest && self.shown != Some(term) {
            // A stale reading (that term was over already), or the leader seen again
            // after a vacancy read in between: given once only.
            return false;
        }
        if self.shown == Some(term) {
            return false;
        }
        self.shown = Some(term);
        self.highest = self.highest.max(term);
        true
    }
}

/// A won election: the renewing lease on the name, its term and value. Lost when a
/// renewal fails for good or its deadline passes (see [`LockGuard`]); it never
/// re-campaigns on its own.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// The name led.
    pub fn name(&self) -> &LockKey {
        self.guard.key()
    }

    /// This leadership's term: send it with every write the leader makes.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value campaigned with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// True once the leadership is lost (or its deadline has passed).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the leadership is lost, at its deadline at the latest.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// A handle that resolves on loss, to pass to the leader's work.
    pub fn lost_signal(&self) -> LostSignal {
        self.guard.lost_signal()
    }

    /// The renewing guard of the leadership's lease, for code written for a [`LockGuard`]
    /// (releasing it resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Steps down, freeing the name for the next candidate.
    /// [`ReleaseOutcome::NotHeld`] if the term had already ended.
    ///
    /// # Cancel safety
    /// If dropped, the name is released in the background, as when a `Leadership` is
    /// dropped.
    pub async fn resign(self) -> Result<ReleaseOutcome, LockError> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::{Capabilities, HolderInfo, Lease, MemoryLock};

    /// A memory lock declaring `caps`, whose `inspect` answers from `script` (terms of
    /// leaders named `leader-<term>`) until it runs out — or, when `fed`, whose
    /// `holder_changes` gives the whole script as its feed.
    #[derive(Debug)]
    struct Fake {
        memory: MemoryLock,
        caps: Capabilities,
        script: std::sync::Mutex<Vec<Result<Option<u64>, LockError>>>,
        fed: bool,
    }

    impl Fake {
        fn new(caps: Capabilities, script: Vec<Result<Option<u64>, LockError>>) -> Arc<Self> {
            // Forwards no shared acquire.
            let caps = Capabilities {
                shared: false,
                ..caps
            };
            let (memory, script) = (MemoryLock::new(), std::sync::Mutex::new(script));
            Arc::new(Self {
                memory,
                caps,
                script,
                fed: false,
            })
        }

        fn holder(term: Option<u64>) -> Option<HolderInfo> {
            term.map(|term| HolderInfo {
                owner: OwnerId([0; 16]),
                token: Some(FencingToken(term)),
                remaining: None,
                label: Some(format!("leader-{term}")),
                foreign: false,
            })
        }
    }

    #[async_trait]
    impl DistributedLock for Fake {
        async fn try_acquire(
            &self,
            key: &LockKey,
            ttl: Duration,
        ) -> Result<Option<Lease>, LockError> {
            self.memory.try_acquire(key, ttl).await
        }
        async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
            self.memory.acquire(key, opts).await
        }
        async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
            self.memory.extend(lease, ttl).await
        }
        async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
            self.memory.release(lease).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
            let next = {
                let mut script = self.script.lock().unwrap();
                (!script.is_empty()).then(|| script.remove(0))
            };
            let Some(next) = next else {
                return self.memory.inspect(key).await;
            };
            Ok(Self::holder(next?))
        }
        fn capabilities(&self) -> Capabilities {
            self.caps
        }
        fn holder_changes(&self, _key: &LockKey) -> Option<crate::HolderFeed> {
            if !self.fed {
                return None;
            }
            let script = std::mem::take(&mut *self.script.lock().unwrap());
            let feed = script.into_iter().map(|r| r.map(Self::holder));
            Some(stream::iter(feed).boxed())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn observers_follow_a_pushed_feed_without_reading() {
        let script = vec![
            Ok(None),
            Ok(Some(1)),
            Ok(None),
            Err(LockError::backend("watch broke")),
            Ok(Some(1)), // a feed that repeats itself (a misbehaving backend): given once
            Ok(Some(2)),
            Ok(Some(3)),
        ];
        let lock = Arc::new(Fake {
            fed: true,
            ..Arc::into_inner(Fake::new(MemoryLock::new().capabilities(), script)).unwrap()
        });
        let started = tokio::time::Instant::now();
        let changes: Vec<_> = Election::new(lock)
            .unwrap()
            .observe(&LockKey::new("n").unwrap(), Duration::from_secs(3600))
            .map(|c| c.map(|l| l.map(|l| l.term.get())).map_err(|_| ()))
            .collect()
            .await;
        assert_eq!(
            changes,
            [
                Ok(None),
                Ok(Some(1)),
                Ok(None),
                Err(()),
                Ok(Some(2)),
                Ok(Some(3))
            ]
        );
        assert_eq!(started.elapsed(), Duration::ZERO, "no reading waited for");
    }

    #[tokio::test(start_paused = true)]
    async fn observers_give_each_term_once_in_order_and_wait_between_failed_readings() {
        use futures::StreamExt;
        let down = || Err(LockError::backend("down"));
        let script = vec![
            down(),
            down(),
            Ok(Some(2)),
            Ok(Some(2)),
            Ok(None), // a vacancy read between two readings of one term
            Ok(Some(2)),
            Ok(Some(1)), // stale
            Ok(Some(3)),
            Ok(None),
        ];
        let lock = Fake::new(MemoryLock::new().capabilities(), script);
        let every = Duration::from_millis(50);
        let started = tokio::time::Instant::now();
        let changes: Vec<_> = Election::new(lock)
            .unwrap()
            .observe(&LockKey::new("n").unwrap(), every)
            .take(6)
            .map(|c| {
                c.map(|l| l.map(|l| (l.term.get(), l.value)))
                    .map_err(|_| ())
            })
            .collect()
            .await;
        let leader = |t: u64| Ok(Some((t, format!("leader-{t}"))));
        assert_eq!(
            changes,
            [Err(()), Err(()), leader(2), Ok(None), leader(3), Ok(None)]
        );
        assert_eq!(started.elapsed(), every * 8, "one reading per interval");
    }

    #[test]
    fn backends_without_labels_or_terms_are_refused() {
        let memory = MemoryLock::new().capabilities();
        let no_labels = Capabilities {
            labels: false,
            ..memory
        };
        let no_fence = Capabilities {
            fencing: FencingKind::None,
            ..memory
        };
        for (caps, why) in [(no_labels, "labels"), (no_fence, "fencing")] {
            match Election::new(Fake::new(caps, Vec::new())) {
                Err(LockError::Config(message)) => assert!(message.contains(why), "{message}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        assert!(Election::new(Arc::new(MemoryLock::new())).is_ok());
    }

    #[tokio::test]
    async fn a_plain_lock_on_the_name_is_no_leader() {
        let lock = Arc::new(MemoryLock::new());
        let election = Election::new(lock.clone()).unwrap();
        let name = LockKey::new("plain").unwrap();
        let lease = lock
            .try_acquire(&name, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(matches!(
            election.leader(&name).await,
            Err(LockError::Backend { .. })
        ));
        lock.release(lease.unwrap()).await.unwrap();
        assert_eq!(election.leader(&name).await.unwrap(), None);
        assert!(election.clone().with_ttl(Duration::ZERO).is_err());
        let bad = election.campaign(&name, "two\nlines", Duration::ZERO).await;
        assert!(matches!(bad, Err(LockError::InvalidInput(_))), "{bad:?}");
    }
}
