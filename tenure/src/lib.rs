//! # tenure
//!
//! Distributed locks that tell the truth: one [`DistributedLock`] trait with a fencing
//! token on every grant, backends chosen by URL (so swapping Redlock for etcd is a
//! configuration change). The `tenure` command (run a job under a lock, `bench`,
//! `matrix`) is the separate `tenure-cli` crate: `cargo install --path cli`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure::LockError> {
//! use std::time::Duration;
//! use tenure::{AcquireOptions, LockExt, LockKey};
//!
//! let lock = tenure::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
//! let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
//! let guard = lock.lock(&LockKey::new("nightly-report")?, &opts).await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! | scheme | backend | cargo feature |
//! |---|---|---|
//! | `memory://` | in-process [`MemoryLock`] | always |
//! | `redis://`, `rediss://` | single Redis node | `redis` |
//! | `redlock://h1:p,h2:p,h3:p`, `redlocks://…` | Redlock | `redlock` |
//! | `etcd://h1:p,h2:p/prefix`, `etcds://…` | etcd v3 | `etcd` |
//! | `zk://h1:p,h2:p/chroot` | ZooKeeper | `zk` |
//! | `postgres://user@host/db`, `postgresql://…` | Postgres row lock | `postgres` |
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod admin;
mod config;
pub mod layers;
pub mod observe;

use std::sync::Arc;

pub use config::Config;
pub use tenure_api::urls::redact_url;
pub use tenure_api::*;

/// The etcd backend.
#[cfg(feature = "etcd")]
pub use tenure_etcd as etcd;
/// The Postgres backend.
#[cfg(feature = "postgres")]
pub use tenure_postgres as postgres;
/// The single-node Redis backend.
#[cfg(feature = "redis")]
pub use tenure_redis as redis;
/// The Redlock backend.
#[cfg(feature = "redlock")]
pub use tenure_redlock as redlock;
/// The ZooKeeper backend.
#[cfg(feature = "zk")]
pub use tenure_zk as zk;

/// The backends this build can connect to (`memory` and each enabled feature).
pub const BACKENDS: &[&str] = &[
    "memory",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "redlock")]
    "redlock",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "zk")]
    "zk",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// The backend a URL scheme names (`rediss` → `redis`), or `None` for an unknown scheme.
pub fn backend_of_scheme(scheme: &str) -> Option<&'static str> {
    Some(match scheme {
        "memory" => "memory",
        "redis" | "rediss" => "redis",
        "redlock" | "redlocks" => "redlock",
        "etcd" | "etcds" => "etcd",
        "zk" => "zk",
        "postgres" | "postgresql" => "postgres",
        _ => return None,
    })
}

/// Connects the backend `$feature` with `$connect(url)` as an `Arc<$target>` when the
/// feature is on; otherwise an error naming the feature.
macro_rules! connect_with {
    ($feature:literal, $connect:path, $url:expr, $target:ty) => {{
        #[cfg(feature = $feature)]
        let result = $connect($url)
            .await
            .map(|lock| ::std::sync::Arc::new(lock) as ::std::sync::Arc<$target>);
        #[cfg(not(feature = $feature))]
        let result = Err($crate::LockError::Config(format!(
            "{} needs tenure's `{}` cargo feature, which this build does not have",
            $crate::redact_url($url),
            $feature
        )));
        result
    }};
}
pub(crate) use connect_with;

/// Connects the backend named by the scheme of `$url` (a `&str`) as an `Arc<$target>`:
/// the one dispatch behind [`connect`] and [`admin::connect_admin`].
macro_rules! connect_by_scheme {
    ($url:expr, $target:ty) => {{
        let url: &str = $url;
        match url
            .split_once("://")
            .map(|(scheme, _)| (scheme, $crate::backend_of_scheme(scheme)))
        {
            None => Err($crate::LockError::Config(format!(
                "lock URL {} has no scheme (memory://, redis://, redlock://, etcd://, zk://, \
                 postgres://)",
                $crate::redact_url(url)
            ))),
            Some((_, Some("memory"))) => {
                Ok(::std::sync::Arc::new($crate::MemoryLock::new()) as ::std::sync::Arc<$target>)
            }
            Some((_, Some("redis"))) => {
                $crate::connect_with!("redis", tenure_redis::RedisLock::connect, url, $target)
            }
            Some((_, Some("redlock"))) => {
                $crate::connect_with!("redlock", tenure_redlock::Redlock::connect, url, $target)
            }
            Some((_, Some("etcd"))) => {
                $crate::connect_with!("etcd", tenure_etcd::EtcdLock::connect, url, $target)
            }
            Some((_, Some("zk"))) => {
                $crate::connect_with!("zk", tenure_zk::ZkLock::connect, url, $target)
            }
            Some((_, Some("postgres"))) => {
                $crate::connect_with!("postgres", tenure_postgres::PgLock::connect, url, $target)
            }
            Some((scheme, _)) => Err($crate::LockError::Config(format!(
                "unknown lock URL scheme {}:// in {}",
                $crate::redact_url(scheme),
                $crate::redact_url(url)
            ))),
        }
    }};
}
pub(crate) use connect_by_scheme;

/// Connects to the backend named by `url`'s scheme (see the table above). A scheme whose
/// cargo feature is off is a [`LockError::Config`] naming the feature.
///
/// # Cancel safety
/// Cancel-safe: a half-made client is dropped.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
    connect_by_scheme!(url, dyn DistributedLock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_are_checked() {
        let err = connect("bogus://h").await.unwrap_err();
        assert!(err.to_string().contains("unknown lock URL scheme"), "{err}");
        let err = connect("no-scheme").await.unwrap_err();
        assert!(matches!(err, LockError::Config(_)));
        let memory = connect("memory://").await.unwrap();
        assert_eq!(memory.capabilities().backend, "memory");
        for scheme in [
            "redis", "rediss", "redlock", "etcd", "etcds", "zk", "postgres",
        ] {
            let backend = backend_of_scheme(scheme).unwrap();
            assert!(scheme.starts_with(&backend[..2]), "{scheme} -> {backend}");
        }
    }

    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_disabled_backend_names_its_feature() {
        for (url, feature) in [
            ("redis://u:hunter2@h", "redis"),
            ("redlock://u:hunter2@a,b,c", "redlock"),
            ("etcd://u:hunter2@h/p", "etcd"),
            ("zk://h/app", "zk"),
            ("postgres://u:hunter2@h/db", "postgres"),
        ] {
            let err = connect(url).await.unwrap_err().to_string();
            assert!(err.contains(&format!("`{feature}` cargo feature")), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        assert_eq!(BACKENDS, ["memory"]);
    }
}
