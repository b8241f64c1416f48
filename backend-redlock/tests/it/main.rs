//! The Redlock backend's integration tests against live Redis nodes the harness starts, one
//! module per concern, in one test binary (the shared suite, its variants and the fault
//! suite are `harness = false` binaries of their own).

#[path = "../common/mod.rs"]
mod common;

mod config;
mod faults;
mod replicas;
mod safety;
mod security;
