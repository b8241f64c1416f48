//! The floors of a lock directory (feature `testbed`, for `tenure bench --floor`), each a
//! try-acquire + release of a fresh key with `std` and `nix` alone, its file work on a
//! blocking thread as tenure's is:
//!
//! - the protocol floor: open the key's lock file, take its open-file-description lock,
//!   close it (the least a file lock needs: no record, no token);
//! - the same-work floor: the same, plus what tenure's grant does under the lock — read the
//!   key's record, write the new one to a temporary file, flush it, rename it over the
//!   record and flush the directory — with none of tenure's client-side work (the lease,
//!   its task, owner checks).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tenure_api::{async_trait, LockError, OwnerId};
use tenure_conformance::testbed::{boxed_locker, cycle_failed, BoxFuture, Locker};

use crate::names::KeyFiles;
use crate::record::{self, Record};
use crate::{ofd, FileConfig};

/// A floor on one lock directory.
struct FileFloor {
    config: FileConfig,
    /// Whether it records each grant as tenure does (the same-work floor).
    record: bool,
    ttl: Duration,
}

#[async_trait]
impl Locker for FileFloor {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let name = format!("{}{key}", self.config.prefix());
        let files = KeyFiles::of(self.config.dir(), &name);
        let (record, ttl, key) = (self.record, self.ttl, key.to_owned());
        let file = tokio::task::spawn_blocking(move || {
            let file = ofd::try_lock(&files.lock, ofd::Mode::Exclusive)
                .map_err(|e| cycle_failed("lock", e))?
                .ok_or_else(|| format!("{key:?} is held"))?;
            if record {
                let last = record::read(&files.state).map_err(|e| cycle_failed("read", e))?;
                let now = SystemTime::now();
                let record = Record {
                    key: name,
                    token: last
                        .and_then(Result::ok)
                        .map_or(0, |last| last.token)
                        .saturating_add(1)
                        .max(record::unix_micros(now)),
                    owner: OwnerId::random(),
                    pid: std::process::id(),
                    expires_unix_ms: record::unix_ms(now + ttl),
                    label: None,
                };
                record::write(&files.state, &record, true)
                    .map_err(|e| cycle_failed("record", e))?;
            }
            Ok::<_, String>(file)
        })
        .await
        .map_err(|e| cycle_failed("task", e))??;
        held();
        drop(file);
        Ok(())
    }
}

fn connect(
    url: &str,
    record: bool,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    boxed_locker(async move {
        let config = FileConfig::from_url(url)?;
        std::fs::create_dir_all(config.dir()).map_err(|e| {
            LockError::unavailable(format!("creating {}", config.dir().display()), e)
        })?;
        Ok(FileFloor {
            config,
            record,
            ttl,
        })
    })
}

/// The protocol floor for a `file://` URL.
pub(crate) fn floor(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, false, ttl)
}

/// The same-work floor for a `file://` URL.
pub(crate) fn same_work(
    url: &str,
    _tasks: usize,
    ttl: Duration,
) -> BoxFuture<'_, Result<Arc<dyn Locker>, LockError>> {
    connect(url, true, ttl)
}
