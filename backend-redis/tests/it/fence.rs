//! The fence counter's key on a real server: exact tokens at any size (issue 15,
//! defect 5) and a bounded lifetime in clock-floored mode (defect 12).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure_api::{DistributedLock, LockKey};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redis::scripts::{count_of, token_for};
use tenure_redis::{Proposal, RedisLock};

const TTL: Duration = Duration::from_secs(10);
/// The bound given a building block's request (the request timeout's default).
const LIMIT: Duration = Duration::from_secs(1);

/// A plain client connection to the server, for setting up and reading raw keys.
pub(crate) async fn plain(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub(crate) async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_fence_above_2_pow_52_stays_exact_and_readable() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let lock = RedisLock::connect(&format!("{url}?fence=counter"))
        .await
        .unwrap();
    let k = LockKey::new("fence/big").unwrap();
    let lock_key = lock.lock_key(&k);
    let fence_key = format!("{lock_key}:fence");
    let mut conn = plain(&url).await;
    const BASE: u64 = 1 << 52;
    let _: () = query(&mut conn, &["SET", &fence_key, &BASE.to_string()]).await;

    for expected in [BASE + 1, BASE + 2] {
        let lease = lock.try_acquire(&k, TTL).await.unwrap().unwrap();
        let stored: String = query(&mut conn, &["GET", &lock_key]).await;
        assert_eq!(
            stored,
            format!("{}:{expected}", lease.owner()),
            "the lock value carries the exact token"
        );
        assert_eq!(count_of(lease.token()), expected, "exact token");
        assert_eq!(lease.token(), token_for(expected, lease.owner()).unwrap());
        let holder = lock.inspect(&k).await.unwrap().expect("held");
        assert_eq!(
            holder.token,
            Some(lease.token()),
            "inspect parses the value"
        );
        lock.release(lease).await.unwrap();
    }
    let counter: String = query(&mut conn, &["GET", &fence_key]).await;
    assert_eq!(counter, (BASE + 2).to_string());

    // Beyond 2^53 a Lua double cannot hold the token exactly: refused, never rounded.
    let last = (1u64 << 53) - 1;
    let _: () = query(&mut conn, &["SET", &fence_key, &last.to_string()]).await;
    let err = lock.try_acquire(&k, TTL).await.unwrap_err();
    assert!(
        matches!(err, tenure_api::LockError::Backend { .. }),
        "refused: {err}"
    );
    assert!(lock.inspect(&k).await.unwrap().is_none(), "nothing granted");
}

/// The fence key's PTTL in ms (`-1`: no expiry, `-2`: no key).
async fn fence_pttl(conn: &mut MultiplexedConnection, lock: &RedisLock, k: &LockKey) -> i64 {
    let fence_key = format!("{}:fence", lock.lock_key(k));
    query(conn, &["PTTL", &fence_key]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_fence_key_expires_after_its_lock_and_a_plain_counter_persists() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let clock = RedisLock::connect(&url).await.unwrap();
    let counter = RedisLock::connect(&format!("{url}?fence=counter"))
        .await
        .unwrap();
    let mut conn = plain(&url).await;
    let ttl_ms = TTL.as_millis() as i64;
    let day_ms = 24 * 3600 * 1000;

    // Clock-floored (the default): the fence key expires, well after the lock.
    let k = LockKey::new("fence/clock").unwrap();
    let mut lease = clock.try_acquire(&k, TTL).await.unwrap().unwrap();
    let pttl = fence_pttl(&mut conn, &clock, &k).await;
    assert!(
        pttl > ttl_ms && pttl > day_ms - 60_000 && pttl <= day_ms,
        "clock fence key expires after about a day, and after the lock: PTTL {pttl}"
    );

    // An extension keeps the fence key alive at least as long as the lock.
    let fence_key = format!("{}:fence", clock.lock_key(&k));
    let _: i64 = query(&mut conn, &["PEXPIRE", &fence_key, "1000"]).await;
    clock.extend(&mut lease, TTL).await.unwrap();
    let pttl = fence_pttl(&mut conn, &clock, &k).await;
    assert!(
        pttl > ttl_ms,
        "extend refreshed the fence expiry: PTTL {pttl}"
    );

    // Redlock's write round keeps an expiry in clock mode, on an existing fence key…
    let raised = token_for(count_of(lease.token()) + 1000, lease.owner()).unwrap();
    assert!(clock
        .raise_fence(&k, lease.owner(), raised, LIMIT)
        .await
        .unwrap());
    let pttl = fence_pttl(&mut conn, &clock, &k).await;
    assert!(pttl > ttl_ms, "raise_fence kept an expiry: PTTL {pttl}");
    let value: String = query(&mut conn, &["GET", &fence_key]).await;
    assert_eq!(value, count_of(raised).to_string());
    // …and on a node that had no fence key for it yet.
    let fresh = LockKey::new("fence/raised-only").unwrap();
    let owner = tenure_api::OwnerId::random();
    assert!(!clock
        .raise_fence(&fresh, owner, raised, LIMIT)
        .await
        .unwrap());
    let pttl = fence_pttl(&mut conn, &clock, &fresh).await;
    assert!(
        pttl > day_ms - 60_000,
        "raise_fence set an expiry: PTTL {pttl}"
    );
    clock.release(lease).await.unwrap();

    // A plain counter must never expire (that would regress tokens): it persists, even
    // on a key that was used in clock mode before.
    for name in ["fence/counter", "fence/clock"] {
        let k = LockKey::new(name).unwrap();
        let lease = counter.try_acquire(&k, TTL).await.unwrap().unwrap();
        assert_eq!(
            fence_pttl(&mut conn, &counter, &k).await,
            -1,
            "{name}: the counter has no expiry"
        );
        let owner = lease.owner();
        let next = token_for(count_of(lease.token()) + 5, lease.owner()).unwrap();
        assert!(counter.raise_fence(&k, owner, next, LIMIT).await.unwrap());
        assert_eq!(fence_pttl(&mut conn, &counter, &k).await, -1, "{name}");
        counter.release(lease).await.unwrap();
    }
}

/// The acquire script's `none` mode (no fence counter) stores the count its caller sends
/// (a client's clock); called the earlier way, without one, it still grants, with the
/// server's time in µs as the count. Nothing is written but the lock key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unfenced_acquire_script_takes_the_callers_count_or_the_servers_clock() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let mut conn = plain(&cluster.urls()[0]).await;
    let owner = "0123456789abcdef0123456789abcdef";
    let acquire = |key: &'static str, extra: &'static [&'static str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(tenure_redis::scripts::ACQUIRE)
            .arg(1)
            .arg(key)
            .arg(owner)
            .arg(10_000)
            .arg("none")
            .arg(extra);
        cmd
    };
    let sent: (i64, i64, i64) = acquire("given", &["", "1234"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(sent, (1, 1234, 0), "the caller's count");
    let stored: String = query(&mut conn, &["GET", "given"]).await;
    assert_eq!(stored, format!("{owner}:1234"));

    let server_time: Vec<i64> = query(&mut conn, &["TIME"]).await;
    let now_us = server_time[0] * 1_000_000 + server_time[1];
    let (granted, count, _): (i64, i64, i64) = acquire("clocked", &[])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(granted, 1);
    assert!(
        (now_us..now_us + 10_000_000).contains(&count),
        "count {count}: not the server's clock ({now_us} µs)"
    );
    let keys: i64 = query(&mut conn, &["DBSIZE"]).await;
    assert_eq!(keys, 2, "the two lock keys and no fence key");
}

/// Issue 19: a proposed count (Redlock proposes one to every node of a round) is taken in
/// clock mode when it is at least the counter's next value, not ahead of the server's
/// clock, and behind it by at most the window given (capped at a second); otherwise the
/// server counts as without it. A plain counter ignores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposed_count_is_taken_only_within_the_counters_bounds() {
    use tenure_redis::scripts::PROPOSAL_WINDOW_MAX;
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let lock = RedisLock::connect(&url).await.unwrap();
    let mut conn = plain(&url).await;
    let server_us = |time: Vec<u64>| time[0] * 1_000_000 + time[1];
    let k = LockKey::new("fence/proposed").unwrap();
    let fence_key = format!("{}:fence", lock.lock_key(&k));
    let count = |grant: tenure_redis::Grant| match grant {
        tenure_redis::Grant::Granted(token) => count_of(token),
        held => panic!("free key, got {held:?}"),
    };
    // One grant proposing `proposed` with `window`, released at once: its count.
    let cycle = |proposed: u64, window: Duration| {
        let (lock, k) = (&lock, &k);
        async move {
            let owner = tenure_api::OwnerId::random();
            let granted = lock.grant_proposing(
                k,
                owner,
                TTL,
                None,
                Proposal {
                    count: proposed,
                    window,
                },
                LIMIT,
            );
            let counted = count(granted.await.unwrap());
            assert!(lock.release_owner(k, owner, LIMIT).await.unwrap());
            counted
        }
    };
    let window = Duration::from_millis(800);

    // Behind the clock, within the window: taken, and stored as the fence.
    let before: u64 = server_us(query(&mut conn, &["TIME"]).await);
    let proposed = before - 500_000;
    assert_eq!(cycle(proposed, window).await, proposed);
    let fence: u64 = query(&mut conn, &["GET", &fence_key]).await;
    assert_eq!(fence, proposed, "the fence key holds the proposed count");

    // Not above the counter: the server's own count (its clock).
    let own = cycle(proposed, window).await;
    assert!(own >= before, "the clock floor, not {proposed}: {own}");
    // Ahead of the server's clock, or behind it by more than the window: its own count.
    let now: u64 = server_us(query(&mut conn, &["TIME"]).await);
    let ahead = now + 200_000;
    let counted = cycle(ahead, window).await;
    assert!(
        (now..ahead).contains(&counted),
        "{counted}: not ahead of the clock"
    );
    let now: u64 = server_us(query(&mut conn, &["TIME"]).await);
    let behind = now - 900_000;
    let counted = cycle(behind, window).await;
    assert!(
        counted >= now,
        "{counted}: 0.9 s behind is outside a 0.8 s window"
    );
    // A window wider than the cap is capped.
    let now: u64 = server_us(query(&mut conn, &["TIME"]).await);
    let behind = now - PROPOSAL_WINDOW_MAX.as_micros() as u64 - 200_000;
    let counted = cycle(behind, Duration::from_secs(5)).await;
    assert!(counted >= now, "{counted}: outside the capped window");
    // A plain counter never takes a clock value.
    let counter = RedisLock::connect(&format!("{url}?fence=counter"))
        .await
        .unwrap();
    let plain_key = LockKey::new("fence/proposed-counter").unwrap();
    let granted = counter
        .grant_proposing(
            &plain_key,
            tenure_api::OwnerId::random(),
            TTL,
            None,
            Proposal { count: now, window },
            LIMIT,
        )
        .await
        .unwrap();
    assert_eq!(count(granted), 1, "INCR of an absent counter");
}

/// `fence=none` (issue 60): a grant is one `SET NX PX` of the owner-tagged value, no fence
/// key is ever written (not by the grant, the extension or the release), and the client
/// says its tokens are not fences, so an election refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_fence_no_fence_key_is_written_and_tokens_are_not_fences() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let lock = RedisLock::connect(&format!("{url}?fence=none"))
        .await
        .unwrap();
    assert_eq!(lock.capabilities().fencing, tenure_api::FencingKind::None);
    let election = tenure_api::Election::new(std::sync::Arc::new(lock.clone()));
    assert!(
        matches!(&election, Err(tenure_api::LockError::Config(m)) if m.contains("fence=none")),
        "{election:?}"
    );
    let k = LockKey::new("fence/none").unwrap();
    let lock_key = lock.lock_key(&k);
    let mut conn = plain(&url).await;
    let mut lease = lock.try_acquire(&k, TTL).await.unwrap().expect("free");
    let stored: String = query(&mut conn, &["GET", &lock_key]).await;
    assert_eq!(
        stored,
        format!("{}:{}", lease.owner(), count_of(lease.token()))
    );
    assert!(lock.try_acquire(&k, TTL).await.unwrap().is_none(), "held");
    let raised = lock
        .raise_fence(&k, lease.owner(), lease.token(), LIMIT)
        .await;
    assert!(
        matches!(&raised, Err(tenure_api::LockError::Config(m)) if m.contains("fence=none")),
        "no counter to raise: {raised:?}"
    );
    lock.extend(&mut lease, TTL * 2).await.unwrap();
    let pttl: i64 = query(&mut conn, &["PTTL", &lock_key]).await;
    assert!(pttl > TTL.as_millis() as i64, "extended: {pttl}");
    lock.release(lease).await.unwrap();
    let keys: Vec<String> = query(&mut conn, &["KEYS", "*"]).await;
    assert!(keys.is_empty(), "no lock and no fence key left: {keys:?}");
}
