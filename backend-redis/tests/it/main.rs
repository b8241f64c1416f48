//! The Redis backend's integration tests (single node, replicas, Sentinel, Cluster) against
//! live servers the harness starts, one module per concern, in one test binary (the shared
//! suite, its variants and the fault suite are `harness = false` binaries of their own).

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod deadlines;
mod errors;
mod faults;
mod fence;
mod floor;
mod foreign;
mod readers;
mod replicas;
mod security;
mod semaphore;
mod sentinel;
mod servers;
mod waiters;
