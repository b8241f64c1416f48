//! The lab's own integration tests: the suite catches deliberately broken locks. (The
//! launchers, the fault proxy and the clock shim are tested on real servers in the
//! backends' crates: `backend-redis/tests/it/servers.rs` and its siblings.)

mod broken;
mod vanished;
