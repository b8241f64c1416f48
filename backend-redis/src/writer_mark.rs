//! A waiting writer's mark: while readers hold a key, a writer that waits for it marks
//! itself (`{K}:writer`, [`WRITER_MARK`] long, renewed while it waits), and no further
//! reader is granted until the mark is taken back or runs out
//! ([`ACQUIRE_SHARED`](crate::scripts::ACQUIRE_SHARED)): a stream of readers never
//! starves a writer.

use tenure_api::{LockError, LockKey, OwnerId};

use crate::scripts::{Call, SCRIPTS};
use crate::{millis, Bound, RedisLock, Route, RELEASED, WRITER, WRITER_MARK};

/// One writer's mark on a key, for one acquire call. Dropped (the call ended: granted,
/// out of time, failed or cancelled), it is taken back in a task of its own and
/// announced on the key's release channel, so that the readers it held back try again
/// at once (after a grant, they find the writer's lock and wait for its release; a
/// release that came before the mark was taken back would otherwise have woken them
/// only to meet the mark).
pub(crate) struct WriterMark {
    lock: RedisLock,
    key: LockKey,
    waiter: OwnerId,
}

impl WriterMark {
    pub(crate) fn new(lock: &RedisLock, key: &LockKey) -> Self {
        Self {
            lock: lock.clone(),
            key: key.clone(),
            waiter: OwnerId::random(),
        }
    }

    /// Sets the mark for another [`WRITER_MARK`] (over another writer's: both wait).
    /// Best effort: a writer whose mark is not written (the server did not answer) still
    /// waits, only without holding readers back until its next try.
    ///
    /// # Cancel safety
    /// Cancel-safe: one `SET`, made or not; the mark runs out by itself.
    pub(crate) async fn renew(&self, bound: Bound) {
        let mut call = Call::command("SET", 1);
        call.key(self.lock.key_name(&self.key, WRITER))
            .arg(&self.waiter.hex()[..])
            .arg("PX")
            .arg(millis(WRITER_MARK));
        let set =
            self.lock
                .run_script::<redis::Value>("mark writer", &call, bound, 0, &Route::Current);
        let _ = set.await;
    }
}

impl Drop for WriterMark {
    fn drop(&mut self) {
        // Without a runtime to take it back (dropped outside one), it runs out.
        if tokio::runtime::Handle::try_current().is_ok() {
            let (lock, key, waiter) = (self.lock.clone(), self.key.clone(), self.waiter);
            tokio::spawn(async move { lock.unmark_writer(&key, waiter).await });
        }
    }
}

impl RedisLock {
    /// Takes `waiter`'s mark on `key` back if it is still there, and announces it (see
    /// [`UNMARK_WRITER`](crate::scripts::UNMARK_WRITER)): whether it was.
    ///
    /// # Cancel safety
    /// Cancel-safe: one script call, made or not; the mark runs out by itself.
    async fn unmark_writer(&self, key: &LockKey, waiter: OwnerId) -> Result<bool, LockError> {
        let mut call = Call::script(&SCRIPTS.unmark_writer, 1);
        call.key(self.key_name(key, WRITER))
            .arg(&waiter.hex()[..])
            .arg_fmt(self.key_name(key, RELEASED))
            .arg(if self.is_cluster() { "sharded" } else { "" });
        let unmarked: i64 = self.call("unmark writer", call).await?;
        Ok(unmarked == 1)
    }
}
