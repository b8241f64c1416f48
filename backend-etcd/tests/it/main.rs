//! The etcd backend's integration tests against live members the harness starts, one
//! module per concern, in one test binary (the shared suite, its variants and the fault
//! suite are `harness = false` binaries of their own).

mod faults;
mod foreign;
mod leases;
mod observe;
mod secured;
mod security;
mod servers;
mod sessions;
