//! The machinery behind the `tenure` command that is more than a lock client: the
//! benchmark ([`mod@bench`]), the decision matrix ([`matrix`]) and the local clusters both
//! start ([`local`]).
//!
//! This library exists so that the command's integration tests can drive it; it is not a
//! stable API. Applications depend on the `tenure` crate, which carries none of this.

pub mod bench;
pub mod local;
pub mod matrix;
