//! The fence counter's key on a real server: exact tokens at any size (issue 15,
//! defect 5) and a bounded lifetime in clock-floored mode (defect 12).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure_api::{DistributedLock, LockKey};
use tenure_conformance::servers::redis::{RedisCluster, RedisOptions};
use tenure_redis::RedisLock;

const TTL: Duration = Duration::from_secs(10);

/// A plain client connection to the server, for setting up and reading raw keys.
async fn plain(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn query<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, args: &[&str]) -> T {
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
        assert_eq!(lease.token().get(), expected, "exact token");
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
