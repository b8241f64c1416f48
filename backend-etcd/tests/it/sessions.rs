//! Session leases (`lease=session`, the default): what a cycle costs the server, and what
//! happens when a session's lease ends or its client goes away.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, Lease, LockError, LockExt, LockKey};
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::EtcdLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn key(name: &str) -> LockKey {
    LockKey::new(format!("sessions/{name}")).unwrap()
}

/// Takes the free lock `name`.
async fn take(lock: &EtcdLock, name: &str, ttl: Duration) -> Lease {
    lock.try_acquire(&key(name), ttl)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} is free"))
}

async fn connect(cluster: &EtcdCluster, options: &str) -> EtcdLock {
    let addr = cluster.members()[0].addr();
    EtcdLock::connect(&format!("etcd://{addr}/sessions?{options}"))
        .await
        .unwrap()
}

/// A plain etcd client on the member.
async fn plain(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect([cluster.members()[0].endpoint()], None)
        .await
        .unwrap()
}

/// Successful unary requests the member has served, by gRPC method, from its `/metrics`.
async fn served(cluster: &EtcdCluster, method: &str) -> u64 {
    let mut stream = tokio::net::TcpStream::connect(cluster.members()[0].addr())
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let series = format!("grpc_server_handled_total{{grpc_code=\"OK\",grpc_method=\"{method}\",");
    text.lines()
        .filter(|line| line.starts_with(&series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|count| count as u64)
        .sum()
}

/// With a lease per lock, a cycle was a lease grant, a transaction, a time-to-live read,
/// a transaction and a revoke: five requests, four of them Raft writes. On a session
/// lease it is the protocol floor: one transaction to acquire, one plain delete to
/// release (a compare-and-delete transaction cost the servers much more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_on_a_session_lease_is_a_transaction_and_a_delete() {
    const CYCLES: u64 = 20;
    let cluster = EtcdCluster::start(1).await.unwrap();
    let lock = connect(&cluster, "").await;
    let ttl = Duration::from_secs(10);
    // The first acquisition grants the session's lease.
    let warm = take(&lock, "warm", ttl).await;
    lock.release(warm).await.unwrap();
    let methods = [
        "LeaseGrant",
        "LeaseRevoke",
        "LeaseTimeToLive",
        "Txn",
        "DeleteRange",
        "Range",
    ];
    let mut before = Vec::new();
    for method in methods {
        before.push(served(&cluster, method).await);
    }
    for i in 0..CYCLES {
        let lease = lock
            .try_acquire(&key(&format!("cycle-{i}")), ttl)
            .await
            .unwrap()
            .expect("free");
        lock.release(lease).await.unwrap();
    }
    let mut spent = Vec::new();
    for (method, before) in methods.iter().zip(before) {
        spent.push((*method, served(&cluster, method).await - before));
    }
    assert_eq!(
        spent,
        [
            ("LeaseGrant", 0),
            ("LeaseRevoke", 0),
            ("LeaseTimeToLive", 0),
            ("Txn", CYCLES),
            ("DeleteRange", CYCLES),
            ("Range", 0),
        ],
        "requests served for {CYCLES} acquire/release cycles"
    );
}

/// A session's lease that ends (here revoked from outside, as an expiry would) takes
/// every lock on it: the guard reports the loss, an `extend` says `LeaseLost`, the locks
/// are free for others, and the client's next acquisition opens a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_loses_every_lock_on_it_and_the_client_carries_on() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let lock = Arc::new(connect(&cluster, "").await);
    let other = connect(&cluster, "").await;
    let ttl = Duration::from_secs(5);
    let guard = lock
        .lock(&key("guarded"), &AcquireOptions::new(ttl))
        .await
        .unwrap();
    let mut held = take(&lock, "held", ttl).await;
    let session = held.handle().id;
    assert_eq!(
        guard.lease().await.unwrap().handle().id,
        session,
        "both locks share the session's lease"
    );

    plain(&cluster).await.lease_revoke(session).await.unwrap();
    // At once, before the session's task can notice: a new acquisition must not fail on
    // the dead lease.
    let fresh = take(&lock, "fresh", ttl).await;
    assert_ne!(fresh.handle().id, session, "a new session");

    tokio::time::timeout(ttl + Duration::from_secs(1), guard.lost())
        .await
        .expect("the guard reports the loss");
    match lock.extend(&mut held, ttl).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("extend on a lost session: {other:?}"),
    }
    for name in ["guarded", "held"] {
        let taken = other.try_acquire(&key(name), ttl).await.unwrap();
        assert!(taken.is_some(), "{name} is free once its session ended");
    }
    lock.release(fresh).await.unwrap();
}

/// Dropping the client (every clone) stops its session's keep-alives: the server ends
/// the lease one TTL later, as it would a lease of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_stops_keeping_its_session_alive() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let mut client = plain(&cluster).await;
    let lock = connect(&cluster, "").await;
    let ttl = Duration::from_secs(2);
    let lease = take(&lock, "dropped", ttl).await;
    let session = lease.handle().id;
    // While the client lives, its task keeps the lease alive past its TTL.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    let alive = client.lease_time_to_live(session, None).await.unwrap();
    assert!(alive.ttl() > 0, "kept alive: {}", alive.ttl());

    drop(lock);
    let dropped = Instant::now();
    loop {
        let left = client.lease_time_to_live(session, None).await.unwrap();
        if left.ttl() < 0 {
            break;
        }
        assert!(
            dropped.elapsed() < ttl * 3,
            "the session's lease is still kept alive {:?} after its client was dropped",
            dropped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A key written on the session's lease after its caller gave up (an enqueue or a move
/// that timed out or was cancelled but applied later) is registered nowhere, so nobody
/// renews or deletes it — yet the session keeps its lease alive. The session deletes
/// such keys (here one written by a plain client on the session's lease, as a late
/// write would be), and leaves registered ones alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_written_after_its_caller_gave_up_is_deleted_by_its_session() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let mut client = plain(&cluster).await;
    let lock = Arc::new(connect(&cluster, "").await);
    let ttl = Duration::from_secs(2);
    let guard = lock
        .lock(&key("kept"), &AcquireOptions::new(ttl))
        .await
        .unwrap();
    let session = guard.lease().await.unwrap().handle().id;
    let ghost = format!("{}late-write", lock.queue_prefix(&key("ghost")));
    client
        .put(
            ghost.as_str(),
            "nobody",
            Some(etcd_client::PutOptions::new().with_lease(session)),
        )
        .await
        .unwrap();
    let placed = client.get(ghost.as_str(), None).await.unwrap();
    assert_eq!(placed.kvs().len(), 1, "the late write is on the server");
    let written = Instant::now();
    loop {
        let left = client.get(ghost.as_str(), None).await.unwrap();
        if left.kvs().is_empty() {
            break;
        }
        assert!(
            written.elapsed() < ttl * 3,
            "a key on the session's lease that nobody registered is still there after {:?}",
            written.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!guard.is_lost(), "the registered lock was left alone");
    let info = lock.inspect(&key("kept")).await.unwrap().expect("held");
    assert_eq!(info.owner, guard.lease().await.unwrap().owner());
    guard.release().await.unwrap();
}

/// A lease taken on a session and handed to a client with `?lease=per-lock` (a lease is
/// plain data) is released or moved there without revoking the session's lease: only a
/// lease the client granted per lock is its to revoke. The session's other locks stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_lock_client_never_revokes_a_session_lease_it_did_not_grant() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let sessions = connect(&cluster, "").await;
    let per_lock = connect(&cluster, "lease=per-lock").await;
    let ttl = Duration::from_secs(5);
    let mut kept = take(&sessions, "kept", ttl).await;
    let mut moved = take(&sessions, "moved", ttl).await;
    let released = take(&sessions, "released", ttl).await;
    let session = kept.handle().id;
    assert_eq!(moved.handle().id, session, "one session lease");

    // A longer TTL moves the key to a lease of the per-lock client's own; the move
    // returns once done (and, before the fix, once the old lease was revoked).
    per_lock
        .extend(&mut moved, Duration::from_secs(20))
        .await
        .unwrap();
    assert_ne!(moved.handle().id, session, "moved to another lease");
    sessions.extend(&mut kept, ttl).await.unwrap();

    assert_eq!(
        per_lock.release(released).await.unwrap(),
        tenure_api::ReleaseOutcome::Released
    );
    // A revoke after a release goes out in the background: give it time to land (only
    // this check's power depends on it, never its outcome on a correct client).
    tokio::time::sleep(Duration::from_millis(500)).await;
    sessions.extend(&mut kept, ttl).await.unwrap();
    let ttl_left = plain(&cluster)
        .await
        .lease_time_to_live(session, None)
        .await
        .unwrap()
        .ttl();
    assert!(ttl_left > 0, "the session's lease lives: {ttl_left}");

    per_lock.release(moved).await.unwrap();
    sessions.release(kept).await.unwrap();
}

/// Defect: on a session lease a grant's deadline counted from the session's last
/// keep-alive, up to a fifth of the lease's TTL old: a TTL shorter than that was granted
/// already expired, so it could never be held. A short TTL now counts from a
/// confirmation no older than a fifth of its own TTL before the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_is_granted_alive_on_a_session_lease() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let lock = connect(&cluster, "").await;
    for (round, ms) in [40u64, 60, 90, 150]
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let ttl = Duration::from_millis(ms);
        let name = format!("short-{round}");
        // However slow the machine, the deadline counts from a confirmation at most a
        // fifth of the TTL older than the call.
        let earliest =
            |started: Instant| started + ttl * 4 / 5 - tenure_api::backend::default_drift(ttl);
        let started = Instant::now();
        let mut lease = take(&lock, &name, ttl).await;
        assert!(
            lease.valid_until() >= earliest(started),
            "{ttl:?}: granted with a deadline {:?} before the call started",
            started.saturating_duration_since(lease.valid_until())
        );
        let started = Instant::now();
        lock.extend(&mut lease, ttl).await.unwrap();
        assert!(
            lease.valid_until() >= earliest(started),
            "{ttl:?}: extended"
        );
        lock.release(lease).await.unwrap();
        // Lets the session's last keep-alive age, as between a client's calls.
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
}

/// Defect: a lease granted on one client's session and extended through another client
/// (a lease is plain data) was kept alive there directly, while the granting client's
/// session still deleted the key at the deadline it last set: the extending holder
/// believed it held a permit that was free again, and a semaphore of 2 had 3 holders.
/// Another client's lease is now moved onto a lease of the extending client's own (same
/// key and token), which no other client reaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_extended_through_another_client_is_never_reaped_under_it() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let semaphore = |lock: EtcdLock| tenure_api::Semaphore::new(Arc::new(lock), 2).unwrap();
    let granting = semaphore(connect(&cluster, "").await);
    let extending = semaphore(connect(&cluster, "").await);
    let extending_per_lock = semaphore(connect(&cluster, "lease=per-lock").await);
    let contender = semaphore(connect(&cluster, "").await);
    let name = key("handed-over");
    let ttl = Duration::from_secs(2);
    let mut handed = granting.try_acquire(&name, ttl).await.unwrap().unwrap();
    let mut kept = granting.try_acquire(&name, ttl).await.unwrap().unwrap();
    let mut handed_again = None;
    let started = Instant::now();
    while started.elapsed() < ttl * 2 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        extending.extend(&mut handed, ttl).await.unwrap();
        granting.extend(&mut kept, ttl).await.unwrap();
        assert!(
            contender.try_acquire(&name, ttl).await.unwrap().is_none(),
            "a third holder, {:?} after the grant",
            started.elapsed()
        );
        if handed_again.is_none() && started.elapsed() > ttl {
            // …and on to a client with leases of its own, for the rest.
            handed_again = Some(());
            extending_per_lock.extend(&mut handed, ttl).await.unwrap();
        }
    }
    assert!(handed_again.is_some());
    assert_eq!(
        extending_per_lock.release(handed).await.unwrap(),
        tenure_api::ReleaseOutcome::Released,
        "the handed-over permit was still held"
    );
    granting.release(kept).await.unwrap();
}
