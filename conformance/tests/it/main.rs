//! The lab's own integration tests: the suite catches deliberately broken locks, and the
//! launchers, the fault proxy and the clock shim work on real servers.

mod broken;
mod servers;
