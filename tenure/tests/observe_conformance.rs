//! The whole conformance suite through `Metered(Traced(…))`: over `MemoryLock`, then over
//! a live redis-server, one suite run after the other in this process, with a tracing
//! subscriber and a metrics recorder installed so both layers do their real work.
//! After each run, no `tenure_held` series may be negative (a double decrement).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tenure::observe::{Metered, Traced};
use tenure::{async_trait, DistributedLock, LockError};
use tenure_conformance::{runner, CuttableClient, Harness, MemoryHarness, UrlHarness};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tracing_subscriber::layer::SubscriberExt;

/// Any harness, with every client wrapped in the observability layers.
#[derive(Debug)]
struct Observed<H>(H);

fn wrap(lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
    Arc::new(Metered::new(Arc::new(Traced::new(lock))))
}

#[async_trait]
impl<H: Harness> Harness for Observed<H> {
    fn name(&self) -> String {
        format!("observed {}", self.0.name())
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        Ok(wrap(self.0.client().await?))
    }

    fn can_cut_links(&self) -> bool {
        self.0.can_cut_links()
    }

    async fn cuttable_client(&self) -> Result<Option<CuttableClient>, LockError> {
        Ok(self.0.cuttable_client().await?.map(|c| CuttableClient {
            lock: wrap(c.lock),
            link: c.link,
        }))
    }

    fn short_ttl(&self) -> Duration {
        self.0.short_ttl()
    }
}

/// Sums the recorder's deltas (its snapshots swap values to zero) into `totals`; returns
/// the `tenure_held` series now below zero and the acquisitions counted in this delta.
fn check(snapshotter: &Snapshotter, totals: &mut HashMap<String, f64>) -> (Vec<String>, u64) {
    let mut acquired = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key().clone();
        match (key.name(), value) {
            ("tenure_held", DebugValue::Gauge(v)) => {
                *totals.entry(format!("{key:?}")).or_default() += v.into_inner();
            }
            ("tenure_acquire_total", DebugValue::Counter(n))
                if key.labels().any(|l| l.value() == "acquired") =>
            {
                acquired += n;
            }
            _ => {}
        }
    }
    let negative = totals
        .iter()
        .filter(|(_, v)| **v < 0.0)
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    (negative, acquired)
}

fn main() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder");
    // Spans are enabled (INFO) and formatted, into a sink.
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
        .with(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let memory = runner::run_suite(|| async { Ok(Observed(MemoryHarness::new())) });
    let mut held = HashMap::new();
    let memory_check = check(&snapshotter, &mut held);
    let redis = runner::run_suite(|| async {
        let cluster = RedisCluster::start(RedisOptions::default()).await?;
        let targets = cluster.nodes().iter().map(|n| n.addr()).collect();
        Ok(Observed(
            UrlHarness::new("redis", "redis://{hosts}", targets, |url| async move {
                tenure::redis::RedisLock::connect(&url).await
            })
            .cut_query("command_timeout_ms=300")
            .owning(cluster),
        ))
    });
    let redis_check = check(&snapshotter, &mut held);

    let mut failed = memory.has_failed() || redis.has_failed();
    for (name, (negative, acquired), conclusion) in [
        ("memory", memory_check, &memory),
        ("redis", redis_check, &redis),
    ] {
        if !negative.is_empty() {
            eprintln!("{name}: tenure_held went negative: {negative:?}");
            failed = true;
        }
        // Nothing ran (e.g. a name filter, or servers that did not start) → nothing counted.
        if conclusion.num_passed > 0 && acquired == 0 {
            eprintln!("{name}: the suite passed but no acquisition was metered");
            failed = true;
        }
    }
    std::process::exit(i32::from(failed) * 101);
}
