//! Acquire latency of Redlock on 1 vs 5 local masters (parallel fan-out keeps 5 close
//! to 1), with and without the fence round. Starts its own redis-servers.
//!
//! Run with `cargo run --release -p tenure-redlock --example latency`.

use std::time::{Duration, Instant};

use tenure_api::{DistributedLock, LockKey};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redlock::Redlock;

async fn p50_us(
    lock: &Redlock,
    rounds: usize,
) -> Result<u128, Box<dyn std::error::Error + Send + Sync>> {
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let key = LockKey::new(format!("latency/{i}"))?;
        let started = Instant::now();
        let lease = lock
            .try_acquire(&key, Duration::from_secs(10))
            .await?
            .ok_or("fresh keys are free")?;
        samples.push(started.elapsed().as_micros());
        lock.release(lease).await?;
    }
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cluster = RedisCluster::start(RedisOptions::default().nodes(5)).await?;
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    for (label, url) in [
        ("1 node, fencing", format!("redlock://{}", hosts[0])),
        ("5 nodes, fencing", format!("redlock://{}", hosts.join(","))),
        (
            "1 node, no fence round",
            format!("redlock://{}?fencing=false", hosts[0]),
        ),
        (
            "5 nodes, no fence round",
            format!("redlock://{}?fencing=false", hosts.join(",")),
        ),
    ] {
        let lock = Redlock::connect(&url).await?;
        p50_us(&lock, 100).await?; // warm-up
        println!("{label:>24}: acquire p50 {} µs", p50_us(&lock, 1000).await?);
    }
    Ok(())
}
