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
//! | `redis+sentinel://s1:p,s2:p/name`, `rediss+sentinel://…` | Sentinel-managed Redis primary | `redis` |
//! | `redis+cluster://h1:p,h2:p`, `rediss+cluster://…` | Redis Cluster | `redis` |
//! | `redlock://h1:p,h2:p,h3:p`, `redlocks://…` | Redlock | `redlock` |
//! | `etcd://h1:p,h2:p/prefix`, `etcds://…` | etcd v3 | `etcd` |
//! | `zk://h1:p,h2:p/chroot`, `zks://…` | ZooKeeper | `zk` |
//! | `postgres://user@host/db`, `postgresql://…` | Postgres row lock | `postgres` |
//! | `file:///var/lock/tenure` | one host's processes, no server: a file lock per key | `file` |

pub mod admin;
mod config;
pub mod layers;
pub mod observe;

use std::sync::Arc;

pub use config::Config;
pub use tenure_api::urls::redact_url;
// The contract and the types a user names, listed (not a glob): what this crate promises.
/// The implementer's kit, for writing a backend of your own ([`tenure_api::backend`]).
pub use tenure_api::backend;
/// The one URL decoder every backend reads its options with.
pub use tenure_api::urls;
pub use tenure_api::{
    async_trait, renewal_interval, validate_label, validate_ttl, AcquireOptions, Backoff, BoxError,
    Capabilities, Clock, DistributedLock, Election, ExpiryKind, Fairness, FencingKind,
    FencingToken, Finding, HolderFeed, HolderInfo, Leader, Leadership, Lease, LeaseDropped,
    LeaseHandle, LockAdmin, LockError, LockExt, LockGuard, LockKey, LostSignal, ManualClock,
    MemoryLock, MultiGuard, MultiLock, OwnerId, Problem, ReleaseOutcome, Replication, RwGuard,
    RwLock, Semaphore, SystemClock, WaitKind, WithLockError, MAX_LABEL, MAX_TTL, MIN_TTL,
    SUSPEND_CHECK,
};

use tenure_api::backend::Driver;

/// The etcd backend.
#[cfg(feature = "etcd")]
pub use tenure_etcd as etcd;
/// The file backend (one host, no server).
#[cfg(feature = "file")]
pub use tenure_file as file;
/// The MySQL and MariaDB backend.
#[cfg(feature = "mysql")]
pub use tenure_mysql as mysql;
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

/// The backends this build can connect to: `memory` and each enabled feature's, in that
/// order. [`connect`], [`admin::connect_admin`] and [`Config`] dispatch on this table.
pub const DRIVERS: &[Driver] = &[
    MemoryLock::DRIVER,
    #[cfg(feature = "redis")]
    tenure_redis::RedisLock::DRIVER,
    #[cfg(feature = "redlock")]
    tenure_redlock::Redlock::DRIVER,
    #[cfg(feature = "etcd")]
    tenure_etcd::EtcdLock::DRIVER,
    #[cfg(feature = "zk")]
    tenure_zk::ZkLock::DRIVER,
    #[cfg(feature = "postgres")]
    tenure_postgres::PgLock::DRIVER,
    #[cfg(feature = "mysql")]
    tenure_mysql::MySqlLock::DRIVER,
    #[cfg(feature = "file")]
    tenure_file::FileLock::DRIVER,
];

/// Each backend's cargo feature and schemes, known also to builds without it, so that a
/// URL for a disabled backend is an error naming the feature to enable.
const FEATURES: [(&str, &[&str]); 7] = [
    (
        "redis",
        &[
            "redis",
            "rediss",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
    ),
    ("redlock", &["redlock", "redlocks"]),
    ("etcd", &["etcd", "etcds"]),
    ("zk", &["zk", "zks"]),
    ("postgres", &["postgres", "postgresql"]),
    ("mysql", &["mysql", "mariadb"]),
    ("file", &["file"]),
];

/// The driver of `url`'s scheme. A URL without a scheme, with an unknown one, or with one
/// whose cargo feature is off is a [`LockError::Config`] that says so (and which schemes
/// this build has); the URL's password is never in it.
pub fn driver_for(url: &str) -> Result<&'static Driver, LockError> {
    driver_among(DRIVERS, url)
}

/// [`driver_for`] in a build whose drivers are `drivers` (the tests' builds without a
/// feature, in a build with them all).
fn driver_among(drivers: &'static [Driver], url: &str) -> Result<&'static Driver, LockError> {
    let known = || {
        drivers
            .iter()
            .flat_map(|driver| driver.schemes)
            .map(|scheme| format!("{scheme}://"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(LockError::Config(format!(
            "lock URL {} has no scheme (this build has {})",
            urls::redact_unparsed(url),
            known()
        )));
    };
    if let Some(driver) = drivers.iter().find(|driver| driver.accepts(scheme)) {
        return Ok(driver);
    }
    Err(LockError::Config(
        match FEATURES
            .iter()
            .find(|(_, schemes)| schemes.contains(&scheme))
        {
            Some((feature, _)) => format!(
                "{} needs tenure's `{feature}` cargo feature, which this build does not have",
                urls::redact_unparsed(url)
            ),
            None => format!(
                "unknown lock URL scheme {}:// in {} (this build has {})",
                redact_url(scheme),
                urls::redact_unparsed(url),
                known()
            ),
        },
    ))
}

/// The backend `url`'s scheme names, whether or not this build has it (a feature's name
/// is its backend's).
pub(crate) fn backend_named(url: &str) -> Option<&'static str> {
    let (scheme, _) = url.split_once("://")?;
    let enabled = DRIVERS.iter().map(|driver| (driver.name, driver.schemes));
    enabled
        .chain(FEATURES)
        .find(|(_, schemes)| schemes.contains(&scheme))
        .map(|(name, _)| name)
}

/// Connects to the backend named by `url`'s scheme (see the table above). A scheme whose
/// cargo feature is off is a [`LockError::Config`] naming the feature.
///
/// # Cancel safety
/// Cancel-safe: a half-made client is dropped.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
    Ok((driver_for(url)?.connect)(url).await?.lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_are_checked() {
        let err = connect("bogus://u:hunter2@h")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown lock URL scheme bogus://"), "{err}");
        assert!(
            err.contains("memory://"),
            "lists the schemes this build has: {err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        let err = connect("no-scheme").await.unwrap_err();
        assert!(matches!(err, LockError::Config(_)));
        for url in [
            "u:hunter2@h",
            "bogus://u:hunter2@h/p'q",
            "redis//u:hunter2@h",
        ] {
            let err = connect(url).await.unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{err}");
        }
        let memory = connect("memory://").await.unwrap();
        assert_eq!(memory.capabilities().backend, "memory");
    }

    /// Every enabled driver has the schemes its feature announces, and every scheme one
    /// driver only.
    #[test]
    fn the_driver_table_agrees_with_the_feature_table() {
        for driver in &DRIVERS[1..] {
            let (_, schemes) = FEATURES
                .iter()
                .find(|(feature, _)| *feature == driver.name)
                .unwrap_or_else(|| panic!("{} has no feature", driver.name));
            assert_eq!(*schemes, driver.schemes, "{}", driver.name);
        }
        let mut schemes: Vec<_> = DRIVERS.iter().flat_map(|d| d.schemes).collect();
        let all = schemes.len();
        schemes.sort();
        schemes.dedup();
        assert_eq!(schemes.len(), all, "a scheme with two drivers");
    }

    /// A build without a backend's feature (here: memory's driver only) names the
    /// feature to enable for that backend's URLs, without their passwords.
    #[test]
    fn a_disabled_backend_names_its_feature() {
        let memory_only = &DRIVERS[..1];
        for (feature, schemes) in FEATURES {
            for scheme in schemes {
                let url = format!("{scheme}://u:hunter2@h/p");
                let err = driver_among(memory_only, &url).unwrap_err();
                assert!(matches!(err, LockError::Config(_)), "{err}");
                let err = err.to_string();
                assert!(err.contains(&format!("`{feature}` cargo feature")), "{err}");
                assert!(!err.contains("hunter2"), "{err}");
            }
        }
        let err = driver_among(memory_only, "bogus://h")
            .unwrap_err()
            .to_string();
        assert!(err.contains("(this build has memory://)"), "{err}");
    }
}

// The guides' Rust examples compile, as doc-tests (`no_run` where they need servers).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/primitives.md")]
mod primitives_guide {}
