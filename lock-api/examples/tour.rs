//! A tour of the API on the in-process backend: acquire, contend, extend, fence, release,
//! and a guard that renews in the background.
//!
//! Run with `cargo run -p tenure-api --example tour`.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockExt, LockKey, MemoryLock};

/// A store that accepts a write only with a token at least as high as any seen: the
/// "fenced write" that keeps a stale holder from doing damage.
#[derive(Default)]
struct FencedStore {
    highest: u64,
    value: String,
}

impl FencedStore {
    fn write(&mut self, token: u64, value: &str) -> Result<(), String> {
        if token < self.highest {
            return Err(format!(
                "rejected stale token {token} (highest seen {})",
                self.highest
            ));
        }
        self.highest = token;
        self.value = value.to_string();
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    println!("backend: {}", lock.capabilities());
    let key = LockKey::new("tour/report")?;
    let ttl = Duration::from_millis(500);

    let mut first = lock
        .try_acquire(&key, ttl)
        .await?
        .expect("the key starts free");
    println!(
        "client A acquired `{key}` with fencing token {}",
        first.token()
    );
    let busy = lock.try_acquire(&key, ttl).await?;
    println!("client B try_acquire while A holds it: {busy:?}");

    lock.extend(&mut first, Duration::from_secs(2)).await?;
    println!(
        "client A extended; {:?} left",
        first.remaining(std::time::Instant::now())
    );

    let mut store = FencedStore::default();
    store
        .write(first.token().get(), "written by A")
        .map_err(LockError::backend)?;
    println!("A released: {:?}", lock.release(first.clone()).await?);

    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(1));
    let guard = lock.lock(&key, &opts).await?;
    println!(
        "client B holds it through a renewing guard, token {}",
        guard.fencing_token()
    );
    store
        .write(guard.fencing_token().get(), "written by B")
        .map_err(LockError::backend)?;
    tokio::time::sleep(ttl * 2).await;
    println!("after 2×ttl B still holds it: lost = {}", guard.is_lost());

    match store.write(first.token().get(), "late write by A") {
        Ok(()) => println!("BUG: the stale write was accepted"),
        Err(e) => println!("A's late write: {e}"),
    }
    println!("B released: {:?}", guard.release().await?);
    println!(
        "store holds {:?} (highest token {})",
        store.value, store.highest
    );
    Ok(())
}
