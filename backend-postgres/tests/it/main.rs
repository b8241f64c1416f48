//! The Postgres backend's integration tests against a live server the harness starts, one
//! module per concern, in one test binary (the shared suite, its variants and the fault
//! suite are `harness = false` binaries of their own).

#[path = "../harness/mod.rs"]
mod harness;
#[path = "../secured/mod.rs"]
mod secured;

mod faults;
mod lease;
mod queue;
mod security;
mod semaphore;
mod servers;
mod transaction;
