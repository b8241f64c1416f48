//! Conformance tooling for tenure lock backends: real servers on loopback ports, a TCP
//! fault proxy, a clock shim for redis-server and Postgres, the shared scenario suite, and
//! a history checker that turns what clients observed into verdicts.
//!
//! A backend runs the whole suite from a `harness = false` test (several setups and
//! the fault suite in one binary: [`runner::Suites`]):
//!
//! ```no_run
//! use tenure_conformance::{runner, MemoryHarness};
//! fn main() {
//!     runner::run_suite(|| async { Ok(MemoryHarness::new()) }).exit();
//! }
//! ```

pub mod broken;
pub mod clock_shim;
pub mod faults;
pub mod foreign;
pub mod harness;
pub mod history;
pub mod proxy;
pub mod runner;
pub mod security;
pub mod servers;
pub mod suite;
pub mod testbed;
pub mod url_options;

pub use harness::{
    retrying, ConnectFn, CuttableClient, Harness, Link, Links, MemoryHarness, QueueFn, UrlHarness,
};
pub use history::{Counter, FencedRegister, History, Increment, LostUpdates, Report};
pub use suite::{scenarios, Ctx, Failure, Outcome, Requirement, Scenario};

// The guide's Rust example compiles, as a doc-test.
#[cfg(doctest)]
#[doc = include_str!("../../docs/conformance.md")]
mod conformance_guide {}
