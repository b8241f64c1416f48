//! The whole suite against MemoryLock, the reference backend.

use tenure_conformance::{runner, MemoryHarness};

fn main() {
    runner::run_suite(|| async { Ok(MemoryHarness::new()) }).exit();
}
