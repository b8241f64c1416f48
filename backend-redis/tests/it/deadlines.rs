//! Deadlines on a real server behind a fault proxy (issue 15): a grant whose reply comes
//! after the lease's deadline is refused (defect 2), and `acquire` keeps to its wait
//! (defect 9).

use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey, ReleaseOutcome};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_redis::lab::{RedisCluster, RedisOptions, Resp};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("deadlines/{name}")).unwrap()
}

/// Loads the scripts on the server through `lock` (so that a later call is one round
/// trip, not `EVALSHA` + `NOSCRIPT` + `EVAL`).
async fn warm_up(lock: &RedisLock) {
    let lease = lock
        .try_acquire(&key("warm-up"), Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    lock.release(lease).await.unwrap();
}

/// A server, a client behind a proxy on it (patient: a 30 s request timeout, scripts
/// loaded), and a direct observer.
async fn behind_a_proxy() -> (RedisCluster, FaultProxy, RedisLock, RedisLock) {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let proxy = FaultProxy::start(node.addr()).await.unwrap();
    let lock = RedisLock::connect(&format!(
        "redis://{}?command_timeout_ms=30000",
        proxy.addr()
    ))
    .await
    .unwrap();
    let observer = RedisLock::connect(&node.url()).await.unwrap();
    warm_up(&lock).await;
    (cluster, proxy, lock, observer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_comes_after_the_lease_deadline_is_refused_and_released() {
    let (_cluster, proxy, lock, observer) = behind_a_proxy().await;
    let k = key("late-grant");
    let ttl = Duration::from_secs(3);
    // The request reaches the server this late: the server's key lives until at least
    // `delay + ttl` after sending, but the holder's deadline (sent + ttl − drift) has
    // passed when the reply arrives.
    let delay = Duration::from_millis(3500);

    // A trial counts only if its fault fired: the request was held by the proxy.
    for trial in 1..=3 {
        proxy.set_mode(ProxyMode::Delay {
            up: delay,
            down: Duration::ZERO,
        });
        let started = Instant::now();
        let attempt = {
            let (lock, k) = (lock.clone(), k.clone());
            tokio::spawn(async move { lock.try_acquire(&k, ttl).await })
        };
        // Once the request sits in the proxy's queue, let everything else (the release
        // of a refused grant) through at once.
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set_mode(ProxyMode::Pass);
        let result = attempt.await.unwrap();
        let replied = started.elapsed();
        if replied < delay {
            eprintln!("trial {trial}: the request was not delayed ({replied:?}); again");
            if let Ok(Some(lease)) = result {
                lock.release(lease).await.unwrap();
            }
            continue;
        }
        let holder = observer.inspect(&k).await.unwrap();
        let checked = started.elapsed();
        match result {
            Ok(Some(lease)) => panic!(
                "a lease past its deadline was handed out: valid_until is {:?} before the reply",
                replied.saturating_sub(lease.valid_until() - started)
            ),
            Ok(None) => panic!("reported as held by another"),
            Err(LockError::Unavailable { message, .. }) => {
                assert!(message.contains("deadline"), "says why: {message}");
            }
            Err(e) => panic!("expected Unavailable, got {e}"),
        }
        assert!(
            holder.is_none(),
            "the refused grant was released, not left held: {holder:?}"
        );
        assert!(
            checked < delay + ttl,
            "checked ({checked:?}) before the key could have expired by itself"
        );
        return;
    }
    panic!("the delay never applied to the acquire request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_refuses_a_late_grant_and_gets_a_live_one_within_its_wait() {
    let (_cluster, proxy, lock, observer) = behind_a_proxy().await;
    let k = key("late-then-live");
    let ttl = Duration::from_secs(3);
    let delay = Duration::from_millis(3500);

    for trial in 1..=3 {
        proxy.set_mode(ProxyMode::Delay {
            up: delay,
            down: Duration::ZERO,
        });
        let started = Instant::now();
        let acquire = {
            let (lock, k) = (lock.clone(), k.clone());
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(30));
            tokio::spawn(async move { lock.acquire(&k, &opts).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set_mode(ProxyMode::Pass);
        let lease = acquire
            .await
            .unwrap()
            .expect("a live grant on a later attempt");
        let took = started.elapsed();
        if took < delay {
            eprintln!("trial {trial}: the request was not delayed ({took:?}); again");
            lock.release(lease).await.unwrap();
            continue;
        }
        assert!(
            Instant::now() < lease.valid_until(),
            "the lease handed out is live"
        );
        assert!(
            lease.acquired_at() >= started + delay,
            "it comes from an attempt sent after the late reply, not the late grant"
        );
        let holder = observer.inspect(&k).await.unwrap().expect("held");
        assert_eq!(
            (holder.owner, holder.token),
            (lease.owner(), Some(lease.token()))
        );
        lock.release(lease).await.unwrap();
        return;
    }
    panic!("the delay never applied to the acquire request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_against_a_blackholed_server_keeps_to_its_wait() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let proxy = FaultProxy::start(node.addr()).await.unwrap();
    // Step timeouts far above the wait: only the wait may bound the call.
    let lock = RedisLock::connect(&format!(
        "redis://{}?connect_timeout_ms=5000&command_timeout_ms=5000",
        proxy.addr()
    ))
    .await
    .unwrap();
    warm_up(&lock).await;
    proxy.set_mode(ProxyMode::Blackhole);

    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let result = lock
        .acquire(&key("blackholed"), &AcquireOptions::new(TTL).wait(wait))
        .await;
    let took = started.elapsed();
    assert!(
        proxy.stats().bytes_blackholed > 0,
        "the fault fired: requests were dropped"
    );
    // Nobody was seen holding the lock: the server did not answer, so Unavailable (not
    // Timeout, which means "held by another").
    match result {
        Err(LockError::Unavailable { message, .. }) => eprintln!("after {took:?}: {message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(took >= wait, "waited its bound: {took:?}");
    assert!(
        took < Duration::from_millis(1500),
        "kept to its wait of {wait:?}, not the 5 s step timeouts: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_wait_makes_one_attempt_bounded_by_the_request_timeout() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    let proxy = FaultProxy::start(node.addr()).await.unwrap();
    let request_timeout = Duration::from_millis(1500);
    let lock = RedisLock::connect(&format!(
        "redis://{}?command_timeout_ms={}",
        proxy.addr(),
        request_timeout.as_millis()
    ))
    .await
    .unwrap();
    warm_up(&lock).await;
    proxy.set_mode(ProxyMode::Blackhole);

    let started = Instant::now();
    let result = lock
        .acquire(
            &key("zero-wait"),
            &AcquireOptions::new(TTL).wait(Duration::ZERO),
        )
        .await;
    let took = started.elapsed();
    assert!(proxy.stats().bytes_blackholed > 0, "the fault fired");
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(
        took >= request_timeout,
        "the attempt had its full step: {took:?}"
    );
    assert!(took < request_timeout * 4, "and only one attempt: {took:?}");
}

/// A client of `node` as ACL user `user` (password `pw`), created with `rules`.
async fn acl_client(node: &tenure_redis::lab::RedisNode, user: &str, rules: &[&str]) -> RedisLock {
    let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw"];
    setuser.extend(rules);
    let reply = node.command(&setuser).await.unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    RedisLock::connect(&format!("redis://{user}:pw@{}", node.addr()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_subscribe_polls_and_gets_the_lock_after_release() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    // A real ACL user that may run everything but SUBSCRIBE.
    let rules = ["~*", "allchannels", "+@all", "-subscribe"];
    let waiter = acl_client(node, "poller", &rules).await;
    let holder = RedisLock::connect(&node.url()).await.unwrap();
    let k = key("no-subscribe");
    let held = holder
        .try_acquire(&k, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();

    let release = {
        let holder = holder.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            holder.release(held).await.unwrap()
        })
    };
    let wait = Duration::from_secs(10);
    let started = Instant::now();
    let lease = waiter
        .acquire(&k, &AcquireOptions::new(TTL).wait(wait))
        .await
        .expect("polled its way to the lock after the release");
    let took = started.elapsed();
    assert_eq!(release.await.unwrap(), ReleaseOutcome::Released);
    assert!(
        took < Duration::from_secs(5),
        "got it soon after the release, not at the holder's TTL or the wait: {took:?}"
    );
    waiter.release(lease).await.unwrap();
}

/// Every text in a reply, depth first.
fn texts(reply: &Resp) -> Vec<String> {
    match reply {
        Resp::Array(Some(items)) => items.iter().flat_map(texts).collect(),
        other => other.as_text().into_iter().collect(),
    }
}

/// A release the server may not announce (an ACL user without the key's channel) still
/// releases: the lock is free and the answer is `Released`, where the script used to
/// fail on its `PUBLISH` after the `DEL`, so a released lock was reported as an error.
/// A waiter of the same user cannot subscribe either, and polls its way to the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_server_may_not_announce_still_releases() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let node = &cluster.nodes()[0];
    // A real ACL user that may run every command on every key, but use no channel.
    let rules = ["~*", "resetchannels", "+@all"];
    let quiet = acl_client(node, "quiet", &rules).await;
    let observer = RedisLock::connect(&node.url()).await.unwrap();
    let refused = node.command(&["ACL", "LOG", "RESET"]).await.unwrap();
    assert!(refused.is_ok(), "{refused:?}");

    let k = key("unannounced");
    let held = quiet.try_acquire(&k, TTL).await.unwrap().expect("free key");
    assert_eq!(quiet.release(held).await.unwrap(), ReleaseOutcome::Released);
    assert!(
        observer.inspect(&k).await.unwrap().is_none(),
        "the lock is free"
    );
    let log = texts(&node.command(&["ACL", "LOG"]).await.unwrap());
    assert!(
        ["channel", "quiet", "evalsha"]
            .iter()
            .all(|word| log.iter().any(|text| text.contains(word))),
        "the fault fired: the server refused the user's channel ({log:?})"
    );

    // A waiter of that user cannot subscribe either, and polls its way to the lock.
    let waiter = acl_client(node, "quiet", &rules).await;
    let held = quiet.try_acquire(&k, TTL).await.unwrap().expect("free key");
    let release = {
        let quiet = quiet.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            quiet.release(held).await.unwrap()
        })
    };
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(10));
    let started = Instant::now();
    let lease = waiter
        .acquire(&k, &opts)
        .await
        .expect("polled its way to the lock after the release");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "soon after the release, not at the holder's TTL: {:?}",
        started.elapsed()
    );
    assert_eq!(release.await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        waiter.release(lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// An acquire dropped while its script is in flight (granted on the server, the reply
/// held by the proxy) leaves no grant behind: the lock is released in the background,
/// not held by nobody until its TTL. (A semaphore's blocking acquire drops the waits that
/// lost the race this way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_in_flight_leaves_no_grant() {
    let (_cluster, proxy, lock, observer) = behind_a_proxy().await;
    let ttl = Duration::from_secs(30);
    // Long enough that the grant is seen and the call dropped before its reply, on a
    // loaded machine too.
    let delay = Duration::from_secs(3);
    for (i, blocking) in [false, true].into_iter().enumerate() {
        let k = key(&format!("dropped-in-flight-{i}"));
        proxy.set_mode(ProxyMode::Delay {
            up: Duration::ZERO,
            down: delay,
        });
        let started = Instant::now();
        let attempt = {
            let (lock, k) = (lock.clone(), k.clone());
            let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
            tokio::spawn(async move {
                match blocking {
                    true => lock.acquire(&k, &opts).await.map(Some),
                    false => lock.try_acquire(&k, ttl).await,
                }
            })
        };
        granted_within(
            &observer,
            &k,
            delay,
            "the fault fired: the script ran on the server",
        )
        .await;
        attempt.abort();
        assert!(attempt.await.unwrap_err().is_cancelled());
        assert!(
            started.elapsed() < delay,
            "dropped while its reply was held"
        );
        proxy.set_mode(ProxyMode::Pass);
        assert_freed_within_5s(
            &observer,
            &k,
            &format!("blocking={blocking}: the dropped acquire's grant"),
        )
        .await;
    }
}

/// A blocking acquire dropped while it backs off after an unanswered attempt (its script
/// granted on the server, the reply later than the request timeout) leaves no grant: the
/// possible grant of its owner id is released in the background, not held by nobody until
/// its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_after_an_unanswered_attempt_leaves_no_grant() {
    let (_cluster, proxy, _patient, observer) = behind_a_proxy().await;
    let lock = RedisLock::connect(&format!("redis://{}?command_timeout_ms=200", proxy.addr()))
        .await
        .unwrap();
    warm_up(&lock).await;
    let k = key("dropped-after-timeout");
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: Duration::from_millis(600),
    });
    let backoff = tenure_api::Backoff {
        initial: Duration::from_secs(2),
        max: Duration::from_secs(2),
        jitter: 0.0,
    };
    let opts = AcquireOptions::new(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .backoff(backoff);
    let spawned = Instant::now();
    let attempt = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.acquire(&k, &opts).await })
    };
    // The first attempt times out at 200 ms; the acquire then backs off for 2 s.
    let what = "the fault fired: the script ran, its reply came too late";
    granted_within(&observer, &k, Duration::from_secs(2), what).await;
    tokio::time::sleep_until((spawned + Duration::from_millis(600)).into()).await;
    assert!(
        spawned.elapsed() < Duration::from_secs(2),
        "dropped within the backoff after the first attempt"
    );
    assert!(!attempt.is_finished(), "still waiting, backing off");
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    proxy.set_mode(ProxyMode::Pass);
    assert_freed_within_5s(&observer, &k, "the dropped acquire's possible grant").await;
}

/// Waits until `observer` sees `k` held; fails with `what` if it is not within `limit`.
async fn granted_within(observer: &RedisLock, k: &LockKey, limit: Duration, what: &str) {
    let started = Instant::now();
    while observer.inspect(k).await.unwrap().is_none() {
        assert!(started.elapsed() < limit, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `observer` sees `k` free; fails if `what` is still held after 5 s.
async fn assert_freed_within_5s(observer: &RedisLock, k: &LockKey, what: &str) {
    let started = Instant::now();
    while observer.inspect(k).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what} is still held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
