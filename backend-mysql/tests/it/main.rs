//! The MariaDB backend's integration tests against a live server the harness starts, one
//! module per concern, in one test binary.

mod locks;
mod security;
mod servers;
