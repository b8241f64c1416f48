//! # tenure-api
//!
//! The contract every tenure backend implements: [`DistributedLock`] (lease, extend,
//! release, inspect) with a [`FencingToken`] on every grant, the renewing [`LockGuard`]
//! that reports loss instead of hiding it, and [`MemoryLock`], the in-process backend.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tenure_api::{AcquireOptions, DistributedLock, LockExt, LockKey, MemoryLock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tenure_api::LockError> {
//! let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
//! let key = LockKey::new("billing/invoice-run")?;
//! let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
//!
//! let total = lock
//!     .with_lock(&key, &opts, |fence, _lost| async move {
//!         // Send `fence` with every write so the store can reject stale holders.
//!         fence.get() * 10
//!     })
//!     .await?;
//! assert!(total >= 10);
//! # Ok(())
//! # }
//! ```

pub mod admin;
pub mod backend;
mod capabilities;
mod clock;
mod driver;
mod election;
mod error;
mod feed;
mod guard;
mod held;
mod key;
mod lease;
mod lock;
mod memory;
mod multi;
mod options;
mod rw;
mod semaphore;
mod socket;
#[cfg(feature = "tls")]
pub mod tls;
pub mod urls;

pub use admin::{Finding, LockAdmin, Problem};
pub use async_trait::async_trait;
pub use capabilities::{Capabilities, ExpiryKind, Fairness, FencingKind, Replication, WaitKind};
pub use clock::{Clock, ManualClock, SystemClock};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, LockError};
pub use guard::{renewal_interval, LockExt, LockGuard, LostSignal, WithLockError, SUSPEND_CHECK};
pub use key::LockKey;
pub use lease::{
    FencingToken, HolderInfo, Lease, LeaseDropped, LeaseHandle, OwnerId, ReleaseOutcome,
};
pub use lock::{DistributedLock, HolderFeed};
pub use memory::MemoryLock;
pub use multi::{MultiGuard, MultiLock};
pub use options::{
    validate_label, validate_ttl, AcquireOptions, Backoff, MAX_LABEL, MAX_TTL, MIN_TTL,
};
pub use rw::{RwGuard, RwLock};
pub use semaphore::Semaphore;
