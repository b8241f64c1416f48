//! The file backend against real processes and real files: what only a file lock shows
//! (another program's lock on the same file, a holder's process killed, its records on
//! disk, namespaces in one directory).

mod files;
mod readers;
