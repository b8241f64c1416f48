//! The machinery behind the `tenure` command that is more than a lock client: the
//! benchmark ([`mod@bench`]), the decision matrix ([`matrix`]) and the local clusters both
//! start ([`local`]).
//!
//! This library exists so that the command's integration tests can drive it; it is not a
//! stable API. Applications depend on the `tenure` crate, which carries none of this.
//! All of it is behind the default `lab` feature: without it the library is empty and the
//! command is a plain lock client.

#[cfg(feature = "lab")]
pub mod bench;
#[cfg(feature = "lab")]
pub mod local;
#[cfg(feature = "lab")]
pub mod matrix;

/// The allocator the `tenure` binary installs with the lab: the system allocator behind
/// counters of its calls (a few atomic adds per allocation and free), from which `tenure
/// bench` reports allocations per cycle (`"allocs_per_cycle"`).
#[cfg(feature = "lab")]
pub use stats_alloc::INSTRUMENTED_SYSTEM as COUNTING_ALLOCATOR;

/// This library's unit tests count allocations as the binary does.
#[cfg(all(test, feature = "lab"))]
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &COUNTING_ALLOCATOR;
