//! tenure-api's integration tests: the guard, the in-process reference backend, and
//! properties of bad input and tokens.

mod guard;
mod memory;
mod props;
