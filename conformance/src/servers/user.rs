//! The system user a server runs as when the harness runs as root: Postgres and MariaDB
//! refuse to run as root, so their data directories are given to their own users
//! (`postgres`, `mysql`) and the servers spawned as them.

use std::path::Path;

use super::{Result, ServerError};

/// `(uid, gid)` of the system user `name` when this process runs as root, else `None`
/// (the server then runs as this process's user). Missing, it is a
/// [`ServerError::MissingBinary`] naming `install`, the package that creates it.
pub fn run_as(name: &str, install: &str) -> Result<Option<(u32, u32)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Ok(Some((u.uid.as_raw(), u.gid.as_raw()))),
        Ok(None) => Err(ServerError::MissingBinary {
            binary: format!("user `{name}` (the server refuses to run as root)"),
            install: install.into(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Makes `path` owned by `user` (from [`run_as`]), if the server runs as one.
pub fn give_to(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    if let Some((uid, gid)) = user {
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
    }
    Ok(())
}
