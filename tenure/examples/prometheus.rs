//! Prometheus metrics from a [`Metered`] lock: installs the Prometheus recorder (with
//! histogram buckets for the lock wait, so `histogram_quantile` works), does a few
//! acquisitions — one granted, one busy, one timing out, one lost — and prints what a
//! scrape would return.
//!
//! `cargo run -p tenure --example prometheus` (or `TENURE_URL=redis://… cargo run …` for a
//! real backend; the metrics come from the layer, whatever the backend). A service would
//! instead call `PrometheusBuilder::new().with_http_listener(addr).install()` and let
//! Prometheus scrape it, or set `metrics = true` in its tenure config.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tenure::observe::{names, Metered};
use tenure::{AcquireOptions, DistributedLock, LockKey};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let scrape = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(names::ACQUIRE_WAIT_SECONDS.into()),
            &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
        )?
        .install_recorder()?;

    let url = std::env::var("TENURE_URL").unwrap_or_else(|_| "memory://".into());
    let lock = Metered::new(tenure::connect(&url).await?);
    let key = LockKey::new("billing/invoice-run")?;
    let ttl = Duration::from_secs(1);

    let mut lease = lock.acquire(&key, &AcquireOptions::new(ttl)).await?;
    assert!(lock.try_acquire(&key, ttl).await?.is_none(), "busy");
    let waited = AcquireOptions::new(ttl).wait(Duration::from_millis(200));
    assert!(lock.acquire(&key, &waited).await.is_err(), "timeout");
    lock.extend(&mut lease, ttl).await?;
    // Let the lease run out: the next extend finds it lost.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(lock.extend(&mut lease, ttl).await.is_err(), "lost");
    lock.release(lease).await?;

    print!("{}", scrape.render());
    Ok(())
}
