//! The ZooKeeper backend's integration tests against a live ensemble the harness starts, one
//! module per concern, in one test binary (the shared suite, its variants and the fault
//! suite are `harness = false` binaries of their own).

/// The tests that measure timings or count requests (in `faults` and `requests`) run one
/// at a time, each starting servers of its own, so that one's load never blurs
/// another's measurement (as when each file was a binary of its own).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod faults;
mod foreign;
mod observe;
mod requests;
mod security;
mod servers;
