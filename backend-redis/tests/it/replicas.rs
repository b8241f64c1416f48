//! `?wait_replicas=N`: a grant, an extension and a fence raise count only once `WAIT`
//! says N replicas have them — on a real primary with a real replica, whose replication
//! link the test cuts (and checks it cut).

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, Backoff, DistributedLock, LockError, LockKey};
use tenure_conformance::proxy::ProxyMode;
use tenure_redis::lab::RedisReplicaPair;
use tenure_redis::RedisLock;

use crate::common;
use common::refused_unconfirmed;

const TTL: Duration = Duration::from_secs(10);
/// `WAIT`'s bound where a replica must confirm: a healthy replica acks within a round
/// trip, but on two loaded cores that can take longer than a short bound.
const PATIENT: &str = "wait_timeout_ms=5000&request_timeout_ms=15000";
/// `WAIT`'s bound where no replica can confirm (the link is cut): the refusal is certain.
const WAIT_MS: u64 = 300;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("replicas/{name}")).unwrap()
}

/// A client of the pair's primary that asks one replica to confirm every write, as an
/// ACL user with exactly [`tenure_redis::ACL_COMMANDS`] on its prefix (docs/security.md's
/// least privilege: `WAIT` included), and waits for it [`PATIENT`]ly.
async fn confirming(pair: &RedisReplicaPair) -> RedisLock {
    confirming_as(pair, "locker", &[], PATIENT).await
}

/// [`confirming`], but `WAIT` gives up after [`WAIT_MS`]: for writes no replica can
/// confirm.
async fn impatient(pair: &RedisReplicaPair) -> RedisLock {
    confirming_as(pair, "locker", &[], &format!("wait_timeout_ms={WAIT_MS}")).await
}

/// [`confirming`] as ACL user `user`, whose rule ends with `amend` (e.g. `-wait`), with
/// `wait` (`WAIT`'s bound) in its URL.
async fn confirming_as(
    pair: &RedisReplicaPair,
    user: &str,
    amend: &[&str],
    wait: &str,
) -> RedisLock {
    let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw", "resetkeys"];
    setuser.extend(["~{tenure:*", "resetchannels", "&{tenure:*"]);
    setuser.extend(tenure_redis::ACL_COMMANDS.split_whitespace());
    setuser.extend(amend);
    let reply = pair.primary().command(&setuser).await.unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    let url = format!(
        "redis://{user}:pw@{}?wait_replicas=1&{wait}",
        pair.primary().addr()
    );
    RedisLock::connect(&url).await.unwrap()
}

/// Cuts the replication link and checks the cut took: a write on the primary does not
/// reach the replica.
async fn cut_replication(pair: &RedisReplicaPair) {
    pair.replication_link().set_mode(ProxyMode::Blackhole);
    let probe = "replication-probe";
    let set = pair.primary().command(&["SET", probe, "1"]).await.unwrap();
    assert!(set.is_ok(), "{set:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = pair.replica().command(&["GET", probe]).await.unwrap();
    assert!(
        seen.is_nil(),
        "the fault fired: the replica got no write ({seen:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_counts_once_the_replica_has_it() {
    let pair = RedisReplicaPair::start().await.unwrap();
    pair.wait_synced().await.unwrap();
    let lock = confirming(&pair).await;
    let k = key("confirmed");
    let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    // Read on the replica right away: WAIT made the grant reach it before the reply.
    let on_replica = pair
        .replica()
        .command(&["GET", &lock.lock_key(&k)])
        .await
        .unwrap();
    let value = on_replica.as_text().expect("the replica has the lock key");
    assert!(value.starts_with(&lease.owner().to_string()), "{value}");
    let mut lease = lease;
    lock.extend(&mut lease, TTL).await.unwrap();
    assert_eq!(
        lock.release(lease).await.unwrap(),
        tenure_api::ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_replica_confirms_is_refused_and_released() {
    let pair = RedisReplicaPair::start().await.unwrap();
    pair.wait_synced().await.unwrap();
    let lock = impatient(&pair).await;
    cut_replication(&pair).await;
    let k = key("unconfirmed");
    let started = Instant::now();
    let refused = lock.try_acquire(&k, TTL).await;
    let took = started.elapsed();
    refused_unconfirmed(&refused);
    assert!(took >= Duration::from_millis(WAIT_MS), "WAIT ran: {took:?}");
    let on_primary = pair
        .primary()
        .command(&["GET", &lock.lock_key(&k)])
        .await
        .unwrap();
    assert!(
        on_primary.is_nil(),
        "the refused grant was released: {on_primary:?}"
    );

    // A waiting acquire says why too. Its wait ends in an attempt that the wait cuts off
    // before WAIT answers (most times: a cycle is a 300 ms WAIT and a 10 ms pause); that
    // attempt's "no reply within …" must not hide the refusals before it.
    let pause = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(10),
        jitter: 0.0,
    };
    let opts = AcquireOptions::new(TTL)
        .wait(Duration::from_secs(2))
        .backoff(pause);
    refused_unconfirmed(&lock.acquire(&k, &opts).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_no_replica_confirms_does_not_count() {
    let pair = RedisReplicaPair::start().await.unwrap();
    pair.wait_synced().await.unwrap();
    let lock = confirming(&pair).await;
    let k = key("extension");
    let mut lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let deadline = lease.valid_until();
    cut_replication(&pair).await;
    match lock.extend(&mut lease, TTL * 3).await {
        Err(LockError::Unavailable { message, .. }) => assert!(
            message.contains("extend") && message.contains("the extension does not count"),
            "{message}"
        ),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(
        lease.valid_until(),
        deadline,
        "the lease keeps its deadline"
    );
}

/// A pipeline reports its first error: when `WAIT` itself fails after the script granted
/// (here a user the ACL refuses `WAIT`), the grant is given back, not left to its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_wait_fails_is_given_back() {
    let pair = RedisReplicaPair::start().await.unwrap();
    let lock = confirming_as(&pair, "nowait", &["-wait"], PATIENT).await;
    let k = key("wait-refused");
    match lock.try_acquire(&k, TTL).await {
        Err(LockError::Config(message)) => assert!(message.contains("NOPERM"), "{message}"),
        other => panic!("expected the ACL's refusal of WAIT, got {other:?}"),
    }
    let lock_key = lock.lock_key(&k);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let held = pair.primary().command(&["GET", &lock_key]).await.unwrap();
        if held.is_nil() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the grant WAIT could not confirm was given back (not left for its {TTL:?} TTL)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server that lost its scripts (`SCRIPT FLUSH`, a restart) gets them loaded again
/// and the call sent once more: a plain call, and the pipeline with `WAIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_scripts_gets_them_again() {
    let pair = RedisReplicaPair::start().await.unwrap();
    pair.wait_synced().await.unwrap();
    let plain = RedisLock::connect(&format!("redis://{}", pair.primary().addr()))
        .await
        .unwrap();
    let confirming = confirming(&pair).await;
    let acquire = tenure_redis::scripts::SCRIPTS.acquire.get_hash().to_owned();
    let cached = || async {
        let exists = pair
            .primary()
            .command(&["SCRIPT", "EXISTS", &acquire])
            .await;
        format!("{:?}", exists.unwrap())
    };
    for (name, lock) in [("plain", &plain), ("confirming", &confirming)] {
        let flushed = pair.primary().command(&["SCRIPT", "FLUSH"]).await.unwrap();
        assert!(flushed.is_ok(), "{flushed:?}");
        assert_eq!(
            cached().await,
            "Array(Some([Integer(0)]))",
            "the fault fired: the server forgot the acquire script"
        );
        let k = key(&format!("flushed-{name}"));
        let mut lease = lock.try_acquire(&k, TTL).await.unwrap().expect("granted");
        assert_eq!(
            cached().await,
            "Array(Some([Integer(1)]))",
            "{name}: loaded again"
        );
        pair.primary().command(&["SCRIPT", "FLUSH"]).await.unwrap();
        lock.extend(&mut lease, TTL).await.unwrap();
        pair.primary().command(&["SCRIPT", "FLUSH"]).await.unwrap();
        assert_eq!(
            lock.release(lease).await.unwrap(),
            tenure_api::ReleaseOutcome::Released,
            "{name}"
        );
    }
}

/// Issue 57, defect 2: a grant whose reply (and `WAIT`'s) did not come in time was
/// released in the background, and the retry used the same owner id. With the fresh
/// connection slow to open, that release went over the stalled old connection, behind
/// the grant, while the retry was granted over the fresh one: the release landed last
/// and deleted the retry's grant, which its holder still believed in. Failed before the
/// fix with "the lease's key is still its own: None". Each attempt has an owner id of
/// its own now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempts_release_never_deletes_the_retrys_grant() {
    let pair = RedisReplicaPair::start().await.unwrap();
    let primary = pair.primary();
    let proxy = tenure_conformance::proxy::FaultProxy::start(primary.addr())
        .await
        .unwrap();
    let url = format!(
        "redis://{}?wait_replicas=1&wait_timeout_ms=300&request_timeout_ms=500",
        proxy.addr()
    );
    let lock = RedisLock::connect(&url).await.unwrap();
    let observer = RedisLock::connect(&primary.url()).await.unwrap();
    pair.wait_synced().await.unwrap();
    let patient = AcquireOptions::new(TTL).wait(Duration::from_secs(10));
    let warm = lock.acquire(&key("warm"), &patient).await.unwrap();
    lock.release(warm).await.unwrap();

    proxy.stall(Duration::from_secs(4));
    // New connections are slow too: opening one takes longer than half a request's time
    // (but less than the connect timeout), and a request on one most of its time.
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::from_millis(300),
        down: Duration::ZERO,
    });
    let k = key("retry-after-stall");
    // The retry waits until the fresh connection is up (opened for the release).
    let opts = AcquireOptions::new(Duration::from_secs(60))
        .wait(Duration::from_secs(6))
        .backoff(Backoff {
            initial: Duration::from_millis(900),
            max: Duration::from_millis(900),
            jitter: 0.0,
        });
    let lease = lock.acquire(&k, &opts).await.expect("granted on a retry");
    assert!(proxy.stats().bytes_stalled > 0, "the fault fired");
    // The stalled requests (the first grant, and its release) land.
    let landed = proxy.stalled_delivered(Duration::from_secs(15)).await;
    assert!(landed, "the stalled requests landed: {:?}", proxy.stats());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let holder = observer.inspect(&k).await.unwrap();
    assert_eq!(
        holder.map(|h| h.owner),
        Some(lease.owner()),
        "the lease's key is still its own"
    );
}
