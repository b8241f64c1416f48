//! One lock with `etcdctl lock` (Debian's `etcd-client`, the real client; Go's
//! `concurrency.Mutex` underneath): tenure on `etcd://…//lock/order` key `1001` and
//! `etcdctl lock /lock/order/1001` queue under one prefix, ordered by create revision.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{
    AcquireOptions, DistributedLock, Election, LockAdmin, LockKey, OwnerId, ReleaseOutcome,
};
use tenure_conformance::foreign::ForeignClient;
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::EtcdLock;
use tokio::process::Command;

const TTL: Duration = Duration::from_secs(10);
/// `etcdctl lock --ttl`: how long its lock outlives its process.
const ETCDCTL_TTL: Duration = Duration::from_secs(6);

/// `etcdctl lock NAME`, in a session of [`ETCDCTL_TTL`].
fn etcdctl_lock(endpoint: &str, name: &str) -> ForeignClient {
    tenure_etcd::lab::etcdctl_lock(endpoint, name, ETCDCTL_TTL).unwrap()
}

/// A one-member cluster, its endpoint, and tenure on `etcd://…//lock/order`: the
/// prefix `etcdctl lock /lock/order/<key>` queues under.
async fn on_lock_order() -> (EtcdCluster, String, EtcdLock) {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let endpoint = cluster.members()[0].endpoint();
    let addr = endpoint.trim_start_matches("http://").to_owned();
    let lock = EtcdLock::connect(&format!("etcd://{addr}//lock/order"))
        .await
        .unwrap();
    (cluster, endpoint, lock)
}

/// Waits until `key`'s queue has `len` entries.
async fn queued(lock: &EtcdLock, k: &LockKey, len: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while lock.queued(k).await.unwrap() != len {
        assert!(tokio::time::Instant::now() < deadline, "{len} queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// tenure and `etcdctl lock` share a lock with an absolute prefix: each refused while the
/// other holds, one FIFO queue across both, each release waking the other side, and a
/// killed `etcdctl`'s lock freed for tenure when its lease runs out. `inspect`, `holders`
/// and `doctor` show `etcdctl`'s hold as a foreign holder — before, `inspect` failed with
/// "malformed owner id" and `doctor` called it malformed; no URL gave the prefix
/// `/lock/order`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_shares_a_lock_with_tenure() {
    let (_cluster, endpoint, lock) = on_lock_order().await;
    let k = LockKey::new("1001").unwrap();
    assert_eq!(lock.queue_prefix(&k), "/lock/order/1001/");

    let ours = lock
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("a free key");
    let first = ours.token();
    let mut etcdctl = etcdctl_lock(&endpoint, "/lock/order/1001");
    queued(&lock, &k, 2).await;
    let early = etcdctl.line_within(Duration::from_secs(1)).await;
    assert_eq!(early, None, "etcdctl granted beside tenure's holder");
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
            lock.acquire(&k, &opts).await
        }
    });
    queued(&lock, &k, 3).await;
    assert_eq!(lock.release(ours).await.unwrap(), ReleaseOutcome::Released);
    let held = etcdctl.line(Duration::from_secs(30)).await;
    assert!(held.starts_with("/lock/order/1001/"), "its key: {held}");

    assert!(
        lock.try_acquire(&k, TTL).await.unwrap().is_none(),
        "tenure granted beside etcdctl"
    );
    assert!(!waiter.is_finished(), "etcdctl, queued first, holds");
    let holder = lock.inspect(&k).await.unwrap().expect("etcdctl holds");
    assert!(holder.foreign, "{holder:?}");
    assert_eq!(holder.owner, OwnerId::derived(held.as_bytes()));
    assert_eq!(holder.label, None, "etcdctl's value is empty");
    let token = holder.token.expect("its key's create revision");
    assert!(token > first);
    let remaining = holder.remaining.expect("its lease's TTL");
    assert!(remaining <= ETCDCTL_TTL, "{remaining:?}");
    let holders = lock.holders("").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let (key, listed) = &holders[0];
    assert_eq!(key, &k);
    assert!(listed.foreign && listed.owner == holder.owner && listed.token == holder.token);
    assert_eq!(
        lock.doctor().await.unwrap(),
        [],
        "a foreign holder is no finding"
    );

    etcdctl.terminate();
    assert!(etcdctl.exited(Duration::from_secs(30)).await, "unlocked");
    let lease = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("tenure granted once etcdctl let go")
        .unwrap()
        .unwrap();
    assert!(lease.token() > token, "a later grant, a larger token");
    lock.release(lease).await.unwrap();

    let mut etcdctl = etcdctl_lock(&endpoint, "/lock/order/1001");
    etcdctl.line(Duration::from_secs(30)).await;
    etcdctl.kill().await;
    assert!(
        lock.try_acquire(&k, TTL).await.unwrap().is_none(),
        "etcdctl's lease outlives its process"
    );
    let opts = AcquireOptions::new(TTL).wait(ETCDCTL_TTL * 10);
    let lease = lock.acquire(&k, &opts).await.unwrap();
    lock.release(lease).await.unwrap();

    // etcdctl's lock on a name two levels below the prefix is no key's queue (tenure's
    // key `a/b` is `/lock/order/a%2Fb`): not listed as the holder of `a/b`.
    let mut nested = etcdctl_lock(&endpoint, "/lock/order/a/b");
    nested.line(Duration::from_secs(30)).await;
    let holders = lock.holders("").await.unwrap();
    assert!(
        holders.iter().all(|(key, _)| key.as_str() != "a/b"),
        "{holders:?}"
    );
    let nested_key = LockKey::new("a/b").unwrap();
    assert_eq!(lock.inspect(&nested_key).await.unwrap(), None);
}

/// `etcdctl elect` and tenure's [`Election`] on one name: one leader at a time across
/// both, each seeing the other's leader (etcdctl's proposal is the leader's value, its
/// key's create revision the term), and a resigning etcdctl hands over to tenure's
/// waiting candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_shares_an_election_with_tenure() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let endpoint = cluster.members()[0].endpoint();
    let addr = endpoint.trim_start_matches("http://");
    let lock = EtcdLock::connect(&format!("etcd://{addr}//lock"))
        .await
        .unwrap();
    let election = Election::new(Arc::new(lock)).unwrap();
    let name = LockKey::new("sched").unwrap();

    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("elect")
        .arg("/lock/sched")
        .arg("node-1");
    let mut etcdctl = ForeignClient::spawn("etcdctl elect /lock/sched node-1", command);
    let key = etcdctl.line(Duration::from_secs(30)).await;
    assert!(key.starts_with("/lock/sched/"), "its key: {key}");
    assert_eq!(etcdctl.line(Duration::from_secs(5)).await, "node-1");
    let leader = election
        .leader(&name)
        .await
        .unwrap()
        .expect("etcdctl leads");
    assert_eq!(leader.value, "node-1");

    let candidate = tokio::spawn({
        let (election, name) = (election.clone(), name.clone());
        async move {
            election
                .campaign(&name, "host-b", Duration::from_secs(60))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!candidate.is_finished(), "etcdctl still leads");
    etcdctl.terminate();
    assert!(etcdctl.exited(Duration::from_secs(30)).await, "resigned");
    let leadership = tokio::time::timeout(Duration::from_secs(30), candidate)
        .await
        .expect("tenure's candidate elected once etcdctl resigned")
        .unwrap()
        .unwrap();
    assert!(leadership.term() > leader.term);

    // etcdctl's observer sees tenure's leader: its key, then its value.
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("elect")
        .arg("--listen")
        .arg("/lock/sched");
    let mut observer = ForeignClient::spawn("etcdctl elect --listen /lock/sched", command);
    let key = observer.line(Duration::from_secs(30)).await;
    assert!(key.starts_with("/lock/sched/"), "its key: {key}");
    let value = observer.line(Duration::from_secs(5)).await;
    assert!(
        value.ends_with(":host-b"),
        "tenure's value, after its owner id: {value}"
    );
    leadership.resign().await.unwrap();
}

/// `etcdctl lock` is a writer to tenure's readers: it waits for the reader before it,
/// and a reader queued after it waits for it (its key is not named as a reader's), then
/// shares the lock with the other readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_is_a_writer_to_tenures_readers() {
    let (_cluster, endpoint, lock) = on_lock_order().await;
    let k = LockKey::new("1002").unwrap();
    let once = AcquireOptions::new(TTL).wait(Duration::ZERO);
    let reader = lock.acquire_shared(&k, &once).await.unwrap();
    let mut etcdctl = etcdctl_lock(&endpoint, "/lock/order/1002");
    queued(&lock, &k, 2).await;
    let early = etcdctl.line_within(Duration::from_secs(1)).await;
    assert_eq!(early, None, "etcdctl granted beside tenure's reader");
    match lock.acquire_shared(&k, &once).await {
        Err(tenure_api::LockError::Timeout { .. }) => {}
        other => panic!("a reader queued after etcdctl's lock: {other:?}"),
    }
    let later = {
        let lock = lock.clone();
        let k = k.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
            lock.acquire_shared(&k, &opts).await
        })
    };
    queued(&lock, &k, 3).await;
    assert_eq!(
        lock.release(reader).await.unwrap(),
        ReleaseOutcome::Released
    );
    etcdctl.line(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !later.is_finished(),
        "a reader granted beside etcdctl's lock"
    );
    etcdctl.terminate();
    assert!(etcdctl.exited(Duration::from_secs(30)).await, "unlocked");
    let later = tokio::time::timeout(Duration::from_secs(30), later)
        .await
        .expect("the reader is granted once etcdctl let go")
        .unwrap()
        .unwrap();
    assert!(later.is_shared());
    let another = lock.acquire_shared(&k, &once).await.unwrap();
    assert!(another.token() > later.token());
    lock.release(another).await.unwrap();
    lock.release(later).await.unwrap();
}
