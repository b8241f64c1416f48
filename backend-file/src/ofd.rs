//! Open-file-description locks (`fcntl` `F_OFD_SETLK`, `F_OFD_GETLK`) on a whole file.
//!
//! Such a lock belongs to the open file description: it conflicts with every other one
//! (another process's, or another `open` of this process's), is given up when the last
//! descriptor of that description closes — so it dies with its holder's process —, and
//! unlike a POSIX record lock it survives the process closing *other* descriptors of the
//! same file. It conflicts with POSIX record locks too (`fcntl(F_SETLK)`, `lockf`,
//! Python's `fcntl.lockf`), not with `flock(2)` locks (the `flock` command). Linux only:
//! elsewhere every call fails with [`io::ErrorKind::Unsupported`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for writing (creating it if missing; a symbolic link is refused) and
/// takes its exclusive lock without waiting: the locked file, or `None` if another open
/// file description holds a lock on it. Dropping the file gives the lock up. A lock taken
/// on a file that was replaced or removed meanwhile is given up and taken again on the
/// file the path names.
pub(crate) fn try_lock(path: &Path) -> io::Result<Option<File>> {
    for _ in 0..3 {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)?;
        if !sys::try_lock(&file)? {
            return Ok(None);
        }
        if names_it(&file, path)? {
            return Ok(Some(file));
        }
    }
    Err(io::Error::other(format!(
        "{} was replaced three times while being locked",
        path.display()
    )))
}

/// Whether `path` still names the file `file` is open on (a lock on a file removed or
/// replaced since excludes no one who opens the path).
pub(crate) fn names_it(file: &File, path: &Path) -> io::Result<bool> {
    let open = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether some open file description holds a lock on `path` now, asked without taking
/// one (a missing file is not locked).
pub(crate) fn is_locked(path: &Path) -> io::Result<bool> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    sys::is_locked(&file)
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::io;

    use nix::errno::Errno;
    use nix::fcntl::{fcntl, FcntlArg};
    use nix::libc;

    /// The whole file, for a lock of `kind` (`F_WRLCK`, `F_UNLCK`).
    fn whole_file(kind: libc::c_int) -> libc::flock {
        libc::flock {
            l_type: kind as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 0,
            l_pid: 0,
        }
    }

    /// Takes `file`'s exclusive lock without waiting: `false` if it is held.
    pub(super) fn try_lock(file: &File) -> io::Result<bool> {
        match fcntl(file, FcntlArg::F_OFD_SETLK(&whole_file(libc::F_WRLCK))) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether another open file description holds a lock on `file`.
    pub(super) fn is_locked(file: &File) -> io::Result<bool> {
        let mut probe = whole_file(libc::F_WRLCK);
        fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
        Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;
    use std::io;

    fn unsupported() -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "open-file-description locks are Linux's",
        )
    }

    pub(super) fn try_lock(_file: &File) -> io::Result<bool> {
        Err(unsupported())
    }

    pub(super) fn is_locked(_file: &File) -> io::Result<bool> {
        Err(unsupported())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_open_file_description_holds_the_lock_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        assert!(!is_locked(&path).unwrap(), "missing: not locked");
        let held = try_lock(&path).unwrap().expect("free");
        assert!(is_locked(&path).unwrap());
        assert!(
            try_lock(&path).unwrap().is_none(),
            "another open of this process"
        );
        // Closing another descriptor of the file keeps the lock (a POSIX lock would go).
        drop(File::open(&path).unwrap());
        assert!(is_locked(&path).unwrap());
        drop(held);
        assert!(!is_locked(&path).unwrap());
        assert!(try_lock(&path).unwrap().is_some());
    }

    /// A lock file removed or replaced under its holder no longer excludes anyone: the
    /// holder can tell, and the next locker locks the file the path names.
    #[test]
    fn a_replaced_lock_file_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let held = try_lock(&path).unwrap().expect("free");
        assert!(names_it(&held, &path).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(!names_it(&held, &path).unwrap());
        let next = try_lock(&path).unwrap().expect("a new file");
        assert!(names_it(&next, &path).unwrap() && !names_it(&held, &path).unwrap());
    }

    #[test]
    fn a_symbolic_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        assert!(try_lock(&path).is_err());
        assert!(
            !dir.path().join("elsewhere").exists(),
            "nothing created through it"
        );
    }
}
