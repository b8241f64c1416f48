//! etcd under real faults on a 3-member cluster, beyond the fault suite every backend
//! runs (`tests/suite.rs`, `faults::`): the queue across a leader's death, availability with a
//! minority or majority down, FIFO order, lease TTL rounding. Each test asserts its
//! expected outcome and that its fault really fired.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, DistributedLock, FencingToken, Lease, LockError, LockKey, ReleaseOutcome,
};
use tenure_conformance::servers::pid_alive;
use tenure_conformance::{retrying, History};
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::EtcdLock;

const TTL: Duration = Duration::from_secs(10);

/// Each test starts three etcd members; run them one at a time so a shared machine's
/// fsyncs and elections do not blur their timings.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

fn all_hosts(cluster: &EtcdCluster) -> String {
    let hosts: Vec<String> = cluster
        .members()
        .iter()
        .map(|m| m.addr().to_string())
        .collect();
    hosts.join(",")
}

async fn connect(hosts: &str, options: &str) -> EtcdLock {
    EtcdLock::connect(&format!("etcd://{hosts}/faults?{options}"))
        .await
        .unwrap()
}

/// Number of keys (holder and waiters) queued for `key`, read with a plain etcd client
/// (retried for a while: it may route a request to a member that was just killed).
async fn queued(lock: &EtcdLock, hosts: &str, key: &LockKey) -> usize {
    let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
    let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let started = Instant::now();
    loop {
        match client
            .get(lock.queue_prefix(key), Some(options.clone()))
            .await
        {
            Ok(reply) => return reply.count() as usize,
            Err(e) if started.elapsed() < Duration::from_secs(5) => {
                eprintln!("queue count failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("queue count: {e}"),
        }
    }
}

/// One served waiter: (index, token, acquired at, release started at).
type Served = (usize, FencingToken, Instant, Instant);

/// Starts a waiter on its own client, recorded in `history` as client `index + 1`, and
/// returns once its key is queued behind `ahead` others. The task reports (index, lease,
/// acquired-at) and releases after `hold`, reporting when it started the release.
async fn spawn_waiter(
    hosts: &str,
    key: &LockKey,
    (index, ahead): (usize, usize),
    hold: Duration,
    log: Arc<Mutex<Vec<Served>>>,
    history: &History,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let probe = connect(hosts, "").await;
    let lock = history.recorded(index + 1, Arc::new(probe.clone()));
    let key = key.clone();
    let task = {
        let key = key.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
            let lease = lock.acquire(&key, &opts).await?;
            let acquired = Instant::now();
            tokio::time::sleep(hold).await;
            let releasing = Instant::now();
            log.lock().unwrap_or_else(PoisonError::into_inner).push((
                index,
                lease.token(),
                acquired,
                releasing,
            ));
            let outcome = lock.release(lease).await?;
            assert_eq!(outcome, ReleaseOutcome::Released);
            Ok(())
        })
    };
    let started = Instant::now();
    while queued(&probe, hosts, &key).await < ahead + 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "waiter {index} never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task
}

/// Checks the waiters were served in index order with increasing tokens; returns the
/// hand-off latencies (one waiter's release started → the next one acquired).
fn check_fifo(log: &[Served], after: FencingToken) -> Vec<Duration> {
    let order: Vec<usize> = log.iter().map(|entry| entry.0).collect();
    assert_eq!(
        order,
        (0..log.len()).collect::<Vec<_>>(),
        "served in FIFO order"
    );
    let mut last = after;
    for &(i, token, _, _) in log {
        assert!(token > last, "waiter {i}: token {token} after {last}");
        last = token;
    }
    log.windows(2)
        .map(|w| w[1].2.saturating_duration_since(w[0].3))
        .collect()
}

fn summary(latencies: &mut [Duration]) -> String {
    latencies.sort();
    let n = latencies.len();
    format!(
        "n={n} min={:?} median={:?} max={:?}",
        latencies[0],
        latencies[n / 2],
        latencies[n - 1]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_keeps_the_lock_and_the_queue() {
    let _serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start(3).await.unwrap();
    let hosts = all_hosts(&cluster);
    let probe = connect(&hosts, "").await;
    let history = History::new();
    let holder = history.recorded(0, Arc::new(probe.clone()));
    let k = key("leader-killed");
    let mut held = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let hold = Duration::from_millis(20);
        waiters.push(spawn_waiter(&hosts, &k, (i, i + 1), hold, log.clone(), &history).await);
    }

    let leader = cluster.leader_index().await.unwrap();
    let pid = cluster.members()[leader].pid().unwrap();
    cluster.members()[leader].kill().await.unwrap();
    assert!(
        !pid_alive(pid),
        "the fault fired: the leader's process exited"
    );
    let new_leader = cluster.leader_index().await.unwrap();
    assert_ne!(new_leader, leader, "a new leader was elected");
    eprintln!("leader m{leader} killed; m{new_leader} elected");

    // The lease survived the election: the lock is still the holder's.
    let (extended, failures) = retrying(Duration::from_secs(5), || {
        let (holder, mut lease) = (&holder, held.clone());
        async move { holder.extend(&mut lease, TTL).await.map(|()| lease) }
    })
    .await;
    held = extended.expect("the holder's lease survives the election");
    eprintln!("extend after the election needed {failures} retries");
    let (info, _) = retrying(Duration::from_secs(5), || holder.inspect(&k)).await;
    let info = info.unwrap().expect("still held");
    assert_eq!(info.owner, held.owner(), "still held by its owner");
    assert_eq!(info.token, Some(held.token()));
    assert_eq!(
        queued(&probe, &hosts, &k).await,
        4,
        "the waiters are still queued"
    );

    let (released, _) = retrying(Duration::from_secs(5), || holder.release(held.clone())).await;
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut latencies = check_fifo(&log, held.token());
    eprintln!(
        "after leader failover: hand-off latency {}",
        summary(&mut latencies)
    );
    let report = history.check();
    assert_eq!(history.holds().len(), 4, "the holder and three waiters");
    assert!(report.is_safe(), "one holder at a time: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_killed_is_still_available() {
    let _serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start(3).await.unwrap();
    let hosts = all_hosts(&cluster);
    let lock = connect(&hosts, "").await;
    assert_eq!(lock.capabilities().failures_tolerated, 1);
    let k = key("minority");
    let before = lock.try_acquire(&k, TTL).await.unwrap().unwrap();

    let leader = cluster.leader_index().await.unwrap();
    let follower = (leader + 1) % 3;
    let pid = cluster.members()[follower].pid().unwrap();
    cluster.members()[follower].kill().await.unwrap();
    assert!(
        !pid_alive(pid),
        "the fault fired: the follower's process exited"
    );

    // Requests the client had routed to the dead member may fail once; the cluster
    // itself keeps serving.
    let started = Instant::now();
    let (released, failures) =
        retrying(Duration::from_secs(5), || lock.release(before.clone())).await;
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    for _ in 0..5 {
        let (lease, more) = retrying(Duration::from_secs(5), || lock.try_acquire(&k, TTL)).await;
        let lease = lease.unwrap().expect("free");
        assert!(lease.token() > before.token());
        let (released, again) =
            retrying(Duration::from_secs(5), || lock.release(lease.clone())).await;
        assert_eq!(released.unwrap(), ReleaseOutcome::Released);
        assert_eq!(more + again, 0, "no failures once the dead member is known");
    }
    eprintln!(
        "minority down: 6 operations in {:?}, {failures} retried",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_killed_is_unavailable_within_the_timeout() {
    let _serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start(3).await.unwrap();
    let hosts = all_hosts(&cluster);
    let timeout = Duration::from_millis(1000);
    let lock = connect(&hosts, "request_timeout_ms=1000").await;
    let k = key("majority");
    let short = Duration::from_secs(2);
    let mut held = lock.try_acquire(&key("held"), TTL).await.unwrap().unwrap();

    let leader = cluster.leader_index().await.unwrap();
    let survivor = (leader + 1) % 3;
    let mut killed = Vec::new();
    for (i, member) in cluster.members().iter().enumerate() {
        if i != survivor {
            killed.push(member.pid().unwrap());
            member.kill().await.unwrap();
        }
    }
    let down = killed.iter().filter(|&&pid| !pid_alive(pid)).count();
    assert_eq!(down, 2, "the fault fired: two members' processes exited");

    // A single operation is three requests at most (grant, txn, revoke).
    let bound = timeout * 3 + Duration::from_millis(500);
    for attempt in 0..3 {
        let started = Instant::now();
        let result = lock.try_acquire(&k, short).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(LockError::Unavailable { .. })),
            "try {attempt}: expected Unavailable, got {result:?}"
        );
        assert!(took <= bound, "try {attempt} took {took:?}");
    }
    let started = Instant::now();
    let wait = Duration::from_secs(2);
    let result = lock
        .acquire(&k, &AcquireOptions::new(short).wait(wait))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "acquire: expected Unavailable (not Timeout, never a lease), got {result:?}"
    );
    assert!(took <= wait + bound, "acquire took {took:?}");
    let result = lock.extend(&mut held, TTL).await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "extend: expected Unavailable, got {result:?}"
    );
    let result = lock.inspect(&k).await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "inspect: expected Unavailable (require_leader), got {result:?}"
    );

    // Back to a quorum: no attempt left a lock behind beyond its short TTL.
    for (i, member) in cluster.members().iter().enumerate() {
        if i != survivor {
            member.restart().await.unwrap();
        }
    }
    let opts = AcquireOptions::new(short).wait(short * 2);
    let (lease, _) = retrying(Duration::from_secs(10), || lock.acquire(&k, &opts)).await;
    let lease = lease.expect("free again once a quorum is back");
    lock.release(lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_ttl_is_rounded_up_and_the_deadline_stays_conservative() {
    let _serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start(1).await.unwrap();
    let lock = connect(&all_hosts(&cluster), "").await;
    let k = key("rounding");
    let ttl = Duration::from_millis(1500);
    let sent = Instant::now();
    let mut lease: Lease = lock.try_acquire(&k, ttl).await.unwrap().unwrap();
    assert!(
        lease.valid_until() <= sent + ttl,
        "deadline within the requested ttl"
    );
    let info = lock.inspect(&k).await.unwrap().unwrap();
    let remaining = info.remaining.unwrap();
    assert!(
        remaining >= Duration::from_secs(1) && remaining <= Duration::from_secs(2),
        "the server holds 2 whole seconds: {remaining:?}"
    );
    // A longer TTL moves the key to a longer lease, keeping its token.
    let token = lease.token();
    lock.extend(&mut lease, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(lease.token(), token);
    let info = lock.inspect(&k).await.unwrap().unwrap();
    assert!(
        info.remaining.unwrap() > Duration::from_secs(15),
        "{info:?}"
    );
    assert_eq!(info.token, Some(token));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        lock.try_acquire(&k, ttl).await.unwrap().is_none(),
        "still held past the old lease's ttl"
    );
    assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    assert!(lock.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_second_leases_are_granted() {
    let _serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start(1).await.unwrap();
    let lock = connect(&all_hosts(&cluster), "").await;
    // The members' minimum lease TTL is under a second: the server grants 1 s leases,
    // whose remaining time the leader reports as 0 whole seconds.
    let ttl = Duration::from_secs(1);
    assert_eq!(lock.granted_ttl(ttl).await.unwrap(), ttl);
    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(5));
    for round in 0..3 {
        let k = key(&format!("one-second-{round}"));
        let lease = lock.acquire(&k, &opts).await.unwrap();
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
        let lease = lock.try_acquire(&k, ttl).await.unwrap().expect("free");
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
}
