//! What a bench slice cost this process, from `getrusage(RUSAGE_SELF)`: CPU time (user +
//! system, every thread) and context switches (voluntary — a thread blocking on I/O or
//! a lock — and involuntary); and the heap allocations made, counted by the `tenure`
//! binary's allocator ([`COUNTING_ALLOCATOR`]). Servers are other processes: only the
//! client is counted, so a line's per-cycle figures are its client's cost, and a
//! regression shows without `perf`.

use std::sync::LazyLock;
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeValLike;

use crate::COUNTING_ALLOCATOR;

/// Whether [`COUNTING_ALLOCATOR`] is this process's global allocator: an allocation
/// made here shows in its count.
static COUNTING: LazyLock<bool> = LazyLock::new(|| {
    let before = COUNTING_ALLOCATOR.stats().allocations;
    drop(std::hint::black_box(Box::new(0u64)));
    COUNTING_ALLOCATOR.stats().allocations > before
});

/// This process's resource use so far, or between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    /// User + system CPU time.
    pub(super) cpu: Duration,
    /// Voluntary + involuntary context switches.
    pub(super) switches: u64,
    /// Heap allocations (`alloc` and `alloc_zeroed` calls; a `realloc` is not counted),
    /// when [`COUNTING_ALLOCATOR`] counts them.
    pub(super) allocations: Option<u64>,
}

impl Usage {
    /// The process's use so far (zero if `getrusage` fails, which it does not on Linux).
    pub(super) fn now() -> Self {
        let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
            return Self {
                allocations: allocations(),
                ..Self::default()
            };
        };
        let micros = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
        let switches = usage.voluntary_context_switches() + usage.involuntary_context_switches();
        Self {
            cpu: Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
            switches: u64::try_from(switches).unwrap_or(0),
            allocations: allocations(),
        }
    }

    /// The use from `earlier` to this reading.
    pub(super) fn since(self, earlier: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            switches: self.switches.saturating_sub(earlier.switches),
            allocations: self
                .allocations
                .zip(earlier.allocations)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }

    /// Both uses together.
    pub(super) fn plus(self, other: Self) -> Self {
        Self {
            cpu: self.cpu + other.cpu,
            switches: self.switches + other.switches,
            // `None` (nothing counted yet, or no counting allocator) adds nothing.
            allocations: match (self.allocations, other.allocations) {
                (Some(a), Some(b)) => Some(a + b),
                (a, None) | (None, a) => a,
            },
        }
    }

    /// CPU µs (to one place), context switches (to two: `par64` makes few) and
    /// allocations (to one, where counted) per cycle; none without cycles.
    pub(super) fn per_cycle(self, cycles: u64) -> Option<PerCycle> {
        let per = |total: f64, places: f64| (total / cycles as f64 * places).round() / places;
        (cycles > 0).then(|| PerCycle {
            cpu_us: per(self.cpu.as_micros() as f64, 10.0),
            switches: per(self.switches as f64, 100.0),
            allocations: self.allocations.map(|n| per(n as f64, 10.0)),
        })
    }
}

/// A slice's use per cycle (see [`Usage::per_cycle`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PerCycle {
    pub(super) cpu_us: f64,
    pub(super) switches: f64,
    pub(super) allocations: Option<f64>,
}

/// Allocations so far, if [`COUNTING_ALLOCATOR`] counts them.
fn allocations() -> Option<u64> {
    (*COUNTING).then(|| u64::try_from(COUNTING_ALLOCATOR.stats().allocations).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_done_between_readings_is_counted() {
        let before = Usage::now();
        // Busy until 5 ms of CPU are counted (however loaded the machine), then block: a
        // voluntary switch.
        let mut x = 0u64;
        while Usage::now().since(before).cpu < Duration::from_millis(5) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
        let used = Usage::now().since(before);
        assert!(used.cpu >= Duration::from_millis(5), "{used:?}");
        assert!(used.switches >= 1, "{used:?}");
        assert_eq!(used.plus(used).cpu, 2 * used.cpu);
        assert_eq!(
            Usage::default().plus(used).allocations,
            used.allocations,
            "a slice's use adds to an empty one's"
        );
        let per_cycle = Usage {
            cpu: Duration::from_micros(2_500),
            switches: 3,
            allocations: Some(10),
        }
        .per_cycle(4)
        .unwrap();
        assert_eq!(
            per_cycle,
            PerCycle {
                cpu_us: 625.0,
                switches: 0.75,
                allocations: Some(2.5)
            }
        );
        assert_eq!(used.per_cycle(0), None);
    }

    /// This test binary installs [`crate::COUNTING_ALLOCATOR`] (see the crate root), as
    /// the `tenure` binary does: the allocations between two readings are counted.
    #[test]
    fn allocations_between_readings_are_counted() {
        let before = Usage::now();
        let boxes: Vec<Box<u64>> = (0..100)
            .map(|i| std::hint::black_box(Box::new(i)))
            .collect();
        let used = Usage::now().since(before);
        drop(boxes);
        let counted = used.allocations.expect("the allocator counts");
        // Other tests' threads allocate too: at least ours are counted.
        assert!(counted >= 101, "100 boxes and their vector: {used:?}");
    }
}
