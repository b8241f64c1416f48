#![doc = include_str!("../docs.md")]

mod admin;
mod config;
mod default_dir;
#[cfg(feature = "testbed")]
mod floor;
mod gate;
mod held;
#[cfg(feature = "testbed")]
pub mod lab;
mod names;
mod ofd;
mod readers;
mod record;
#[cfg(feature = "testbed")]
mod verdicts;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use tenure_api::backend::{poll_acquire_woken, Backend, Driver, LeaseTie, LossNotice};
use tenure_api::{
    validate_ttl, AcquireOptions, Capabilities, DistributedLock, ExpiryKind, Fairness, FencingKind,
    FencingToken, HolderInfo, Lease, LeaseHandle, LockError, LockKey, OwnerId, ReleaseOutcome,
    Replication, SystemClock, WaitKind,
};
use tokio::sync::Notify;

pub use config::FileConfig;
pub use default_dir::default_dir;
use gate::{RecordTurn, WaitingWriter};
use held::{Granted, Held, HeldMap};
#[cfg(feature = "testbed")]
pub use lab::TESTBED;
use names::KeyFiles;
use ofd::Mode;
use readers::ReaderRecord;
use record::Record;

/// Locks shared by every process of one host through files in one directory: an
/// open-file-description lock per key, fenced by a durable, clock-floored counter. No
/// server. See the [crate docs](crate).
#[derive(Clone)]
pub struct FileLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: FileConfig,
    held: HeldMap,
    /// Wakes this client's waiters when it gives a lock up (other processes' releases are
    /// found by polling).
    released: Notify,
}

impl fmt::Debug for FileLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLock")
            .field("dir", &self.inner.config.dir())
            .finish_non_exhaustive()
    }
}

impl FileLock {
    /// This backend for URL dispatch: `file:///dir`.
    pub const DRIVER: Driver = Driver {
        name: "file",
        schemes: &["file"],
        connect: |url| Box::pin(async move { Ok(Backend::new(FileLock::connect(url).await?)) }),
    };

    /// A client of the locks in the directory `url` names (`file:///var/lock/tenure`),
    /// created (with its parents) if missing.
    ///
    /// # Cancel safety
    /// Cancel-safe: the directory is made by a blocking task, which finishes anyway.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(FileConfig::from_url(url)?).await
    }

    /// A client of the locks in `config`'s directory, created if missing.
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: FileConfig) -> Result<Self, LockError> {
        let dir = config.dir().to_owned();
        blocking(move || std::fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e)))
            .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                held: HeldMap::default(),
                released: Notify::new(),
            }),
        })
    }

    /// The directory the lock files live in.
    pub fn dir(&self) -> &std::path::Path {
        self.inner.config.dir()
    }

    /// What `key` is named in the directory: the configured prefix, then the key.
    fn name(&self, key: &LockKey) -> String {
        format!("{}{}", self.inner.config.prefix(), key.as_str())
    }

    /// The files of `key`.
    fn files(&self, key: &LockKey) -> KeyFiles {
        KeyFiles::of(self.dir(), &self.name(key))
    }

    /// One attempt: the lock of `key` in `mode` for `ttl`, or `None` if another open file
    /// description holds a lock that conflicts (or, for a reader, a writer waits).
    ///
    /// # Cancel safety
    /// Dropped midway, a grant the blocking task makes is given up with its file.
    async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        label: Option<String>,
        mode: Mode,
    ) -> Result<Option<Lease>, LockError> {
        let (files, name) = (self.files(key), self.name(key));
        let path = files.lock.display().to_string();
        let sent_at = Instant::now();
        let granted = blocking(move || grant(&files, name, ttl, label, mode)).await?;
        let Some(granted) = granted else {
            return Ok(None);
        };
        let (owner, token, pid) = (
            granted.record.owner,
            granted.record.token,
            granted.record.pid,
        );
        let lost = LossNotice::new();
        let (tie, dropped) = LeaseTie::new(lost.clone());
        let lease = Lease::new(
            key.clone(),
            owner,
            FencingToken(token),
            sent_at,
            ttl,
            Duration::ZERO,
        )
        .with_tie(tie)
        .with_handle(LeaseHandle {
            path,
            id: i64::from(pid),
            revision: 0,
        });
        let lease = match mode {
            Mode::Exclusive => lease,
            Mode::Shared => lease.into_shared(),
        };
        Held::start(
            &self.inner.held,
            key.clone(),
            granted,
            lease.valid_until(),
            lost,
            dropped,
        );
        Ok(Some(lease))
    }

    /// Polls [`attempt`](Self::attempt) in `mode` within `opts`, woken at once by this
    /// client's own releases. A writer that has to wait says so at the key's gate (see
    /// [`gate`]) until it holds the key or stops waiting, so the readers that come after
    /// it wait behind it; when it stops waiting, this client's waiters try again at once.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropped, a waiting writer leaves the gate with the future.
    async fn poll(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
        mode: Mode,
    ) -> Result<Lease, LockError> {
        opts.validate()?;
        let gate = self.files(key).gate;
        let in_line: Mutex<Option<InLine>> = Mutex::new(None);
        let says_it_waits = mode == Mode::Exclusive && !opts.wait.is_zero();
        let (in_line, gate) = (&in_line, &gate);
        let attempt = move || async move {
            let granted = self
                .attempt(key, opts.ttl, opts.label.clone(), mode)
                .await?;
            let place = || in_line.lock().unwrap_or_else(PoisonError::into_inner);
            if granted.is_none() && says_it_waits && place().is_none() {
                let gate = gate.clone();
                let entered = blocking(move || {
                    WaitingWriter::try_enter(&gate).map_err(|e| io_error("waiting at", &gate, e))
                })
                .await?;
                *place() = entered.map(|at| InLine {
                    at: Some(at),
                    inner: self.inner.clone(),
                });
            }
            Ok(granted)
        };
        poll_acquire_woken(&SystemClock, opts, attempt, || {
            self.inner.released.notified()
        })
        .await
    }
}

/// A writer in line at a key's gate. Dropped — granted, its wait over, or its future
/// dropped —, it leaves the gate and wakes this client's waiters (readers it held back).
struct InLine {
    at: Option<WaitingWriter>,
    inner: Arc<Inner>,
}

impl Drop for InLine {
    fn drop(&mut self) {
        // Out of line first, then the waiters woken.
        drop(self.at.take());
        self.inner.released.notify_waiters();
    }
}

/// How long a reader tries for its turn at the counter before the attempt fails
/// (`Unavailable`, retried within a wait): far longer than the turns of the readers ahead
/// (each writes and flushes one record).
const TURN_PATIENCE: Duration = Duration::from_secs(5);

/// Takes `files`' lock in `mode` and records the grant durably: `None` if a conflicting
/// lock is held, or, for a reader, if a writer waits at the gate. A reader takes the key
/// and records its grant in its turn at the gate's counter byte (`Unavailable` if other
/// readers' turns keep it past [`TURN_PATIENCE`]), then makes a record of its own.
fn grant(
    files: &KeyFiles,
    key: String,
    ttl: Duration,
    label: Option<String>,
    mode: Mode,
) -> Result<Option<Granted>, LockError> {
    let at_gate = |e| io_error("asking at", &files.gate, e);
    let lock = || ofd::try_lock(&files.lock, mode).map_err(|e| io_error("locking", &files.lock, e));
    if mode == Mode::Exclusive {
        let Some(file) = lock()? else {
            return Ok(None);
        };
        let record = record_grant(files, key, ttl, label)?;
        return Ok(Some(Granted {
            file,
            reader: None,
            record,
        }));
    }
    if gate::writer_waits(&files.gate).map_err(at_gate)? {
        return Ok(None);
    }
    // The turn first: a reader waiting for it holds nothing a writer needs.
    let Some(turn) = RecordTurn::take(&files.gate, TURN_PATIENCE).map_err(at_gate)? else {
        return Err(LockError::Unavailable {
            message: format!(
                "another reader's turn at {} lasted past {TURN_PATIENCE:?} (a stopped reader?)",
                files.gate.display()
            ),
            source: None,
        });
    };
    let Some(file) = lock()? else {
        return Ok(None);
    };
    let record = record_grant(files, key, ttl, label)?;
    drop(turn);
    let reader = ReaderRecord::create(files, &record)
        .map_err(|e| io_error("recording the reader in", &files.reader(record.token), e))?;
    Ok(Some(Granted {
        file,
        reader: Some(reader),
        record,
    }))
}

/// Records a new grant of `key` in `files`' state file, flushed: the token is the last
/// grant's plus one, and never below the clock's microseconds since the epoch (so a lost
/// or damaged state file cannot make it go back). Called by the one writer holding the
/// key, or by a reader in its turn at the gate's record.
fn record_grant(
    files: &KeyFiles,
    key: String,
    ttl: Duration,
    label: Option<String>,
) -> Result<Record, LockError> {
    let last = record::read(&files.state).map_err(|e| io_error("reading", &files.state, e))?;
    let last_token = match last {
        Some(Ok(last)) if last.key != key => {
            return Err(LockError::backend(format!(
                "{} records the key {:?}, not {key:?}: two keys share a file name",
                files.state.display(),
                last.key
            )))
        }
        Some(Ok(last)) => last.token,
        // A missing or damaged record: the clock floor below keeps the token rising.
        Some(Err(_)) | None => 0,
    };
    let now = SystemTime::now();
    let token = last_token.checked_add(1).ok_or_else(|| {
        LockError::backend(format!(
            "{} records the largest token there is: remove it to start again from the clock",
            files.state.display()
        ))
    })?;
    let record = Record {
        key,
        token: token.max(record::unix_micros(now)),
        owner: OwnerId::random(),
        pid: std::process::id(),
        expires_unix_ms: record::unix_ms(now + ttl),
        label,
    };
    record::write(&files.state, &record, true)
        .map_err(|e| io_error("recording the grant in", &files.state, e))?;
    Ok(record)
}

/// Runs blocking file work off the async threads.
///
/// # Cancel safety
/// Dropped, the work still runs to its end; its result is dropped.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LockError> + Send + 'static,
) -> Result<T, LockError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LockError::backend(format!("file lock task failed: {e}")))?
}

/// A file error as a [`LockError`]: one that will not pass by itself — no permission, a
/// read-only file system, a path that is not a directory or is a symbolic link where a
/// lock file should be, a file system without these locks — is [`LockError::Config`];
/// anything else [`LockError::Unavailable`].
fn io_error(doing: &str, path: &std::path::Path, error: std::io::Error) -> LockError {
    use std::io::ErrorKind::*;
    let what = format!("{doing} {}", path.display());
    let lasting = matches!(
        error.kind(),
        PermissionDenied
            | ReadOnlyFilesystem
            | NotADirectory
            | AlreadyExists
            | InvalidInput
            | Unsupported
            | IsADirectory
    ) || error.raw_os_error() == Some(nix::libc::ELOOP);
    match lasting {
        true => LockError::Config(format!("{what}: {error}")),
        false => LockError::unavailable(what, error),
    }
}

#[async_trait]
impl DistributedLock for FileLock {
    /// # Cancel safety
    /// Cancel-safe: a grant made by the blocking task after the future was dropped is
    /// given up when its file is dropped with the task's result.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        validate_ttl(ttl)?;
        self.attempt(key, ttl, None, Mode::Exclusive).await
    }

    /// Polls with `opts.backoff`, woken at once by this client's own releases; once it
    /// has to wait, it holds back the readers that come after it (see the crate docs).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): no waiter is left behind.
    async fn acquire(&self, key: &LockKey, opts: &AcquireOptions) -> Result<Lease, LockError> {
        self.poll(key, opts, Mode::Exclusive).await
    }

    /// A reader: a shared lock on the key's file, once no writer holds it or waits for it;
    /// polls as [`acquire`](Self::acquire) does.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): no waiter is left behind.
    async fn acquire_shared(
        &self,
        key: &LockKey,
        opts: &AcquireOptions,
    ) -> Result<Lease, LockError> {
        self.poll(key, opts, Mode::Shared).await
    }

    /// Moves the deadline this client gives the lock up at, then records it for `inspect`
    /// (best effort: a record that cannot be written, on a full disk say, does not fail
    /// the extension). A lock file removed or replaced since the grant ends the lease.
    ///
    /// # Cancel safety
    /// Dropped midway, the extension may still apply (a blocking task finishes it): the
    /// lock is then held to the new deadline while `lease` keeps the old one.
    async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<(), LockError> {
        validate_ttl(ttl)?;
        let lost = || {
            LockError::lost(format!(
                "`{}` is no longer held by {}",
                lease.key(),
                lease.owner()
            ))
        };
        let held = held::find(&self.inner.held, lease.key(), lease.owner()).ok_or_else(lost)?;
        let (owner, token) = (lease.owner(), lease.token());
        let files = self.files(lease.key());
        let sent_at = Instant::now();
        let extended = blocking(move || {
            let mut grant = held.grant();
            if !grant.is(owner, token) {
                return Ok(false);
            }
            if !grant.still_named(&files.lock) {
                // Its file was removed or replaced: the lock excludes no one any more.
                grant.give_up();
                held.changed();
                return Ok(false);
            }
            grant.extend_to(sent_at + ttl);
            held.changed();
            let expires = record::unix_ms(SystemTime::now() + ttl);
            grant.record.expires_unix_ms = grant.record.expires_unix_ms.max(expires);
            // For `inspect`'s time left only: not flushed, and a failure ignored. (A
            // reader's own record: the state file may name a later grant.)
            let _ = match grant.reader() {
                Some(reader) => reader.rewrite(&grant.record),
                None => record::write(&files.state, &grant.record, false),
            };
            Ok(true)
        })
        .await?;
        if !extended {
            return Err(lost());
        }
        lease.renewed(sent_at, ttl, Duration::ZERO);
        Ok(())
    }

    /// # Cancel safety
    /// Cancel-safe: the release happens within a single poll, or (while an extension
    /// writes the record) on a blocking thread that finishes it anyway.
    async fn release(&self, lease: Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(held) = held::find(&self.inner.held, lease.key(), lease.owner()) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let (owner, token) = (lease.owner(), lease.token());
        let released = held
            .with_grant(move |grant| {
                let ours = grant.is(owner, token);
                if ours {
                    grant.give_up();
                }
                ours
            })
            .await
            .ok_or_else(|| LockError::backend("the runtime is shutting down"))?;
        held.changed();
        if !released {
            return Ok(ReleaseOutcome::NotHeld);
        }
        self.inner.released.notify_waiters();
        Ok(ReleaseOutcome::Released)
    }

    /// # Cancel safety
    /// Read-only: cancel-safe.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, LockError> {
        let (files, name) = (self.files(key), self.name(key));
        blocking(move || admin::holder(&files, &name)).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "file",
            fencing: FencingKind::ClockFlooredCounter,
            expiry: ExpiryKind::HolderProcess,
            replication: Replication::SingleNode,
            wait: WaitKind::Poll,
            fairness: Fairness::None,
            failures_tolerated: 0,
            clock_dependent: false,
            labels: true,
            shared: true,
        }
    }
}
