//! The implementer's kit: what a backend crate uses to build a
//! [`DistributedLock`](crate::DistributedLock) — requests bounded in time, the holder text
//! its grants store, deadlines counted from when a request was sent, polling and
//! multi-key helpers, push feeds of holders, a loss the server pushes, a client
//! library's socket found by its address, and the [`Driver`]
//! that registers it for URL dispatch. Applications need none of it.

pub use crate::driver::{Backend, Driver};
pub use crate::error::bounded;
pub use crate::feed::{holder_feed, FeedSource};
pub use crate::held::{
    held_slot, too_many_held, wait_in_server, waiting_slot, HeldEntry, HeldLeases,
};
pub use crate::lease::{
    deadline, default_drift, holder_text, parse_holder_text, LeaseTie, LossNotice,
};
pub use crate::lock::{
    acquire_each, inspect_concurrently, poll_acquire, poll_acquire_woken, validate_keys,
    wait_for_any,
};
pub use crate::options::foreign_label;
pub use crate::socket::{Peeked, Socket};
