//! The facade's integration tests: the observability layers, and one binary swapping
//! backends by configuration alone.

mod observe;
mod swap_by_config;
