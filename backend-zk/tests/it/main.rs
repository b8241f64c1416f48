//! The ZooKeeper backend's integration tests against a live ensemble the harness starts, one
//! module per concern, in one test binary (the shared suite, its variants and the fault
//! suite are `harness = false` binaries of their own).

mod faults;
mod observe;
mod requests;
mod security;
