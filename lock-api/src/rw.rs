//! Many readers or one writer, on any lock with a shared mode: [`RwLock`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{AcquireOptions, DistributedLock, LockError, LockExt, LockGuard, LockKey};

/// A read-write lock on one key: readers hold it together, a writer holds it alone, on
/// any [`DistributedLock`] with a shared mode ([`Capabilities::shared`]).
///
/// The read side is [`DistributedLock::acquire_shared`], the write side the key's plain
/// lock, so a plain `acquire` of the key is a writer too. **Writer-preferring**: a
/// writer waiting for the key holds back the readers that ask after it, so a stream of
/// readers never starves a writer. Both sides hand out renewing [`LockGuard`]s, with
/// loss notices, as [`LockExt::lock`] does.
///
/// **Fencing.** Every grant's token, a reader's or a writer's, is larger than every token
/// granted for the key before it: a store that keeps the highest token it has seen turns
/// away a stale writer once a newer reader or writer has been there. Readers run at the
/// same time, so a reader's token promises only that no writer holds the key while the
/// reader's lease lasts.
///
/// [`Capabilities::shared`]: crate::Capabilities::shared
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure_api::{AcquireOptions, DistributedLock, LockKey, MemoryLock, RwLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tenure_api::LockError> {
/// let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let config = RwLock::new(lock, LockKey::new("config/pricing")?)?;
/// let ttl = Duration::from_secs(30);
/// let reader = config.read(&AcquireOptions::new(ttl)).await?;
/// let another = config.try_read(ttl).await?.expect("readers share");
/// assert!(config.try_write(ttl).await?.is_none(), "a writer waits for the readers");
/// let last_read = another.fencing_token();
/// reader.release().await?;
/// another.release().await?;
/// let writer = config.write(&AcquireOptions::new(ttl)).await?;
/// assert!(writer.fencing_token() > last_read);
/// assert!(config.try_read(ttl).await?.is_none(), "a writer excludes readers");
/// writer.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    lock: Arc<dyn DistributedLock>,
    key: LockKey,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("lock", &self.lock)
            .field("key", &self.key)
            .finish()
    }
}

/// A held side of an [`RwLock`]: a reader's or the writer's renewing guard.
pub type RwGuard = LockGuard<dyn DistributedLock>;

impl RwLock {
    /// The read-write lock of `key` on `lock`. [`LockError::Config`] if the backend, in
    /// this configuration, has no shared mode.
    pub fn new(lock: Arc<dyn DistributedLock>, key: LockKey) -> Result<Self, LockError> {
        let caps = lock.capabilities();
        if !caps.shared {
            return Err(LockError::Config(format!(
                "the {} backend has no shared (read) locks, which a read-write lock's \
                 readers hold",
                caps.backend
            )));
        }
        Ok(Self { lock, key })
    }

    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Waits up to `opts.wait` to read: until no writer holds the key or waits ahead.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire_shared`].
    pub async fn read(&self, opts: &AcquireOptions) -> Result<RwGuard, LockError> {
        self.lock.lock_shared(&self.key, opts).await
    }

    /// Waits up to `opts.wait` to write: until no reader or writer holds the key, and
    /// the writers ahead have had their turn.
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`].
    pub async fn write(&self, opts: &AcquireOptions) -> Result<RwGuard, LockError> {
        self.lock.lock(&self.key, opts).await
    }

    /// One attempt to read for `ttl`; `Ok(None)` while a writer holds the key or waits.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_read(&self, ttl: Duration) -> Result<Option<RwGuard>, LockError> {
        once(
            self.read(&AcquireOptions::new(ttl).wait(Duration::ZERO))
                .await,
        )
    }

    /// One attempt to write for `ttl`; `Ok(None)` while anyone holds the key.
    ///
    /// # Cancel safety
    /// As [`write`](Self::write).
    pub async fn try_write(&self, ttl: Duration) -> Result<Option<RwGuard>, LockError> {
        once(
            self.write(&AcquireOptions::new(ttl).wait(Duration::ZERO))
                .await,
        )
    }
}

/// A one-attempt wait's outcome: a timeout is "held".
fn once(result: Result<RwGuard, LockError>) -> Result<Option<RwGuard>, LockError> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(LockError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
