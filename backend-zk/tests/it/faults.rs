//! ZooKeeper under real faults, on a 3-node ensemble and (where cheap) a standalone
//! server, all with `tickTime` = 200 ms so sessions may last 0.4–4 s: beyond the fault
//! suite every backend runs (`tests/suite.rs`, `faults::`), the session's own behaviour (local
//! expiry notice, lost create replies, orphans, the queue). Each test asserts its expected
//! outcome and that its fault really fired.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, DistributedLock, FencingToken, LockError, LockExt, LockKey, ReleaseOutcome,
};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_conformance::servers::pid_alive;
use tenure_conformance::{retrying, FencedRegister, History};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};
use tenure_zk::{NodeNames, QueuedNode, ZkLock};

const TICK_MS: u32 = 200;
/// The longest session the servers grant (20 × tickTime): enough to ride out an election.
const SESSION: Duration = Duration::from_millis(4000);
/// Bound on one request of the clients under test.
const OP: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_secs(10);
/// How long a waiter may wait for its turn.
const WAIT: Duration = Duration::from_secs(60);
/// Replies held back by [`hold_replies`]: longer than anything in these tests, so they
/// are lost unless [`drop_held_replies`] discards them first.
const HELD: Duration = Duration::from_secs(600);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

async fn start(nodes: usize) -> ZkEnsemble {
    ZkEnsemble::start(ZkOptions::default().nodes(nodes).tick_time_ms(TICK_MS))
        .await
        .unwrap()
}

/// A client with its own session on `hosts` (`h:p,h:p…`).
async fn connect(hosts: &str, session: Duration, op: Duration) -> ZkLock {
    ZkLock::connect(&format!(
        "zk://{hosts}/faults?session_timeout_ms={}&op_timeout_ms={}&tick_ms={TICK_MS}",
        session.as_millis(),
        op.as_millis()
    ))
    .await
    .unwrap()
}

/// `lock` (a clone of it: same session) recorded as `client` in `history`.
fn recorded(history: &History, client: usize, lock: &ZkLock) -> Arc<dyn DistributedLock> {
    history.recorded(client, Arc::new(lock.clone()))
}

/// Checks `history` and asserts it is safe: one holder at a time, tokens increasing,
/// nobody believing past what the server promised.
fn assert_safe(history: &History) {
    let report = history.check();
    assert!(report.is_safe(), "{report}");
}

/// A client through `proxy` (request bound `op`, recorded as client 1) and one connected
/// directly (recorded as client 0): each as (raw client, for probes; recorded client).
/// The direct client is not under test: its requests get half a session, so a loaded
/// machine does not fail the test's setup.
async fn proxied_and_direct(
    zk: &ZkEnsemble,
    proxy: &FaultProxy,
    op: Duration,
    history: &History,
) -> Clients {
    let proxied = connect(&proxy.addr().to_string(), SESSION, op).await;
    let direct = connect(&zk.connect_string(), SESSION, SESSION / 2).await;
    let recorded_proxied = recorded(history, 1, &proxied);
    let recorded_direct = recorded(history, 0, &direct);
    ((proxied, recorded_proxied), (direct, recorded_direct))
}

type Clients = (
    (ZkLock, Arc<dyn DistributedLock>),
    (ZkLock, Arc<dyn DistributedLock>),
);

/// Polls `probe` every 10 ms until it yields a value; panics after `limit`.
async fn poll<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(started.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `key`'s queue (holder first) as `observer` sees it, retried through elections.
async fn queue(observer: &ZkLock, key: &LockKey) -> Vec<QueuedNode> {
    retrying(SESSION, || observer.queue(key)).await.0.unwrap()
}

/// Waits until `observer` sees `key`'s queue empty. Another session's deletes reach
/// `observer`'s server a little later (ZooKeeper reads are not linearizable across
/// sessions), in milliseconds, or a loaded machine's stall, well within half a session:
/// a node left behind for the session's lifetime still fails.
async fn nothing_queued(observer: &ZkLock, key: &LockKey, what: &str) {
    poll(what, SESSION / 2, || async {
        queue(observer, key).await.is_empty().then_some(())
    })
    .await;
}

/// The name of the node a lease was granted on.
fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

/// One served waiter: (index, token, acquired at, release started at).
type Served = (usize, FencingToken, Instant, Instant);

/// Starts waiter `index` on its own client, recorded in `history` as client
/// `index + 1`, and returns once its node is queued (so each waiter is queued before the
/// next one starts). The task holds the lock for `hold` once granted, logs itself, and
/// releases.
async fn spawn_waiter(
    (hosts, observer, history): (&str, &ZkLock, &History),
    key: &LockKey,
    index: usize,
    hold: Duration,
    log: Arc<Mutex<Vec<Served>>>,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let lock = recorded(history, index + 1, &connect(hosts, SESSION, OP).await);
    let ahead = queue(observer, key).await.len();
    let task = {
        let key = key.clone();
        tokio::spawn(async move {
            let lease = lock
                .acquire(&key, &AcquireOptions::new(TTL).wait(WAIT))
                .await?;
            let acquired = Instant::now();
            tokio::time::sleep(hold).await;
            let releasing = Instant::now();
            log.lock().unwrap_or_else(PoisonError::into_inner).push((
                index,
                lease.token(),
                acquired,
                releasing,
            ));
            assert_eq!(lock.release(lease).await?, ReleaseOutcome::Released);
            Ok(())
        })
    };
    let what = format!("waiter {index} to queue behind {ahead}");
    poll(&what, Duration::from_secs(10), || async {
        (queue(observer, key).await.len() > ahead).then_some(())
    })
    .await;
    task
}

/// Awaits the waiters; checks they were served in index order with tokens increasing
/// from `after`; returns the hand-off latencies (release started → next acquired), the
/// first measured from `released_at`.
async fn served_in_fifo_order(
    waiters: Vec<tokio::task::JoinHandle<Result<(), LockError>>>,
    log: &Mutex<Vec<Served>>,
    after: FencingToken,
    released_at: Instant,
) -> Vec<Duration> {
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let order: Vec<usize> = log.iter().map(|entry| entry.0).collect();
    assert_eq!(
        order,
        (0..log.len()).collect::<Vec<_>>(),
        "served in FIFO order"
    );
    let mut last = after;
    for &(i, token, _, _) in &log {
        assert!(token > last, "waiter {i}: token {token} after {last}");
        last = token;
    }
    let mut released = released_at;
    log.iter()
        .map(|&(_, _, acquired, releasing)| {
            let latency = acquired.saturating_duration_since(released);
            released = releasing;
            latency
        })
        .collect()
}

fn summary(latencies: &mut [Duration]) -> String {
    latencies.sort();
    let n = latencies.len();
    format!(
        "n={n} p50={:?} max={:?}",
        latencies[n / 2],
        latencies[n - 1]
    )
}

/// Holds back every reply to `proxy`'s client while its requests still reach the server.
fn hold_replies(proxy: &FaultProxy) {
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: HELD,
    });
}

/// Resets the client's connection, discarding the replies held back, then lets it
/// reconnect (to the same session).
async fn drop_held_replies(proxy: &FaultProxy) {
    let before = proxy.stats().resets;
    proxy.set_mode(ProxyMode::Reset);
    poll(
        "the proxy to reset the connection",
        Duration::from_secs(5),
        || async { (proxy.stats().resets > before).then_some(()) },
    )
    .await;
    proxy.set_mode(ProxyMode::Pass);
}

/// Runs `call` (an acquire of `key` through `proxy`) with replies held back, while
/// `holder` holds `key` (so the lock directory exists and `call` has to queue); returns
/// once its node is queued on the server — the create went through, its reply did not
/// come back.
async fn create_with_reply_held<T: Send + 'static>(
    proxy: &FaultProxy,
    holder: &ZkLock,
    key: &LockKey,
    call: impl Future<Output = T> + Send + 'static,
) -> (QueuedNode, tokio::task::JoinHandle<T>) {
    assert_eq!(queue(holder, key).await.len(), 1, "held by `holder` alone");
    hold_replies(proxy);
    let delivered = proxy.stats().bytes_down;
    let call = tokio::spawn(call);
    let node = poll(
        "the lock node to be created",
        Duration::from_secs(5),
        || async { queue(holder, key).await.into_iter().nth(1) },
    )
    .await;
    assert_eq!(
        proxy.stats().bytes_down,
        delivered,
        "the fault fired: no reply reached the client"
    );
    (node, call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_keeps_the_lock_and_the_queue() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(3).await;
    let hosts = zk.connect_string();
    let history = History::new();
    let zk_holder = connect(&hosts, SESSION, OP).await;
    let holder = recorded(&history, 0, &zk_holder);
    let observer = connect(&hosts, SESSION, OP).await;
    let k = key("leader-killed");
    let mut held = holder.try_acquire(&k, TTL).await.unwrap().expect("free");
    let session = zk_holder.session_id();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let hold = Duration::from_millis(20);
        let waiter = spawn_waiter((&hosts, &observer, &history), &k, i, hold, log.clone());
        waiters.push(waiter.await);
    }

    let leader = zk.leader_index().await.unwrap();
    let pid = zk.nodes()[leader].pid().unwrap();
    zk.nodes()[leader].kill().await.unwrap();
    assert!(
        !pid_alive(pid),
        "the fault fired: the leader's process exited"
    );
    let new_leader = zk.leader_index().await.unwrap();
    assert_ne!(new_leader, leader, "a new leader was elected");
    eprintln!(
        "leader zk{} killed; zk{} elected",
        leader + 1,
        new_leader + 1
    );

    // Every client was cut off (followers drop their clients while they elect); the
    // holder's session and lock survive the election.
    let (extended, failures) = retrying(SESSION, || {
        let (holder, mut lease) = (&holder, held.clone());
        async move { holder.extend(&mut lease, TTL).await.map(|()| lease) }
    })
    .await;
    held = extended.expect("the holder's lock survives the election");
    eprintln!("extend after the election needed {failures} retries");
    assert_eq!(zk_holder.session_id(), session, "the same session");
    let (info, _) = retrying(SESSION, || observer.inspect(&k)).await;
    let info = info.unwrap().expect("still held");
    assert_eq!(info.owner, held.owner(), "still held by its owner");
    assert_eq!(info.token, Some(held.token()));
    assert_eq!(
        queue(&observer, &k).await.len(),
        4,
        "the waiters are still queued"
    );

    // Grants after the election: in order, with larger tokens.
    let released_at = Instant::now();
    let (released, _) = retrying(SESSION, || holder.release(held.clone())).await;
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    let mut latencies = served_in_fifo_order(waiters, &log, held.token(), released_at).await;
    eprintln!(
        "after leader failover: hand-off latency {}",
        summary(&mut latencies)
    );
    assert_eq!(history.holds().len(), 4, "the holder and three waiters");
    assert_safe(&history);
}

/// The holder reaches ZooKeeper through its own proxy, which then black-holes its link
/// past the session timeout. The server expires the session and hands the lock to the
/// queued waiter; the holder, hearing nothing, must find out on its own (CURATOR-460).
async fn expired_holder_is_told_locally_and_fenced_off(nodes: usize) {
    let zk = start(nodes).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let session = Duration::from_millis(2000);
    let zk_holder = connect(&proxy.addr().to_string(), session, OP).await;
    let negotiated = zk_holder.session_timeout().unwrap();
    assert_eq!(
        negotiated, session,
        "the server granted the session asked for"
    );
    let zk_waiter = connect(&zk.connect_string(), SESSION, OP).await;
    let k = key("expiry");
    let register = FencedRegister::new();
    let history = History::new();
    let (holder, waiter) = (
        recorded(&history, 0, &zk_holder),
        recorded(&history, 1, &zk_waiter),
    );

    let guard = holder.lock(&k, &AcquireOptions::new(TTL)).await.unwrap();
    let loss = history.lost_on(0, guard.lost_signal());
    let stale = guard.lease().await.unwrap();
    let seen_by_stale = register.read(stale.token()).unwrap();
    let waiting = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            let lease = waiter
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await;
            (lease, Instant::now())
        })
    };
    poll("the waiter to queue", Duration::from_secs(5), || async {
        (queue(&zk_waiter, &k).await.len() == 2).then_some(())
    })
    .await;

    let cut = Instant::now();
    proxy.set_mode(ProxyMode::Blackhole);
    tokio::time::timeout(negotiated * 2, guard.lost())
        .await
        .expect("the stale holder's guard reports the loss");
    let lost_at = Instant::now();
    let (fresh, granted_at) = waiting.await.unwrap();
    let fresh = fresh.expect("the expired holder's lock is taken over");
    let last = guard.lease().await.unwrap();
    eprintln!(
        "{nodes} node(s), session {negotiated:?}: loss reported {:?} after the cut, \
         lock taken over {:?} after the cut ({})",
        lost_at - cut,
        granted_at - cut,
        guard.lost_signal().reason().unwrap_or_default()
    );
    assert!(
        proxy.stats().bytes_blackholed > 0,
        "the fault fired: the holder's requests were dropped"
    );
    // The belief is judged, not the moment this task woke to hear of its end: on a
    // loaded machine the wake-up can come late, while the lease ended on time.
    let believed_until = last.valid_until();
    assert!(
        believed_until <= cut + negotiated,
        "the lease was believed {:?} past the cut, longer than the session timeout",
        believed_until - cut
    );
    assert!(
        granted_at >= believed_until,
        "taken over before the stale holder's own deadline"
    );
    assert!(fresh.token() > stale.token(), "tokens increase");
    loss.await.unwrap();

    // The stale holder writes as if nothing had happened: fencing rejects it.
    assert!(register
        .stale_write_after_takeover(fresh.token(), stale.token(), seen_by_stale)
        .unwrap());
    assert_eq!(register.value(), 1, "only the fresh holder's update landed");
    assert_eq!(register.rejected(), 1);

    proxy.set_mode(ProxyMode::Pass);
    let outcome = guard.release().await;
    assert!(
        matches!(outcome, Ok(ReleaseOutcome::NotHeld) | Err(_)),
        "the stale release must not free the new lock: {outcome:?}"
    );
    let info = waiter.inspect(&k).await.unwrap().expect("still held");
    assert_eq!(info.owner, fresh.owner(), "the new owner keeps the lock");
    assert_eq!(
        waiter.release(fresh).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Judged after the stale holder's release: had it freed the new lock, the checker
    // would see the overlap.
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_is_told_locally_and_fenced_off_ensemble() {
    let _serial = crate::SERIAL.lock().await;
    expired_holder_is_told_locally_and_fenced_off(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_is_told_locally_and_fenced_off_standalone() {
    let _serial = crate::SERIAL.lock().await;
    expired_holder_is_told_locally_and_fenced_off(1).await;
}

/// An acquire whose create reaches the server but whose reply is lost: the call's retry
/// finds the node by the owner id in its name, keeps its place in the queue and is
/// granted on it — no second node, no orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_is_recognised_by_the_retry() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(3).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let history = History::new();
    let ((zk_client, client), (holder, recorded_holder)) =
        proxied_and_direct(&zk, &proxy, OP, &history).await;
    let session = zk_client.session_id();
    let k = key("lost-reply-retry");
    let held = recorded_holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free");

    let acquire = {
        let (client, k) = (client.clone(), k.clone());
        async move {
            client
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await
        }
    };
    let (node, acquiring) = create_with_reply_held(&proxy, &holder, &k, acquire).await;
    drop_held_replies(&proxy).await;
    let released_at = Instant::now();
    assert_eq!(
        recorded_holder.release(held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = acquiring
        .await
        .unwrap()
        .expect("granted once the link is back");
    eprintln!(
        "lost create reply: granted on the first node {:?} after the release",
        released_at.elapsed()
    );

    assert_eq!(
        node_name(&lease.handle().path),
        node.name,
        "the retry recognised its node"
    );
    assert_eq!(node.owner, lease.owner());
    assert_eq!(zk_client.session_id(), session, "the same session");
    assert_eq!(queue(&holder, &k).await, [node], "no second node");
    assert_eq!(
        client.release(lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    nothing_queued(&holder, &k, "nothing left behind").await;
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

/// A `try_acquire` whose create reaches the server but whose reply is lost runs out of
/// time and fails, leaving a node that no caller knows about; once the holder releases,
/// that orphan holds the lock for nobody. The failed call sweeps it away as soon as its
/// client reaches a server again — well before the session timeout. (Had the link stayed
/// down, only the session's expiry, at most one session timeout after the cut, would
/// have freed the lock: that is the bound the design guarantees without the link.)
async fn failed_acquire_leaves_no_orphan(nodes: usize) {
    let zk = start(nodes).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let history = History::new();
    let ((zk_client, client), (zk_other, other)) =
        proxied_and_direct(&zk, &proxy, OP, &history).await;
    let session = zk_client.session_id();
    let k = key("lost-reply-orphan");
    let held = other.try_acquire(&k, TTL).await.unwrap().expect("free");

    let attempt = {
        let (client, k) = (client.clone(), k.clone());
        async move { client.try_acquire(&k, TTL).await }
    };
    let (orphan, attempt) = create_with_reply_held(&proxy, &zk_other, &k, attempt).await;
    let result = attempt.await.unwrap();
    let failed_at = Instant::now();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "expected Unavailable, got {result:?}"
    );
    assert_eq!(other.release(held).await.unwrap(), ReleaseOutcome::Released);
    let info = other
        .inspect(&k)
        .await
        .unwrap()
        .expect("the orphan holds it");
    assert_eq!(info.owner, orphan.owner, "held by the failed call's node");
    assert!(other.try_acquire(&k, TTL).await.unwrap().is_none());

    drop_held_replies(&proxy).await;
    let lease = other
        .acquire(&k, &AcquireOptions::new(TTL).wait(SESSION))
        .await
        .expect("the orphan goes away");
    let freed = failed_at.elapsed();
    eprintln!("{nodes} node(s): orphan of a failed acquire gone {freed:?} after the failure");
    // The session id below proves the sweep freed it; this bound only has to tell the
    // sweep from an expiry, with room for a loaded machine's reconnect.
    assert!(
        freed < SESSION * 3 / 4,
        "freed after {freed:?}: not well below the session timeout {SESSION:?}"
    );
    assert_eq!(
        zk_client.session_id(),
        session,
        "freed by the sweep, not by the session's expiry"
    );
    assert!(lease.token() > info.token.unwrap(), "tokens increase");
    let left = queue(&zk_other, &k).await;
    assert_eq!(left.len(), 1, "only the new holder's node: {left:?}");
    assert_eq!(left[0].owner, lease.owner());
    other.release(lease).await.unwrap();
    // The failed call was granted nothing: only `other` ever held the lock.
    assert_eq!(history.holds().len(), 2, "the first and the new grant");
    assert_safe(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_acquire_leaves_no_orphan_ensemble() {
    let _serial = crate::SERIAL.lock().await;
    failed_acquire_leaves_no_orphan(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_acquire_leaves_no_orphan_standalone() {
    let _serial = crate::SERIAL.lock().await;
    failed_acquire_leaves_no_orphan(1).await;
}

/// Three members whose links can be cut, with syncLimit = 20 ticks (4 s: a cut-off
/// follower serves reads well past a session): the ensemble, its leader's index, a
/// follower's index, and the other two members' connect strings.
async fn partitionable_ensemble() -> (ZkEnsemble, usize, usize, Vec<String>) {
    let options = ZkOptions::default()
        .nodes(3)
        .tick_time_ms(TICK_MS)
        .sync_limit_ticks(20)
        .peer_proxies(true);
    let zk = ZkEnsemble::start(options).await.unwrap();
    let leader = zk.leader_index().await.unwrap();
    let follower = (leader + 1) % 3;
    let majority = (0..3)
        .filter(|&i| i != follower)
        .map(|i| zk.nodes()[i].connect_string())
        .collect();
    (zk, leader, follower, majority)
}

/// The holder talks to one follower only; that follower is then cut off from the other
/// two members (quorum and election links black-holed) while its client port still
/// answers. The leader, on the majority side, hears nothing more of the holder's session,
/// expires it and grants the lock to the contender queued on the majority side. The
/// follower keeps serving (stale) reads for `syncLimit` ticks — longer than the session
/// here — so a holder that proves its lock by reading from it would go on extending:
/// the holder must report the loss, on its own clock, before the contender is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_partitioned_from_leader_holder_reports_loss_before_takeover() {
    let _serial = crate::SERIAL.lock().await;
    let (zk, leader, follower, majority) = partitionable_ensemble().await;
    let session = Duration::from_millis(2000);
    let history = History::new();
    let holder = recorded(
        &history,
        0,
        &connect(&zk.nodes()[follower].connect_string(), session, OP).await,
    );
    let zk_contender = connect(&majority.join(","), SESSION, OP).await;
    let contender = recorded(&history, 1, &zk_contender);
    let k = key("follower-partitioned");

    let guard = holder.lock(&k, &AcquireOptions::new(TTL)).await.unwrap();
    let stale = guard.lease().await.unwrap();
    let signal = guard.lost_signal();
    let loss = history.lost_on(0, signal.clone());
    let waiting = {
        let (contender, k, signal) = (contender.clone(), k.clone(), signal.clone());
        tokio::spawn(async move {
            let lease = contender
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await;
            // Read the holder's signal the moment the grant is known.
            (lease, Instant::now(), signal.is_lost())
        })
    };
    poll("the contender to queue", Duration::from_secs(5), || async {
        (queue(&zk_contender, &k).await.len() == 2).then_some(())
    })
    .await;

    let cut = Instant::now();
    zk.isolate(follower).unwrap();
    let (fresh, granted_at, lost_at_grant) = waiting.await.unwrap();
    let fresh = fresh.expect("the majority side takes the lock over");
    eprintln!(
        "follower zk{} cut off: contender granted {:?} after the cut; holder lost then: \
         {lost_at_grant} ({:?}); holder's deadline {:?} after the cut",
        follower + 1,
        granted_at - cut,
        signal.reason(),
        signal.deadline().saturating_duration_since(cut),
    );
    let blackholed = zk.peer_link_stats(follower).unwrap().bytes_blackholed;
    assert!(
        blackholed > 0,
        "the fault fired: member traffic of the follower was dropped"
    );
    assert!(
        lost_at_grant,
        "the contender was granted while the holder still believed it held the lock \
         (its deadline was {:?} after the grant)",
        signal.deadline().saturating_duration_since(granted_at)
    );
    assert!(fresh.token() > stale.token(), "tokens increase");
    loss.await.unwrap();
    assert_safe(&history);
    // The partition really cut the follower off its leader: it stops following.
    poll(
        "the cut-off follower to lose its leader",
        Duration::from_secs(30),
        || async {
            let mode = zk.nodes()[follower].mode().await.ok().flatten();
            (mode.as_deref() != Some("follower")).then_some(())
        },
    )
    .await;
    assert_eq!(
        zk.nodes()[leader].mode().await.unwrap().as_deref(),
        Some("leader"),
        "the majority side kept its leader"
    );
    zk.heal();
    assert_eq!(
        contender.release(fresh).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// `inspect` through a follower that is cut off from its leader but still serves reads
/// (for `syncLimit` ticks): a lock granted on the majority side after the cut must not
/// read as free. Plain reads there are stale; `inspect` syncs with the leader first, which
/// cannot complete, so it fails instead of answering wrong. (On main before c8aa6ee it
/// answered `Ok(None)`: the quick matrix once caught that as "non-owner disturbed the
/// lock".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_through_a_cut_off_follower_never_reads_a_held_lock_as_free() {
    let _serial = crate::SERIAL.lock().await;
    let (zk, _, follower, majority) = partitionable_ensemble().await;
    let inspector = connect(&zk.nodes()[follower].connect_string(), SESSION, OP).await;
    let holder = connect(&majority.join(","), SESSION, OP).await;
    let k = key("inspect-cut-off-follower");
    assert_eq!(inspector.inspect(&k).await.unwrap(), None, "free at first");

    zk.isolate(follower).unwrap();
    let lease = holder.try_acquire(&k, TTL).await.unwrap().expect("free");
    let seen = inspector.inspect(&k).await;
    assert!(
        zk.peer_link_stats(follower).unwrap().bytes_blackholed > 0,
        "the fault fired: member traffic of the follower was dropped"
    );
    assert_eq!(
        zk.nodes()[follower].mode().await.unwrap().as_deref(),
        Some("follower"),
        "the cut-off member still serves as a follower (the read could be stale)"
    );
    match seen {
        Ok(Some(info)) => assert_eq!(info.owner, lease.owner(), "{info:?}"),
        Ok(None) => panic!("a held lock read as free through a stale follower"),
        Err(e) => assert!(e.is_retryable(), "{e}"),
    }
    zk.heal();
    holder.release(lease).await.unwrap();
}

/// Someone keeps deleting the waiter's lock node right after its creation (a janitor on
/// the directory; an unparsable sequence looks the same to the queue: our node is not
/// in it). Every pass re-queues; the call must still give up at its wait deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_returns_at_its_deadline_when_its_node_keeps_vanishing() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(1).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let client = connect(&proxy.addr().to_string(), SESSION, OP).await;
    let k = key("vanishing-node");
    let dir = client.lock_dir(&k);
    // The key's directory exists (a container: it stays while it was used recently).
    let lease = client.try_acquire(&k, TTL).await.unwrap().expect("free");
    client.release(lease).await.unwrap();

    // The janitor deletes every lock node created under `dir`.
    let janitor = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let mut created = janitor
        .watch(&dir, zookeeper_client::AddWatchMode::PersistentRecursive)
        .await
        .unwrap();
    let deleted = Arc::new(Mutex::new(0usize));
    let janitor_task = {
        let deleted = deleted.clone();
        tokio::spawn(async move {
            loop {
                let event = created.changed().await;
                if event.event_type == zookeeper_client::EventType::Session {
                    continue;
                }
                if event.event_type == zookeeper_client::EventType::NodeCreated
                    && node_name(&event.path).contains("lock-")
                    && janitor.delete(&event.path, None).await.is_ok()
                {
                    *deleted.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                }
            }
        })
    };
    // Requests reach the server 150 ms late: the janitor always deletes the new node
    // before the waiter lists the queue.
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::from_millis(150),
        down: Duration::ZERO,
    });

    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        wait + Duration::from_secs(10),
        client.acquire(&k, &AcquireOptions::new(TTL).wait(wait)),
    )
    .await;
    let returned = started.elapsed();
    janitor_task.abort();
    let deleted = *deleted.lock().unwrap_or_else(PoisonError::into_inner);
    eprintln!("node deleted {deleted} times; acquire returned after {returned:?}: {outcome:?}");
    assert!(
        deleted >= 2,
        "the fault fired: the node was deleted again and again"
    );
    let outcome = outcome.unwrap_or_else(|_| {
        panic!("acquire with a {wait:?} wait had not returned after {returned:?}")
    });
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "expected Timeout, got {outcome:?}"
    );
    assert!(
        returned < wait + OP * 4,
        "returned {returned:?} after a {wait:?} wait"
    );
}

/// An acquire's create reply is lost; before its retry looks for its node, that node is
/// replaced by one with the same name prefix (the owner id of this call) but created in
/// another session — as the call's own node from an earlier, abandoned session would be.
/// Such a node dies with the other session: the retry must not adopt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_retry_does_not_adopt_a_node_of_another_session() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(1).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let history = History::new();
    let ((zk_client, client), (holder, recorded_holder)) =
        proxied_and_direct(&zk, &proxy, OP, &history).await;
    let session = zk_client.session_id().unwrap();
    let k = key("foreign-session-node");
    let dir = holder.lock_dir(&k);
    let held = recorded_holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free");

    let acquire = {
        let (client, k) = (client.clone(), k.clone());
        async move {
            client
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await
        }
    };
    let (own, acquiring) = create_with_reply_held(&proxy, &holder, &k, acquire).await;
    let other = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    other
        .delete(&format!("{dir}/{}", own.name), None)
        .await
        .unwrap();
    let options = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let (stat, sequence) = other
        .create(
            &format!("{dir}/{}", NodeNames::default().prefix(own.owner)),
            &[],
            &options,
        )
        .await
        .unwrap();
    let foreign = format!("{}{sequence}", NodeNames::default().prefix(own.owner));
    assert_ne!(stat.ephemeral_owner, session, "another session's node");
    drop_held_replies(&proxy).await;
    assert_eq!(
        recorded_holder.release(held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = acquiring.await.unwrap().expect("granted");
    let granted = node_name(&lease.handle().path).to_string();
    let owner_session = other
        .check_stat(&lease.handle().path)
        .await
        .unwrap()
        .map(|s| s.ephemeral_owner);
    eprintln!("granted on {granted} (foreign node {foreign}), owned by session {owner_session:x?}");
    assert_ne!(granted, foreign, "granted on a node of another session");
    assert_eq!(
        owner_session,
        Some(session),
        "the granted node lives in the grantee's session"
    );
    client.release(lease).await.unwrap();
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

/// A failed `try_acquire` leaves an orphan node (its create reply was lost) and its sweep
/// cannot reach the server for longer than its quick passes last — but less than the
/// session timeout, so the session and the orphan live on. The sweep must keep trying:
/// once the link is back the orphan goes, long before the session would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_sweep_keeps_trying_until_the_server_answers() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(1).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    // Short requests: the sweep's first passes (bounded by the request timeout) are over long
    // before the session could expire.
    let op = Duration::from_millis(100);
    let history = History::new();
    let ((zk_client, client), (zk_other, other)) =
        proxied_and_direct(&zk, &proxy, op, &history).await;
    let session = zk_client.session_id();
    let k = key("sweep-retries");
    let held = other.try_acquire(&k, TTL).await.unwrap().expect("free");

    let attempt = {
        let (client, k) = (client.clone(), k.clone());
        async move { client.try_acquire(&k, TTL).await }
    };
    let (orphan, attempt) = create_with_reply_held(&proxy, &zk_other, &k, attempt).await;
    let result = attempt.await.unwrap();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "expected Unavailable, got {result:?}"
    );
    // Replies stay held for 25 op timeouts: the sweep's requests reach the proxy and get
    // no answer.
    let up = proxy.stats().bytes_up;
    let down = proxy.stats().bytes_down;
    tokio::time::sleep(op * 25).await;
    assert!(proxy.stats().bytes_up > up, "the sweep kept sending");
    assert_eq!(
        proxy.stats().bytes_down,
        down,
        "the fault fired: no reply reached the client"
    );
    assert_eq!(
        queue(&zk_other, &k).await.get(1).map(|n| n.name.clone()),
        Some(orphan.name.clone()),
        "the orphan is still queued"
    );
    let back = Instant::now();
    drop_held_replies(&proxy).await;
    assert_eq!(other.release(held).await.unwrap(), ReleaseOutcome::Released);
    let lease = other
        .acquire(&k, &AcquireOptions::new(TTL).wait(SESSION * 2))
        .await
        .expect("the orphan goes once the link is back");
    eprintln!("orphan gone {:?} after the link came back", back.elapsed());
    assert_eq!(
        zk_client.session_id(),
        session,
        "freed by the sweep, not by the session's end"
    );
    other.release(lease).await.unwrap();
    assert_eq!(history.holds().len(), 2, "the first and the new grant");
    assert_safe(&history);
}

/// A waiter queued for longer than its session timeout is granted a lease with most of
/// a session left: the proof that the leader still knows the session is recent even
/// though the waiter itself sent nothing while it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_granted_after_a_long_wait_keeps_most_of_a_session() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(3).await;
    let hosts = zk.connect_string();
    let session = Duration::from_millis(2000);
    let zk_holder = connect(&hosts, SESSION, OP).await;
    let history = History::new();
    let holder = recorded(&history, 0, &zk_holder);
    let waiter = recorded(&history, 1, &connect(&hosts, session, OP).await);
    let k = key("long-wait");
    let held = holder.try_acquire(&k, TTL).await.unwrap().expect("free");
    let waiting = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await
        })
    };
    poll("the waiter to queue", Duration::from_secs(5), || async {
        (queue(&zk_holder, &k).await.len() == 2).then_some(())
    })
    .await;
    let queued = Instant::now();
    poll("the wait to outlast the session", session * 4, || async {
        (queued.elapsed() > session + session / 4).then_some(())
    })
    .await;
    holder.release(held).await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    let left = lease.remaining(Instant::now());
    eprintln!(
        "granted after {:?} in the queue with {left:?} left",
        queued.elapsed()
    );
    assert!(
        left >= session / 4,
        "granted with only {left:?} of a {session:?} session left"
    );
    waiter.release(lease).await.unwrap();
    assert_eq!(history.holds().len(), 2, "one grant each");
    assert_safe(&history);
}

/// A waiter whose request fails once while it waits (its connection is reset, its session
/// lives on) retries in the same session: it must keep its node — its place in the queue
/// — not queue a second node behind the waiters that came after it.
///
/// Queue: holder H, a stray node X, waiter A (through two chained proxies: `tap` counts
/// what A sends, `cut` holds it back and then resets the link), waiter B. Deleting X wakes
/// A, whose `sync` (and listing) is held by `cut` and lost when `cut` resets the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_keeps_its_place_after_a_failed_request() {
    let _serial = crate::SERIAL.lock().await;
    let zk = start(1).await;
    let cut = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let tap = FaultProxy::start(cut.addr()).await.unwrap();
    let history = History::new();
    // Requests bounded by half a session: A's request fails because of the reset, not
    // because it ran out of time (its retry would then be held back too).
    let ((zk_a, a), (zk_holder, holder)) =
        proxied_and_direct(&zk, &tap, SESSION / 2, &history).await;
    let b = recorded(
        &history,
        2,
        &connect(&zk.connect_string(), SESSION, OP).await,
    );
    let session = zk_a.session_id();
    let k = key("keep-place");
    let dir = zk_holder.lock_dir(&k);
    let held = holder.try_acquire(&k, TTL).await.unwrap().expect("free");

    let other = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let options = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let (_, sequence) = other
        .create(
            &format!("{dir}/lock-{}-", tenure_api::OwnerId::random()),
            &[],
            &options,
        )
        .await
        .unwrap();
    let stray = format!("{dir}/{}", queue(&zk_holder, &k).await[1].name);
    assert!(stray.ends_with(&sequence.to_string()), "X queued second");

    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |index: usize, lock: Arc<dyn DistributedLock>| {
        let (k, order) = (k.clone(), order.clone());
        tokio::spawn(async move {
            let lease = lock
                .acquire(&k, &AcquireOptions::new(TTL).wait(WAIT))
                .await?;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((index, lease.clone()));
            Ok::<_, LockError>((lock, lease))
        })
    };
    let waiting_a = spawn(0, a.clone());
    let queued_a = poll("A to queue", Duration::from_secs(10), || async {
        queue(&zk_holder, &k).await.get(2).cloned()
    })
    .await;
    let waiting_b = spawn(1, b.clone());
    let queued_b = poll("B to queue", Duration::from_secs(10), || async {
        queue(&zk_holder, &k).await.get(3).cloned()
    })
    .await;
    let a_path = format!("{dir}/{}", queued_a.name);
    let czxid_a = other
        .check_stat(&a_path)
        .await
        .unwrap()
        .expect("A's node")
        .czxid;

    // Hold back what A sends; wake A by deleting its predecessor X; wait until A has sent
    // its `sync` (more than pings), then reset A's link.
    cut.set_mode(ProxyMode::Delay {
        up: HELD,
        down: Duration::ZERO,
    });
    let sent_before = tap.stats().bytes_up;
    let reached_before = cut.stats().bytes_up;
    let resets_before = cut.stats().resets;
    other.delete(&stray, None).await.unwrap();
    let sync_len = (16 + dir.len()) as u64;
    poll("A to send its sync", Duration::from_secs(10), || async {
        (tap.stats().bytes_up >= sent_before + sync_len).then_some(())
    })
    .await;
    cut.set_mode(ProxyMode::Reset);
    poll("the link to be reset", Duration::from_secs(5), || async {
        (cut.stats().resets > resets_before).then_some(())
    })
    .await;
    assert_eq!(
        cut.stats().bytes_up,
        reached_before,
        "the fault fired: nothing A sent after X's deletion reached the server"
    );
    cut.set_mode(ProxyMode::Pass);

    // A retries in the same session; then H releases.
    assert_eq!(
        holder.release(held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let first = poll("the first grant", WAIT / 2, || async {
        let order = order.lock().unwrap_or_else(PoisonError::into_inner);
        order
            .first()
            .map(|(i, lease)| (*i, lease.handle().path.clone()))
    })
    .await;
    assert_eq!(
        first.0, 0,
        "A (queued before B) is served first; got B on {}, A's node was {}",
        first.1, queued_a.name
    );
    let (a, lease_a) = waiting_a.await.unwrap().expect("A granted");
    assert_eq!(zk_a.session_id(), session, "A kept its session");
    assert_eq!(
        node_name(&lease_a.handle().path),
        queued_a.name,
        "A granted on its original node"
    );
    assert_eq!(
        lease_a.token(),
        FencingToken(u64::try_from(czxid_a).unwrap()),
        "A's token is its original node's czxid"
    );
    assert_eq!(
        queue(&zk_holder, &k).await,
        [queued_a.clone(), queued_b.clone()],
        "A holds on its node and B waits behind it: no second node of A's"
    );
    assert_eq!(a.release(lease_a).await.unwrap(), ReleaseOutcome::Released);
    let (b, lease_b) = waiting_b.await.unwrap().expect("B granted");
    assert_eq!(node_name(&lease_b.handle().path), queued_b.name);
    assert_eq!(b.release(lease_b).await.unwrap(), ReleaseOutcome::Released);
    nothing_queued(&zk_holder, &k, "nothing left behind").await;
    assert_eq!(history.holds().len(), 3, "H, then A, then B");
    assert_safe(&history);
}
