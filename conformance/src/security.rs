//! Checks for clients refused by a secured server: the refusal is a typed error with a
//! clear message, comes at once (no retry loop, no waiting out the lock wait), and never
//! shows a password.

use std::future::Future;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey};

/// How long a refused client would wait for the lock.
pub const WAIT: Duration = Duration::from_secs(30);
/// A refusal comes well before [`WAIT`] runs out. (A client may retry a failed connect
/// once, about 1.5 s later; every other step answers at once.)
pub const PROMPT: Duration = Duration::from_secs(10);

/// Connects with `connect` and, if that succeeds, takes lock `job` waiting up to
/// [`WAIT`]: the error, which must come within [`PROMPT`] and show `secret` neither in
/// `Display` nor in `Debug`. Panics if the lock is granted.
pub async fn refusal<L, F>(connect: F, secret: &str) -> LockError
where
    L: DistributedLock,
    F: Future<Output = Result<L, LockError>>,
{
    let started = Instant::now();
    let key = LockKey::new("job").expect("a valid key");
    let opts = AcquireOptions::new(Duration::from_secs(10)).wait(WAIT);
    let error = match connect.await {
        Err(e) => e,
        Ok(lock) => match lock.acquire(&key, &opts).await {
            Err(e) => e,
            Ok(_) => panic!("acquired"),
        },
    };
    let took = started.elapsed();
    eprintln!("refused after {took:?}: {error}");
    assert!(took < PROMPT, "refused after {took:?}: {error}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains(secret), "the password shows in {shown}");
    }
    error
}

/// Asserts that a client of a secured server works: it takes lock `job`, a second try
/// finds it held, and it releases it.
pub async fn locks_and_unlocks(lock: &impl DistributedLock) {
    let key = LockKey::new("job").expect("a valid key");
    let ttl = Duration::from_secs(5);
    let lease = lock.try_acquire(&key, ttl).await.expect("a lock");
    let lease = lease.expect("a free lock");
    let again = lock.try_acquire(&key, ttl).await.expect("an answer");
    assert!(again.is_none(), "granted twice");
    lock.release(lease).await.expect("a release");
}

/// Asserts that `error` is a `Config` error (never retried) whose message says `what`.
pub fn expect_config(error: &LockError, what: &str) {
    match error {
        LockError::Config(message) => assert!(message.contains(what), "{message}"),
        other => panic!("expected a Config error saying {what:?}, got {other:?}"),
    }
}
