//! Who holds what in a lock directory: a key is held while its `.lock` file is locked
//! (asked with `F_OFD_GETLK`, which takes nothing); its live readers' `.reader` records,
//! or else its `.state` file, say by whom.

use std::path::Path;
use std::time::SystemTime;

use async_trait::async_trait;
use tenure_api::admin::{percent_decode, Finding, Problem};
use tenure_api::{HolderInfo, LockAdmin, LockError, LockKey, OwnerId};

use crate::names::{KeyFiles, LOCK_SUFFIX};
use crate::record::{self, Record};
use crate::{blocking, io_error, ofd, readers, FileLock};

/// The holder of the key named `key` whose files are `files`, if its lock is held: the
/// grant its state file records, or a foreign holder (another program's lock on the file,
/// or a grant not yet recorded) where the record is missing or unreadable.
pub(crate) fn holder(files: &KeyFiles, key: &str) -> Result<Option<HolderInfo>, LockError> {
    match locked_record(files)?.map(|locked| locked.record) {
        None => Ok(None),
        Some(Ok(record)) if record.key != key => Err(LockError::backend(format!(
            "{} records the key {:?}, not {key:?}: two keys share a file name",
            files.state.display(),
            record.key
        ))),
        Some(Ok(record)) => Ok(Some(record.holder(record::unix_ms(SystemTime::now())))),
        Some(Err(_)) => Ok(Some(foreign(files))),
    }
}

/// What the records say of a held lock.
struct Locked {
    /// Its holder's record: a writer's from the state file, or the live reader's whose
    /// lease ends last; `Err(why)` where there is none of tenure's.
    record: Result<Record, String>,
    /// Every live reader's record (readers hold the lock shared).
    readers: Vec<Record>,
    /// Held shared: by readers, tenure's or another program's.
    shared: bool,
}

/// The records of a held lock (`None` if it is free). The state file names the key's last
/// grant, which may be a reader that let go while others hold: of a lock held shared, the
/// readers' own records say who holds it, and without any, another program does.
fn locked_record(files: &KeyFiles) -> Result<Option<Locked>, LockError> {
    let held_as =
        ofd::held_as(&files.lock).map_err(|e| io_error("asking about", &files.lock, e))?;
    match held_as {
        None => Ok(None),
        Some(ofd::Mode::Exclusive) => {
            let record =
                record::read(&files.state).map_err(|e| io_error("reading", &files.state, e))?;
            Ok(Some(Locked {
                record: record.unwrap_or_else(|| Err("there is no state file".into())),
                readers: Vec::new(),
                shared: false,
            }))
        }
        // Only then are readers' records looked for (a listing of the directory).
        Some(ofd::Mode::Shared) => {
            let readers =
                readers::live(files).map_err(|e| io_error("listing", &files.readers_dir, e))?;
            let last = readers.iter().max_by_key(|r| r.expires_unix_ms).cloned();
            Ok(Some(Locked {
                record: last.ok_or_else(|| "held shared with no reader's record".to_owned()),
                readers,
                shared: true,
            }))
        }
    }
}

/// A holder that left no record of tenure's: an owner derived from the lock file's path.
fn foreign(files: &KeyFiles) -> HolderInfo {
    HolderInfo {
        owner: OwnerId::derived(files.lock.as_os_str().as_encoded_bytes()),
        token: None,
        remaining: None,
        label: None,
        foreign: true,
    }
}

/// A held lock in a directory: the name its key has there (from its record, or from its
/// file name where that is an escaped name; `None` for a hashed one, `~…`, without a
/// readable record), its file names' stem, its files and its record.
struct Held {
    name: Option<String>,
    stem: String,
    files: KeyFiles,
    locked: Locked,
}

/// Every held lock in `dir`, by name.
fn held_in(dir: &Path) -> Result<Vec<Held>, LockError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))?;
    let mut held = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("listing", dir, e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(LOCK_SUFFIX)) else {
            continue;
        };
        if stem.starts_with('.') {
            continue;
        }
        let files = KeyFiles::of_stem(dir, stem);
        let Some(locked) = locked_record(&files)? else {
            continue;
        };
        let name = match &locked.record {
            Ok(record) => Some(record.key.clone()),
            Err(_) if stem.starts_with('~') => None,
            Err(_) => percent_decode(stem),
        };
        held.push(Held {
            name,
            stem: stem.to_owned(),
            files,
            locked,
        });
    }
    held.sort_by(|a, b| (&a.name, &a.stem).cmp(&(&b.name, &b.stem)));
    Ok(held)
}

#[async_trait]
impl LockAdmin for FileLock {
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn holders(&self, prefix: &str) -> Result<Vec<(LockKey, HolderInfo)>, LockError> {
        let dir = self.dir().to_owned();
        let namespace = self.inner.config.prefix().to_owned();
        let prefix = format!("{namespace}{prefix}");
        blocking(move || {
            let now = record::unix_ms(SystemTime::now());
            let mut holders = Vec::new();
            for held in held_in(&dir)? {
                // A lock whose key cannot be named is not listed (`doctor` reports it).
                let Some(name) = held.name.filter(|name| name.starts_with(&prefix)) else {
                    continue;
                };
                let Ok(key) = LockKey::new(&name[namespace.len()..]) else {
                    continue;
                };
                let holder = match held.locked.record {
                    Ok(record) => record.holder(now),
                    Err(_) => foreign(&held.files),
                };
                holders.push((key, holder));
            }
            Ok(holders)
        })
        .await
    }

    /// A lock held past its recorded deadline (its process stopped or stuck: nothing but
    /// the process can give an open file's lock up) is `Stale`; one held without a
    /// readable record of tenure's is `Malformed`, unless it is another program's.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        let dir = self.dir().to_owned();
        let namespace = self.inner.config.prefix().to_owned();
        blocking(move || {
            let now = record::unix_ms(SystemTime::now());
            let mut findings = Vec::new();
            for held in held_in(&dir)? {
                // This client's namespace, by key; a lock whose key cannot be named, too.
                let key = match &held.name {
                    Some(name) if !name.starts_with(&namespace) => continue,
                    Some(name) => name[namespace.len()..].to_owned(),
                    None => held.stem.clone(),
                };
                let stale = |record: &Record, location: &Path| Finding {
                    key: key.clone(),
                    problem: Problem::Stale,
                    location: location.display().to_string(),
                    detail: format!(
                        "held {} ms past its deadline by pid {}{} (stopped or stuck: only its \
                         process can give the lock up)",
                        now - record.expires_unix_ms,
                        record.pid,
                        if held.locked.shared { ", a reader" } else { "" },
                    ),
                };
                if held.locked.shared {
                    // Each reader, at its own record: one stopped reader keeps writers out.
                    let past = held
                        .locked
                        .readers
                        .iter()
                        .filter(|r| r.expires_unix_ms < now);
                    findings.extend(past.map(|r| stale(r, &held.files.reader(r.token))));
                    continue;
                }
                match held.locked.record {
                    Ok(record) if record.expires_unix_ms < now => {
                        findings.push(stale(&record, &held.files.lock))
                    }
                    Ok(_) => {}
                    Err(why) if held.files.state.exists() => findings.push(Finding {
                        key,
                        problem: Problem::Malformed,
                        location: held.files.state.display().to_string(),
                        detail: format!(
                            "the lock is held, and its state file is unreadable: {why}"
                        ),
                    }),
                    // Locked by a program that keeps no record of tenure's.
                    Err(_) => {}
                }
            }
            Ok(findings)
        })
        .await
    }

    /// `None`: waiters poll and leave no trace.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn queued(&self, _key: &LockKey) -> Result<Option<usize>, LockError> {
        Ok(None)
    }
}
