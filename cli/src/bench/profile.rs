//! What a bench slice cost this process, from `getrusage(RUSAGE_SELF)`: CPU time (user +
//! system, every thread) and context switches (voluntary — a thread blocking on I/O or
//! a lock — and involuntary). Servers are other processes: only the client is counted,
//! so a line's per-cycle figures are its client's cost, and a regression shows without
//! `perf`.

use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeValLike;

/// This process's resource use so far, or between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    /// User + system CPU time.
    pub(super) cpu: Duration,
    /// Voluntary + involuntary context switches.
    pub(super) switches: u64,
}

impl Usage {
    /// The process's use so far (zero if `getrusage` fails, which it does not on Linux).
    pub(super) fn now() -> Self {
        let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
            return Self::default();
        };
        let micros = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
        let switches = usage.voluntary_context_switches() + usage.involuntary_context_switches();
        Self {
            cpu: Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
            switches: u64::try_from(switches).unwrap_or(0),
        }
    }

    /// The use from `earlier` to this reading.
    pub(super) fn since(self, earlier: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }

    /// Both uses together.
    pub(super) fn plus(self, other: Self) -> Self {
        Self {
            cpu: self.cpu + other.cpu,
            switches: self.switches + other.switches,
        }
    }

    /// CPU µs (to one place) and context switches (to two: `par64` makes few) per cycle;
    /// none without cycles.
    pub(super) fn per_cycle(self, cycles: u64) -> Option<(f64, f64)> {
        let per = |total: f64, places: f64| (total / cycles as f64 * places).round() / places;
        (cycles > 0).then(|| {
            let cpu = per(self.cpu.as_micros() as f64, 10.0);
            (cpu, per(self.switches as f64, 100.0))
        })
    }
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
        let (cpu, switches) = Usage {
            cpu: Duration::from_micros(2_500),
            switches: 3,
        }
        .per_cycle(4)
        .unwrap();
        assert_eq!((cpu, switches), (625.0, 0.75));
        assert_eq!(used.per_cycle(0), None);
    }
}
