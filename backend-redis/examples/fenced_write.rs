//! A fenced write against a small store: two clients, one lock on a live redis-server
//! (started for the example), and a store that rejects writes carrying a stale token.
//!
//! Run with `cargo run -p tenure-redis --example fenced_write`
//! (or point it at your own server: `REDIS_URL=redis://127.0.0.1:6379 cargo run …`).

use std::time::Duration;

use tenure_api::{DistributedLock, LockKey};
use tenure_conformance::FencedRegister;
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redis::RedisLock;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let cluster = RedisCluster::start(RedisOptions::default()).await?;
            let url = cluster.urls()[0].clone();
            (Some(cluster), url)
        }
    };
    let (a, b) = (
        RedisLock::connect(&url).await?,
        RedisLock::connect(&url).await?,
    );
    let key = LockKey::new("example/fenced-write")?;
    let store = FencedRegister::new();
    let ttl = Duration::from_millis(300);

    let stale = a
        .try_acquire(&key, ttl)
        .await?
        .ok_or("the key starts free")?;
    println!("A holds the lock with token {}", stale.token());
    let a_saw = store.read(stale.token())?;
    println!("A read {a_saw} ... and stalls (a GC pause) past its {ttl:?} TTL");
    tokio::time::sleep(ttl * 2).await;

    let fresh = b.try_acquire(&key, ttl).await?.ok_or("expired, so free")?;
    println!("B acquired the expired lock with token {}", fresh.token());
    let b_saw = store.read(fresh.token())?;
    store.write(fresh.token(), b_saw + 1)?;
    println!("B wrote {}", b_saw + 1);

    match store.write(stale.token(), a_saw + 100) {
        Ok(()) => println!("A's late write was accepted: fencing failed!"),
        Err(rejected) => println!("A wakes up and writes: {rejected}"),
    }
    b.release(fresh).await?;
    println!(
        "store value {} ({} rejected)",
        store.value(),
        store.rejected()
    );
    Ok(())
}
