//! A clusters file for `tenure matrix --clusters` that files a Redis server the test
//! starts under a backend name. Shared by `exit.rs` and `soak.rs`.

use std::path::{Path, PathBuf};

use tenure_redis::lab::{RedisCluster, RedisOptions};

/// Starts a Redis server and writes `dir/clusters.toml` naming it as `backend`; the
/// server runs as long as the returned handle lives.
pub(crate) async fn redis_as(backend: &str, dir: &Path) -> (RedisCluster, PathBuf) {
    let redis = RedisCluster::start(RedisOptions::default())
        .await
        .expect("redis starts");
    let clusters = dir.join("clusters.toml");
    std::fs::write(
        &clusters,
        format!("[backends]\n{backend} = \"{}\"\n", redis.urls()[0]),
    )
    .unwrap();
    (redis, clusters)
}
