//! How an etcd lease's key moves between etcd leases, under lost replies and cancellation.
//! Each test runs one member behind the harness's fault proxy and asserts that the fault
//! really fired.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, Lease, LockError, LockKey};
use tenure_conformance::proxy::ProxyMode;
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::{EtcdLock, RequestFault, RequestFaults};
use tokio::sync::Semaphore;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("leases/{name}")).unwrap()
}

async fn connect(addr: &str, options: &str) -> EtcdLock {
    EtcdLock::connect(&format!("etcd://{addr}/leases?{options}"))
        .await
        .unwrap()
}

/// A plain etcd client on the member, bypassing the proxy.
async fn plain(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect([cluster.members()[0].endpoint()], None)
        .await
        .unwrap()
}

/// The keys queued for `key`, oldest first: (etcd key, its etcd lease id).
async fn queue(
    client: &mut etcd_client::Client,
    lock: &EtcdLock,
    key: &LockKey,
) -> Vec<(String, i64)> {
    let options = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let reply = client
        .get(lock.queue_prefix(key), Some(options))
        .await
        .unwrap();
    reply
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_owned(), kv.lease()))
        .collect()
}

/// Polls `check` every 20 ms until it yields, for at most `limit`.
async fn poll<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `extend` to a TTL needing more whole seconds moves the key to a new etcd lease. If the
/// caller drops the call after the move applied but before its reply arrived, the new
/// lease must not be revoked: the key now lives on it, and revoking it would free the lock
/// while the holder still believes it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_a_longer_lease_cancelled_in_flight_never_frees_the_lock() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let member = &cluster.members()[0];
    let holder = connect(
        &member.proxied_addr().to_string(),
        "request_timeout_ms=10000",
    )
    .await;
    let contender = connect(&member.addr().to_string(), "").await;
    let mut client = plain(&cluster).await;
    let k = key("cancelled-move");

    let mut lease: Lease = holder
        .try_acquire(&k, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    let before = queue(&mut client, &holder, &k).await;
    assert_eq!(before.len(), 1);
    let old_lease = before[0].1;

    // Replies now take a second to come back: the move's lease grant completes, its
    // transaction applies on the server, and the call is dropped while that reply is
    // still in the proxy.
    member.proxy().set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: Duration::from_millis(1000),
    });
    let moved = {
        let client = client.clone();
        let (holder, k) = (holder.clone(), k.clone());
        async move {
            poll(
                "the key to move to a new lease",
                Duration::from_secs(8),
                || {
                    let (mut client, holder, k) = (client.clone(), holder.clone(), k.clone());
                    async move {
                        let now = queue(&mut client, &holder, &k).await;
                        (now.len() == 1 && now[0].1 != old_lease).then_some(now[0].1)
                    }
                },
            )
            .await
        }
    };
    let new_lease = tokio::select! {
        result = holder.extend(&mut lease, Duration::from_secs(30)) => {
            panic!("the extend finished before its move was seen: {result:?}")
        }
        new_lease = moved => new_lease,
    };
    member.proxy().set_mode(ProxyMode::Pass);
    assert!(
        member.proxy().stats().bytes_down > 0,
        "the fault fired: replies went through the delaying proxy"
    );

    // Give a background revoke of the new lease, if any, time to land: it goes out at
    // once, and the next request on the same client is answered after it.
    let _ = holder.inspect(&k).await;
    let after = queue(&mut client, &holder, &k).await;
    assert_eq!(
        after,
        vec![(before[0].0.clone(), new_lease)],
        "the key stays on the lease it was moved to"
    );
    assert!(
        contender
            .try_acquire(&k, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "the lock was freed while its holder believed it held (until {:?} from now)",
        lease
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
}

/// An acquire whose enqueue applied but whose reply was lost leaves a key behind on the
/// server. The retry must recognise it as its own instead of queueing behind it for a
/// whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_enqueue_reply_does_not_wait_behind_its_own_orphan() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let member = &cluster.members()[0];
    let holder = connect(
        &member.proxied_addr().to_string(),
        "request_timeout_ms=3000",
    )
    .await;
    let mut client = plain(&cluster).await;
    let k = key("orphan");
    let ttl = Duration::from_secs(20);

    member.proxy().set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: Duration::from_millis(500),
    });
    let acquiring = {
        let (holder, k) = (holder.clone(), k.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
            let result = holder.acquire(&k, &opts).await;
            (result, Instant::now())
        })
    };
    // The enqueue transaction applied; its reply is still held by the proxy. Reset the
    // connection: the reply is lost, and so is every clean-up attempt while resetting.
    let orphan = poll("the enqueue to apply", Duration::from_secs(8), || {
        let (mut client, holder, k) = (client.clone(), holder.clone(), k.clone());
        async move {
            let now = queue(&mut client, &holder, &k).await;
            now.first().cloned()
        }
    })
    .await;
    member.proxy().set_mode(ProxyMode::Reset);
    let reset_at = Instant::now();
    poll(
        "several refused retries",
        Duration::from_secs(8),
        || async { (member.proxy().stats().resets >= 4).then_some(()) },
    )
    .await;
    member.proxy().set_mode(ProxyMode::Pass);
    let queued = queue(&mut client, &holder, &k).await;
    assert_eq!(
        queued.first(),
        Some(&orphan),
        "the fault fired: the lost enqueue left its key behind"
    );

    let (result, acquired_at) = acquiring.await.unwrap();
    let lease: Lease = match result {
        Ok(lease) => lease,
        Err(LockError::Timeout { waited }) => {
            panic!("queued behind its own orphan until the wait ran out ({waited:?})")
        }
        Err(e) => panic!("acquire failed: {e}"),
    };
    assert!(
        acquired_at - reset_at < ttl / 2,
        "acquired {:?} after the reset: it waited for its orphan's lease to expire",
        acquired_at - reset_at
    );
    let queued = queue(&mut client, &holder, &k).await;
    assert_eq!(queued.len(), 1, "one key for one holder: {queued:?}");
    holder.release(lease).await.unwrap();
    assert!(queue(&mut client, &holder, &k).await.is_empty());
}

/// A waiter whose own queue key vanished while it waited (an operator's `etcdctl del`
/// with the lease kept alive; what a client suspend does to a session lease) must never
/// be granted on it beside the next holder: once its predecessor goes it queues again
/// (here behind that holder, so its wait runs out) or fails. In both lease modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_queue_key_vanished_is_never_granted_on_it() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let addr = cluster.members()[0].addr().to_string();
    let mut client = plain(&cluster).await;
    for options in ["lease=session", "lease=per-lock"] {
        let (holder, waiter, next) = (
            connect(&addr, options).await,
            connect(&addr, options).await,
            connect(&addr, options).await,
        );
        let k = key(&format!("vanished-{options}"));
        let ttl = Duration::from_secs(5);
        let held = holder.try_acquire(&k, ttl).await.unwrap().expect("free");
        let waiting = {
            let (waiter, k) = (waiter.clone(), k.clone());
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(3));
            tokio::spawn(async move { waiter.acquire(&k, &opts).await })
        };
        let waiters_key = poll("the waiter to queue", Duration::from_secs(5), || {
            let (mut client, holder, k) = (client.clone(), holder.clone(), k.clone());
            async move {
                let queued = queue(&mut client, &holder, &k).await;
                (queued.len() == 2).then(|| queued[1].0.clone())
            }
        })
        .await;
        let deleted = client.delete(waiters_key.as_str(), None).await.unwrap();
        assert_eq!(
            deleted.deleted(),
            1,
            "the fault fired: the waiter's key is gone"
        );
        let coming = {
            let (next, k) = (next.clone(), k.clone());
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(5));
            tokio::spawn(async move { next.acquire(&k, &opts).await })
        };
        poll("the next waiter to queue", Duration::from_secs(5), || {
            let (mut client, holder, k) = (client.clone(), holder.clone(), k.clone());
            async move { (queue(&mut client, &holder, &k).await.len() == 2).then_some(()) }
        })
        .await;
        holder.release(held).await.unwrap();
        let granted = coming.await.unwrap().expect("the next waiter is granted");
        let result = waiting.await.unwrap();
        assert!(
            matches!(result, Err(LockError::Timeout { .. })),
            "{options}: the waiter whose key vanished must queue again behind the holder, \
             not be granted beside it: {result:?}"
        );
        let info = next.inspect(&k).await.unwrap().expect("held");
        assert_eq!(
            info.owner,
            granted.owner(),
            "{options}: the holder's key is first"
        );
        next.release(granted).await.unwrap();
    }
}

/// Defect: a session lease's grant held the client's session map across its round trip,
/// so every `extend` and `release` on that client waited for it: a slow grant (a new TTL
/// on a slow link) stalled the renewal of locks already held, and a guard could be
/// reported lost. Replies are delayed by 800 ms; an `extend` sent while a grant is in
/// flight now takes one delayed round trip, not the grant's and then its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_session_grant_never_delays_an_extend() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let member = &cluster.members()[0];
    let lock = connect(
        &member.proxied_addr().to_string(),
        "request_timeout_ms=10000",
    )
    .await;
    // Long enough that the session's last keep-alive stands for the extend's (a fifth of
    // the TTL): the extend is then one read.
    let ttl = Duration::from_secs(30);
    let mut held = lock
        .try_acquire(&key("held"), ttl)
        .await
        .unwrap()
        .expect("free");
    let delay = Duration::from_millis(800);
    member.proxy().set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: delay,
    });
    // A TTL of other whole seconds needs a session lease of its own: a grant.
    let granting = {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.try_acquire(&key("new-ttl"), Duration::from_secs(7))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!granting.is_finished(), "the grant is in flight");
    let started = Instant::now();
    lock.extend(&mut held, ttl).await.unwrap();
    let took = started.elapsed();
    let other = granting.await.unwrap().unwrap().expect("free");
    member.proxy().set_mode(ProxyMode::Pass);
    assert!(
        took >= delay,
        "the fault fired: the extend's reply was delayed ({took:?})"
    );
    assert!(
        took < delay * 3 / 2,
        "the extend waited for the grant: {took:?} for one round trip of {delay:?}"
    );
    lock.release(other).await.unwrap();
    lock.release(held).await.unwrap();
}

/// A fault plan: `fault` for every request named `what`, and a count of them.
fn faults(plan: Vec<(&'static str, RequestFault)>, fired: Arc<AtomicUsize>) -> RequestFaults {
    Arc::new(move |what: &str| {
        let fault = plan.iter().find(|(name, _)| *name == what);
        let fault = fault.map(|(_, fault)| fault.clone());
        if fault.is_some() {
            fired.fetch_add(1, Ordering::SeqCst);
        }
        fault
    })
}

/// Lets every request `gate` held go, and gives them time to land (one round trip each on
/// a loopback member; landing later could only hide a defect, never fail a sound client).
async fn release_held(gate: &Semaphore) {
    gate.add_permits(64);
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Defect (issue 58, 11): an enqueue applied with its reply lost was undone with a revoke
/// of its lease, and the retry adopted the key it found on that lease while the revoke
/// was still in flight; the revoke then landed and freed the lock its waiter had been
/// granted on the key. A clean-up must wait for the fate of what it undoes: the retry
/// now sends the same put-if-absent again and never revokes the lease its key may be on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_enqueue_is_never_undone_under_its_own_grant() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let addr = cluster.members()[0].addr().to_string();
    let (revokes, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
    let plan = faults(
        vec![("lease revoke", RequestFault::Held(gate.clone()))],
        revokes.clone(),
    );
    let lost_once = Arc::new(AtomicUsize::new(0));
    let holder = connect(&addr, "lease=per-lock").await.with_request_faults({
        let lost_once = lost_once.clone();
        Arc::new(move |what: &str| {
            if what == "enqueue txn" && lost_once.fetch_add(1, Ordering::SeqCst) == 0 {
                return Some(RequestFault::ReplyLost);
            }
            plan(what)
        })
    });
    let contender = connect(&addr, "").await;
    let mut client = plain(&cluster).await;
    let k = key("adopted-while-revoked");
    let ttl = Duration::from_secs(20);

    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
    let lease = holder.acquire(&k, &opts).await.expect("granted");
    assert!(
        lost_once.load(Ordering::SeqCst) >= 1,
        "the fault fired: the first enqueue's reply was lost"
    );
    // Whatever clean-up the acquire sent lands now, after the grant.
    release_held(&gate).await;
    let queued = queue(&mut client, &holder, &k).await;
    assert_eq!(queued.len(), 1, "the holder's key is queued: {queued:?}");
    assert!(lease.valid_until() > Instant::now() + Duration::from_secs(5));
    assert!(
        contender.try_acquire(&k, ttl).await.unwrap().is_none(),
        "the lock was freed under its holder ({} revokes sent)",
        revokes.load(Ordering::SeqCst)
    );
    holder.release(lease).await.unwrap();
}

/// Defect (issue 58, 11): a move of the key to a longer lease whose outcome was unknown
/// (no reply) was undone by revoking the new lease as soon as a read found the key still
/// on the old one; the move, still in flight, then landed before the revoke, and the
/// revoke deleted the key its holder still believed held. A lease whose move may yet
/// apply is never revoked: it runs out its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_move_lands_late_never_frees_the_lock() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let addr = cluster.members()[0].addr().to_string();
    let fired = Arc::new(AtomicUsize::new(0));
    let (moves, revokes) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let holder = connect(&addr, "lease=per-lock").await;
    let contender = connect(&addr, "").await;
    let mut client = plain(&cluster).await;
    let k = key("late-move");

    let mut lease = holder
        .try_acquire(&k, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let old_lease = queue(&mut client, &holder, &k).await[0].1;
    let faulty = holder.clone().with_request_faults(faults(
        vec![
            ("extend txn", RequestFault::Held(moves.clone())),
            ("lease revoke", RequestFault::Held(revokes.clone())),
        ],
        fired.clone(),
    ));
    let error = faulty
        .extend(&mut lease, Duration::from_secs(30))
        .await
        .expect_err("the move's reply never came");
    assert!(error.is_retryable(), "{error}");
    assert!(fired.load(Ordering::SeqCst) >= 1, "the fault fired");
    // The move lands after the call gave up on it, then whatever clean-up it sent.
    release_held(&moves).await;
    let queued = queue(&mut client, &holder, &k).await;
    assert!(
        queued.len() == 1 && queued[0].1 != old_lease,
        "the late move re-attached the key to its new lease: {queued:?}"
    );
    release_held(&revokes).await;
    assert!(lease.valid_until() > Instant::now() + Duration::from_secs(5));
    assert!(
        contender
            .try_acquire(&k, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "the lock was freed while its holder believed it held ({} faults fired)",
        fired.load(Ordering::SeqCst)
    );
}

/// Defect (found in review): on a session lease every move to one TTL goes to the same
/// lease, so a retried `extend` whose move was refused because an earlier call's move had
/// landed meanwhile (after the retry read the key) deleted the key from that lease —
/// under its holder. The refused move now reads the key back and takes the earlier move
/// as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_extend_takes_a_late_move_as_its_own_on_a_session_lease() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let addr = cluster.members()[0].addr().to_string();
    let fired = Arc::new(AtomicUsize::new(0));
    let moves = Arc::new(Semaphore::new(0));
    let holder = connect(&addr, "lease=session").await;
    let contender = connect(&addr, "").await;
    let mut client = plain(&cluster).await;
    let k = key("retried-move");

    let mut lease = holder
        .try_acquire(&k, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let old_lease = queue(&mut client, &holder, &k).await[0].1;
    let once = Arc::new(AtomicUsize::new(0));
    // The first call's move is held; the retry's, once the retry has read the key still
    // on its old lease, lets it go and follows it 300 ms later.
    let faulty = holder.clone().with_request_faults({
        let (once, moves, fired) = (once.clone(), moves.clone(), fired.clone());
        Arc::new(move |what: &str| match what {
            "extend txn" if once.fetch_add(1, Ordering::SeqCst) == 0 => {
                fired.fetch_add(1, Ordering::SeqCst);
                Some(RequestFault::Held(moves.clone()))
            }
            "extend txn" => {
                moves.add_permits(1);
                Some(RequestFault::Slow(Duration::from_millis(300)))
            }
            _ => None,
        })
    });
    let ttl = Duration::from_secs(30);
    let error = faulty.extend(&mut lease, ttl).await.expect_err("no reply");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(
        queue(&mut client, &holder, &k).await[0].1,
        old_lease,
        "the first move is still held"
    );
    faulty
        .extend(&mut lease, ttl)
        .await
        .expect("the retry takes the earlier move as its own");
    let queued = queue(&mut client, &holder, &k).await;
    assert!(
        fired.load(Ordering::SeqCst) == 1 && once.load(Ordering::SeqCst) == 2,
        "the fault fired: two moves were sent"
    );
    assert!(
        queued.len() == 1 && queued[0].1 != old_lease,
        "the key lives on the lease it was moved to: {queued:?}"
    );
    let queued = queue(&mut client, &holder, &k).await;
    assert_eq!(queued.len(), 1, "the key is still there: {queued:?}");
    assert!(
        contender
            .try_acquire(&k, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "the lock was freed under its holder"
    );
    holder.release(lease).await.unwrap();
}
