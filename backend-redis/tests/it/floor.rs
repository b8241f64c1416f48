//! The same-work floor of `tenure bench` sends what tenure sends: the server counts the
//! same commands (the scripts and the calls inside them) for a cycle of each, in both fence
//! modes — and the protocol floor, which does less, counts other ones.

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_api::{DistributedLock, LockKey, ReleaseOutcome};
use tenure_conformance::testbed::Locker;
use tenure_redis::floor::{RedisFloor, Work};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redis::{FenceMode, RedisConfig, RedisLock};

const TTL: Duration = Duration::from_secs(10);
const CYCLES: u64 = 20;

/// The server's command counts (`INFO commandstats`) since the last reset, without the
/// `INFO` and `CONFIG` of the observer itself.
async fn commands(observer: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(observer)
        .await
        .unwrap();
    let counts = info.lines().filter_map(|line| {
        let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
        Some((name.to_owned(), calls.parse().ok()?))
    });
    counts
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

async fn reset(observer: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(observer)
        .await
        .unwrap();
}

/// The commands `CYCLES` cycles of `cycle` cost the server, after one cycle of warm-up
/// (script loading, connection set-up).
async fn cost<F, Fut>(
    observer: &mut redis::aio::MultiplexedConnection,
    cycle: F,
) -> BTreeMap<String, u64>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    cycle(u64::MAX).await;
    reset(observer).await;
    for n in 0..CYCLES {
        cycle(n).await;
    }
    commands(observer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_work_floor_costs_the_server_what_tenure_costs() {
    let cluster = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = cluster.urls()[0].clone();
    let mut observer = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for fence in [FenceMode::ClockFloored, FenceMode::Counter, FenceMode::None] {
        // A prefix, as the key names must agree; patient, as the machine may be loaded.
        let url = format!(
            "{url}?fence={}&prefix=bench:&request_timeout_ms=5000",
            fence.as_str()
        );
        let lock = RedisLock::connect(&url).await.unwrap();
        let ours = cost(&mut observer, |n| {
            let lock = &lock;
            async move {
                let key = LockKey::new(format!("tenure/{fence:?}/{n}")).unwrap();
                let lease = lock.try_acquire(&key, TTL).await.unwrap().expect("fresh");
                let released = lock.release(lease).await.unwrap();
                assert_eq!(released, ReleaseOutcome::Released);
            }
        })
        .await;
        let floor_of = |work| {
            let config = RedisConfig::from_url(&url).unwrap();
            RedisFloor::connect(vec![config], TTL, work)
        };
        let same_work = floor_of(Work::SameWork {
            fence,
            proposal_window: None,
        })
        .await
        .unwrap();
        let protocol = floor_of(Work::Protocol).await.unwrap();
        for (floor, what) in [(&same_work, "same-work"), (&protocol, "protocol")] {
            let theirs = cost(&mut observer, |n| async move {
                let key = format!("{what}/{fence:?}/{n}");
                floor.cycle(&key, &|| ()).await.unwrap();
            })
            .await;
            match what {
                "same-work" => assert_eq!(theirs, ours, "{fence:?}: the floor's, then tenure's"),
                _ => assert_ne!(theirs, ours, "{fence:?}: the protocol floor does less"),
            }
        }
        // A script per acquire and release; fence=none takes a free lock by `SET NX PX`.
        let scripts = if fence == FenceMode::None {
            CYCLES
        } else {
            2 * CYCLES
        };
        assert_eq!(ours.get("evalsha"), Some(&scripts), "{fence:?}: {ours:?}");
    }
}
