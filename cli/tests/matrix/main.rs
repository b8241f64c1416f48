//! `tenure matrix` end to end, one test binary: the quick matrix on plain and on secured
//! servers ([`quick`]), exit codes and interrupts ([`exit`]), soaks ([`soak`]), the TTL a
//! user's cluster imposes ([`ttl`]) and the broken variants it must catch ([`broken`]).
//!
//! Each test runs `tenure matrix`, which starts servers of its own, so the tests take
//! turns ([`one_at_a_time`]): two matrices at once (say, three etcd members beside three
//! ZooKeeper JVMs) starve a two-core machine, and their timing-dependent cells with it.

#![cfg(feature = "lab")]

use tokio::sync::{Mutex, MutexGuard};

mod broken;
mod clusters_file;
mod exit;
mod quick;
mod soak;
mod ttl;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The machine, for one matrix at a time (from a plain test).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.blocking_lock()
}

/// The machine, for one matrix at a time (from an async test).
async fn one_at_a_time_async() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}
