//! The `tenure` command end to end against live servers, one test binary: the commands
//! ([`cli`]), every backend's bench floor ([`bench`]), `tenure run` signalled and killed
//! as a service manager would ([`run`]), `tenure doctor` and `inspect` finding planted
//! leaks ([`doctor`]), another recipe's client let in when a killed `tenure run`'s lease
//! ends ([`interop`]), and the local servers behind the lab following a restart
//! ([`local_restart`]).

#![cfg(feature = "lab")]

mod bench;
mod cli;
mod doctor;
mod interop;
mod local_restart;
mod run;
