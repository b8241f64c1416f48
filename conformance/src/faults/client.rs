//! Client faults: one holder whose links pass through proxies of its own, stalled,
//! cut or delayed while a healthy contender asks for its key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, ExpiryKind, LockError, LockKey};

use super::cell::{Trial, Verdict};
use super::paused::{paused_holder, Primitive, Stop};
use super::trial::{
    contend, contend_for, contend_with, hold, patience, setup_failed, short, Contended, Ending,
    Holder, Record, CONTENDER, HOLDER,
};
use super::vanished;
use super::{Fault, Target, STALL};
use crate::proxy::ProxyMode;
use crate::{Link, Links};

/// What a trial on one holder's links works with.
pub(super) struct ClientTrial<'a> {
    target: &'a Target,
    /// The holder's client, reaching every server through its own proxies.
    lock: Arc<dyn DistributedLock>,
    links: Links,
    /// A healthy client, recorded.
    contender: Arc<dyn DistributedLock>,
    record: Record,
}

/// One trial of a fault on the holder's own links.
pub(super) async fn client_trial(fault: Fault, target: &Target, index: usize) -> Trial {
    let mut record = Record::new(target.key(fault, 0, index));
    if fault == Fault::VanishedQueueRecord {
        return vanished::vanished_record(target, record).await;
    }
    // The witness connects now, not after the contender's grant: a connection made then
    // (a TLS handshake and a password check, on a loaded machine) could outlast the
    // contender's lease, which would then end before the contender writes.
    match target.client().await {
        // A semaphore's witness asks the semaphore: refused while the contender holds
        // the permit and the other permit is held.
        Ok(c) if fault == Fault::PausedPermitHolder => {
            record.witness = Some(Primitive::Permit.wrap(c));
        }
        Ok(c) => record.witness = Some(c),
        Err(e) => return setup_failed("witness", e),
    }
    match fault {
        Fault::PausedHolder => {
            return paused_holder(target, record, Primitive::Lock, Stop::Pause).await;
        }
        Fault::PausedPermitHolder => {
            return paused_holder(target, record, Primitive::Permit, Stop::Pause).await;
        }
        Fault::PausedLeader => {
            return paused_holder(target, record, Primitive::Leadership, Stop::Pause).await;
        }
        Fault::PausedReader => {
            return paused_holder(target, record, Primitive::Reader, Stop::Pause).await;
        }
        Fault::ClientSuspend => {
            let tells = !target.stopping_clock;
            return paused_holder(target, record, Primitive::Lock, Stop::Suspend { tells }).await;
        }
        _ => {}
    }
    let query = match fault {
        Fault::DelayedReply | Fault::LostReply => target.patient_query(),
        _ => target.harness.cut_options(),
    };
    let (lock, links) = match target.harness.proxied_client(query).await {
        Ok(client) => client,
        Err(e) => return setup_failed("proxied client", e),
    };
    let contender = match target.client().await {
        Ok(c) => record.client(CONTENDER, c),
        Err(e) => return setup_failed("contender", e),
    };
    let trial = ClientTrial {
        target,
        lock,
        links,
        contender,
        record,
    };
    match fault {
        // Every other trial delays a release instead of an acquire.
        Fault::DelayedReply if index % 2 == 1 => trial.delayed_release().await,
        Fault::DelayedReply => trial.delayed_reply().await,
        Fault::Blackhole => trial.blackhole().await,
        Fault::ConnectionCut => trial.connection_cut().await,
        Fault::StaleAcquire => trial.stale_acquire().await,
        Fault::StaleExtend => trial.stale_extend().await,
        Fault::StaleRelease => trial.stale_release().await,
        _ => trial.lost_reply().await,
    }
}

impl ClientTrial<'_> {
    pub(super) fn set_mode(&self, mode: ProxyMode) {
        for proxy in self.links.proxies() {
            proxy.set_mode(mode);
        }
    }

    pub(super) async fn contend(&self) -> Contended {
        contend(self.target, &self.contender, &self.record).await
    }

    pub(super) async fn judge(self, holder: Holder, outcome: Contended, fired: bool) -> Trial {
        self.record
            .judge(self.target, holder, &self.contender, outcome, fired)
            .await
    }

    /// The holder's acquire is answered late, after a TTL; the contender asks meanwhile.
    /// The checker sees the holder's belief from the reply to its deadline: a deadline
    /// counted from the reply overlaps the contender and outlives the server's promise.
    pub(super) async fn delayed_reply(self) -> Trial {
        let delay = self.target.ttl + Duration::from_millis(500);
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
        let lock = self.record.client(HOLDER, self.lock.clone());
        let sent = Instant::now();
        let holder = async {
            let granted = lock.try_acquire(&self.record.key, self.target.ttl).await;
            (granted, Instant::now())
        };
        // The contender starts once the holder's request is surely on the server.
        let contender = async {
            tokio::time::sleep(self.target.ttl / 4).await;
            self.contend().await
        };
        let ((granted, replied), outcome) = tokio::join!(holder, contender);
        self.set_mode(ProxyMode::Pass);
        let fired = replied - sent >= delay;
        let note = match &granted {
            Ok(Some(l)) if l.valid_until() <= replied => {
                Some("granted after its deadline: the holder knows it is already expired".into())
            }
            Ok(Some(_)) => None,
            Ok(None) | Err(_) => Some("the holder refused the late grant".into()),
        };
        let (ending, increment) = match granted {
            Ok(Some(lease)) => {
                let increment = self.record.counter.read(lease.token());
                (Ending::Lease(lease), Some(increment))
            }
            Ok(None) | Err(_) => (Ending::Nothing, None),
        };
        let holder = Holder {
            increment,
            ..Holder::idle(lock, ending)
        };
        let mut trial = self.judge(holder, outcome, fired).await;
        trial.note = trial.note.or(note);
        trial
    }

    /// The holder releases while the server's replies to it are delayed past its lease's
    /// remaining TTL, a contender waiting. A release that runs on the server at once frees
    /// the lock for the contender after the holder stopped believing; a release whose
    /// owner check and delete are two requests deletes, after the late check, whatever
    /// lock is there by then: the contender's, which the witness is then granted. Fired:
    /// the release took at least the delay, and the contender was granted before it
    /// returned.
    pub(super) async fn delayed_release(self) -> Trial {
        let delay = match self.target.caps.expiry {
            // ZooKeeper's client drops a connection silent for 2/5 of the session timeout
            // (the TTL): a longer delay fails the release before its reply is due.
            ExpiryKind::SessionHeartbeat => self.target.ttl / 5,
            _ => self.target.ttl + Duration::from_millis(500),
        };
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
        // It releases at once, still believing (its belief ends at this call).
        let started = Instant::now();
        let release = tokio::spawn({
            let lock = lock.clone();
            async move {
                let released = lock.release(lease).await;
                (released, Instant::now())
            }
        });
        // The contender's lease outlasts the late release and the witness's request.
        let outcome = contend_for(
            self.target,
            &self.contender,
            &self.record,
            self.target.ttl * 4 + delay * 2,
        )
        .await;
        // Replies already on their way keep their delay; later ones pass.
        self.set_mode(ProxyMode::Pass);
        // The holder's release returns before the witness asks.
        let (fired, note) = match tokio::time::timeout(patience(self.target), release).await {
            Ok(Ok((released, returned))) => (
                returned - started >= delay && outcome.at < returned,
                released.err().map(|e| format!("release: {}", short(&e))),
            ),
            _ => (false, Some("the holder's release did not return".into())),
        };
        let holder = Holder::idle(lock, Ending::Nothing);
        let mut trial = self.judge(holder, outcome, fired).await;
        trial.note = trial.note.or(note);
        trial
    }

    pub(super) async fn blackhole(self) -> Trial {
        let holder = match hold(&self.record, self.lock.clone(), self.target.ttl, true).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        self.links.cut();
        let outcome = self.contend().await;
        let fired = self.links.fired();
        self.links.heal();
        self.judge(holder, outcome, fired).await
    }

    /// The holder's connections reset while it holds; they stay refused while a contender
    /// asks. Fired: the proxy reset at least one of the holder's connections.
    pub(super) async fn connection_cut(self) -> Trial {
        let holder = match hold(&self.record, self.lock.clone(), self.target.ttl, true).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        self.set_mode(ProxyMode::Reset);
        let outcome = self.contend().await;
        let fired = self.links.proxies().iter().any(|p| p.stats().resets > 0);
        self.set_mode(ProxyMode::Pass);
        self.judge(holder, outcome, fired).await
    }

    /// The holder's acquire reaches the server, which grants it; the reply is lost with
    /// the connection. Fired: the request's bytes went through the proxy, the holder got
    /// no lease, and a healthy client saw the orphaned grant held. The note says how long
    /// the orphan blocked the contender.
    pub(super) async fn lost_reply(self) -> Trial {
        let sent_up = || -> u64 {
            self.links
                .proxies()
                .iter()
                .map(|p| p.stats().bytes_up)
                .sum()
        };
        let before = sent_up();
        // Replies are held back long enough for a healthy client to see the grant the
        // request made while its reply is still on the way; acquires of several steps
        // (ZooKeeper's sync, etcd's lease grant) get their earlier replies, later. The
        // lease is long enough for its server not to end it while replies lag
        // (Postgres's idle-in-transaction timer is the TTL). The orphan exists only
        // between the granting step and the reply to the last step: a delay of 400 ms
        // leaves a loaded machine's `inspect` time to see it (at 100 ms, 1 Postgres trial
        // in 20 read "the reply got through").
        let ttl = self.target.ttl * 4;
        self.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: (self.target.ttl / 2).min(Duration::from_millis(400)),
        });
        let lock = self.record.client(HOLDER, self.lock.clone());
        let attempt = tokio::spawn({
            let (lock, key) = (lock.clone(), self.record.key.clone());
            async move { lock.try_acquire(&key, ttl).await }
        });
        // The orphan: held on the server while the holder waits for its answer. Once it
        // is seen, the connection (and the reply on its way) is lost.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut orphan_seen = false;
        while !orphan_seen && !attempt.is_finished() && Instant::now() < deadline {
            orphan_seen = matches!(self.contender.inspect(&self.record.key).await, Ok(Some(_)));
        }
        let reached = sent_up() > before;
        self.set_mode(ProxyMode::Reset);
        let holder_result = tokio::time::timeout(patience(self.target), attempt).await;
        self.set_mode(ProxyMode::Pass);
        let reply_lost = !matches!(holder_result, Ok(Ok(Ok(Some(_)))));
        let lost_at = Instant::now();
        let outcome = self.contend().await;
        let blocked = outcome.at - lost_at;
        let note = match (&outcome.granted, reply_lost, orphan_seen) {
            (_, false, _) => "the reply got through".to_string(),
            (_, true, false) => "no orphaned grant was seen on the server".to_string(),
            (Some(_), true, true) => format!("orphan blocked others for {}", round_secs(blocked)),
            (None, true, true) => "the orphan was never cleared".to_string(),
        };
        let ending = match holder_result {
            Ok(Ok(Ok(Some(lease)))) => Ending::Lease(lease),
            _ => Ending::Nothing,
        };
        let holder = Holder::idle(lock, ending);
        let fired = reached && reply_lost && orphan_seen;
        let mut trial = self.judge(holder, outcome, fired).await;
        if matches!(trial.verdict, Verdict::Safe | Verdict::Unavail) {
            trial.note = Some(note);
        }
        trial
    }
}

/// The holder's proxies' counts of stalled bytes: read, and delivered.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stalled {
    read: u64,
    delivered: u64,
}

impl ClientTrial<'_> {
    /// Stalls every connection the holder has open now (see [`STALL`]).
    pub(super) fn stall(&self, late: Duration) {
        for proxy in self.links.proxies() {
            proxy.stall(late);
        }
    }

    pub(super) fn stalled(&self) -> Stalled {
        self.links
            .proxies()
            .iter()
            .map(|p| p.stats())
            .fold(Stalled::default(), |sum, s| Stalled {
                read: sum.read + s.bytes_stalled,
                delivered: sum.delivered + s.bytes_stalled_delivered,
            })
    }

    /// Whether the stalled requests all landed after `then`, the holder's next grant or
    /// extension, and in time to test it: at `then` something was stalled and nothing
    /// stalled had been delivered yet (so the request the client gave up on was still
    /// on its way), and every stalled byte is delivered (waited for, then a moment for
    /// the servers to act on it) a margin before `believed_until`, so the contender can
    /// still ask while the holder believes.
    pub(super) async fn stalled_landed(&self, then: Stalled, believed_until: Instant) -> bool {
        if then.read == 0 || then.delivered > 0 {
            return false;
        }
        let margin = self.target.ttl.min(Duration::from_millis(500));
        let give_up = believed_until
            .checked_sub(margin * 2)
            .unwrap_or(believed_until);
        loop {
            let now = self.stalled();
            if now.delivered >= now.read {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Instant::now() + margin < believed_until;
            }
            if Instant::now() >= give_up {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A grant and release on a key of its own: the holder's connections are up (and a
    /// Redis server has the scripts) before its connections stall.
    pub(super) async fn warm_up(&self) -> Result<(), LockError> {
        let key = LockKey::new(format!("{}/warm-up", self.record.key))?;
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = self.lock.acquire(&key, &opts).await?;
        let _ = self.lock.release(lease).await;
        Ok(())
    }

    /// The contender asks while the holder (a healthy client all along) still believes
    /// it holds the lock, and gives up before the holder's belief ends: granted only if
    /// a late request freed the holder's lock on the server.
    pub(super) async fn contend_while_held(&self, believed_until: Instant) -> Contended {
        let margin = self.target.ttl.min(Duration::from_millis(500));
        let wait = believed_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        let opts = AcquireOptions::new(self.target.ttl * 4).wait(wait);
        let mut outcome = contend_with(&self.contender, &self.record, &opts).await;
        // The servers are healthy (the stall is over) and the lock is held all this wait:
        // a last try that could not tell — a Redlock round short of answers on a loaded
        // host (a soak runs every backend's trials at once) — missed no free lock. It is
        // judged as the timeout it stands for; the verdict still requires the holder to
        // have believed it held when the wait ended.
        if outcome
            .error
            .as_ref()
            .is_some_and(|e| e.is_retryable() && !matches!(e, LockError::Timeout { .. }))
        {
            outcome.error = Some(LockError::Timeout { waited: wait });
        }
        outcome
    }

    /// See [`Fault::StaleAcquire`]. The holder takes the lock as a bare lease that
    /// outlasts the stall by four TTLs while its connections stall; once the stalled
    /// requests have landed, the contender asks. A late request (or a clean-up of one,
    /// sent behind it) that acts on the retry's grant frees the lock under the holder,
    /// who works on until its deadline (a guard would learn of it at its next renewal,
    /// after the contender could be granted). Fired: stalled bytes were delivered after
    /// the holder's grant.
    pub(super) async fn stale_acquire(self) -> Trial {
        if let Err(e) = self.warm_up().await {
            return setup_failed("holder's warm-up", e);
        }
        self.stall(STALL);
        let long = STALL + self.target.ttl * 4;
        let holder = match hold(&self.record, self.lock.clone(), long, false).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder", e),
        };
        let granted = self.stalled();
        let fired = self.stalled_landed(granted, holder.believed_until()).await;
        self.stall(Duration::ZERO);
        let outcome = self.contend_while_held(holder.believed_until()).await;
        self.judge(holder, outcome, fired).await
    }

    /// See [`Fault::StaleExtend`]. The holder holds a bare lease and extends it by one
    /// TTL while its connections stall; it gives up, then extends it by the stall plus
    /// four TTLs over a fresh connection; once the short extension has landed, the
    /// contender asks. An extension that sets the expiry to its own argument ends the
    /// lock on the server some three TTLs before the holder believes. Fired: the short
    /// extension failed, the long one succeeded, and stalled bytes were delivered after
    /// it.
    pub(super) async fn stale_extend(self) -> Trial {
        let long = STALL + self.target.ttl * 4;
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(long).wait(Duration::from_secs(10));
        let mut lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        let increment = Some(self.record.counter.read(lease.token()));
        self.stall(STALL);
        let short = lock.extend(&mut lease.clone(), self.target.ttl).await;
        let give_up = Instant::now() + patience(self.target);
        let extended = loop {
            match lock.extend(&mut lease, long).await {
                Ok(()) => break Ok(()),
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => break Err(e),
            }
        };
        let after = self.stalled();
        let landed = self.stalled_landed(after, lease.valid_until()).await;
        self.stall(Duration::ZERO);
        let note = match (&short, &extended) {
            (Ok(()), _) => Some("the stalled extension got its reply in time".to_string()),
            (_, Err(e)) => Some(format!("the long extension failed: {}", short_text(e))),
            _ => None,
        };
        let fired = short.is_err() && extended.is_ok() && landed;
        let outcome = self.contend_while_held(lease.valid_until()).await;
        let holder = Holder {
            increment,
            ..Holder::idle(lock, Ending::Lease(lease))
        };
        let mut trial = self.judge(holder, outcome, fired).await;
        if !fired {
            trial.note = trial.note.or(note);
        }
        trial
    }

    /// See [`Fault::StaleRelease`]. The holder releases a lease of one TTL while its
    /// connections stall for longer than that; it gives up, and takes the lock again
    /// (a bare lease that outlasts the stall by four TTLs, over a fresh connection) once
    /// the first expired; once the stalled release has landed, the contender asks. A release that does not name the
    /// grant it ends frees the new one. Fired: the release failed, the holder was granted
    /// again, and stalled bytes were delivered after that grant.
    pub(super) async fn stale_release(self) -> Trial {
        let lock = self.record.client(HOLDER, self.lock.clone());
        let opts = AcquireOptions::new(self.target.ttl).wait(Duration::from_secs(10));
        let lease = match lock.acquire(&self.record.key, &opts).await {
            Ok(lease) => lease,
            Err(e) => return setup_failed("holder", e),
        };
        let late = self.target.ttl + STALL;
        self.stall(late);
        let released = lock.release(lease).await;
        let again = late + self.target.ttl * 4;
        let holder = match hold(&self.record, self.lock.clone(), again, false).await {
            Ok(h) => h,
            Err(e) => return setup_failed("holder's second grant", e),
        };
        let granted = self.stalled();
        let landed = self.stalled_landed(granted, holder.believed_until()).await;
        self.stall(Duration::ZERO);
        let fired = released.is_err() && landed;
        let outcome = self.contend_while_held(holder.believed_until()).await;
        let mut trial = self.judge(holder, outcome, fired).await;
        if released.is_ok() && trial.note.is_none() {
            trial.note = Some("the stalled release got its reply in time".into());
        }
        trial
    }
}

pub(super) fn short_text(error: &LockError) -> String {
    short(error)
}

pub(super) fn round_secs(d: Duration) -> String {
    match d.as_millis() {
        ms if ms < 1000 => "<1 s".to_string(),
        ms => format!("~{} s", (ms + 500) / 1000),
    }
}
