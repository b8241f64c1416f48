//! Open-file-description locks (`fcntl` `F_OFD_SETLK`, `F_OFD_GETLK`) on a whole file or
//! on one byte of it.
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

/// What a lock excludes: an exclusive lock every other one, a shared lock the exclusive
/// ones only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
}

/// The bytes a lock covers: the whole file, or the one byte at an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Span {
    Whole,
    Byte(i64),
}

/// Opens `path` for reading and writing, creating it if missing (a symbolic link is
/// refused).
pub(crate) fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Opens `path`, which must exist, for reading (a symbolic link is refused).
pub(crate) fn open_existing(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Opens `path` (as [`open`]) and takes its lock in `mode` without waiting: the locked
/// file, or `None` if another open file description holds a lock that conflicts. Dropping
/// the file gives the lock up. A lock taken on a file that was replaced or removed
/// meanwhile is given up and taken again on the file the path names.
pub(crate) fn try_lock(path: &Path, mode: Mode) -> io::Result<Option<File>> {
    for _ in 0..3 {
        let file = open(path)?;
        if !lock(&file, mode, Span::Whole)? {
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

/// Takes the lock on `span` of `file` in `mode` without waiting: `false` if another open
/// file description holds one that conflicts. It is given up when the file closes.
pub(crate) fn lock(file: &File, mode: Mode, span: Span) -> io::Result<bool> {
    sys::lock(file, mode, span)
}

/// Whether another open file description holds a lock on `span` of `file` that one in
/// `mode` would conflict with, asked without taking one.
pub(crate) fn conflicts(file: &File, mode: Mode, span: Span) -> io::Result<bool> {
    Ok(sys::conflicting(file, mode, span)?.is_some())
}

/// Whether some open file description holds a lock on `path` now, asked without taking
/// one (a missing file is not locked).
pub(crate) fn is_locked(path: &Path) -> io::Result<bool> {
    Ok(held_as(path)?.is_some())
}

/// How `path` is locked now, asked without taking a lock: exclusively, shared (by one
/// or more), or not at all (`None`; so is a missing file).
pub(crate) fn held_as(path: &Path) -> io::Result<Option<Mode>> {
    let file = match open_existing(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    sys::conflicting(&file, Mode::Exclusive, Span::Whole)
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::io;

    use nix::errno::Errno;
    use nix::fcntl::{fcntl, FcntlArg};
    use nix::libc;

    use super::{Mode, Span};

    /// `span` of a file, for a lock in `mode`.
    fn region(mode: Mode, span: Span) -> libc::flock {
        let kind = match mode {
            Mode::Exclusive => libc::F_WRLCK,
            Mode::Shared => libc::F_RDLCK,
        };
        let (l_start, l_len) = match span {
            Span::Whole => (0, 0),
            Span::Byte(at) => (at, 1),
        };
        libc::flock {
            l_type: kind as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start,
            l_len,
            l_pid: 0,
        }
    }

    /// Takes the lock on `span` of `file` without waiting: `false` if a conflicting lock
    /// is held.
    pub(super) fn lock(file: &File, mode: Mode, span: Span) -> io::Result<bool> {
        match fcntl(file, FcntlArg::F_OFD_SETLK(&region(mode, span))) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The mode of a lock another open file description holds on `span` of `file` that
    /// one in `mode` would conflict with, if any.
    pub(super) fn conflicting(file: &File, mode: Mode, span: Span) -> io::Result<Option<Mode>> {
        let mut probe = region(mode, span);
        fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
        Ok(match libc::c_int::from(probe.l_type) {
            libc::F_UNLCK => None,
            libc::F_RDLCK => Some(Mode::Shared),
            _ => Some(Mode::Exclusive),
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;
    use std::io;

    use super::{Mode, Span};

    fn unsupported() -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "open-file-description locks are Linux's",
        )
    }

    pub(super) fn lock(_: &File, _: Mode, _: Span) -> io::Result<bool> {
        Err(unsupported())
    }

    pub(super) fn conflicting(_: &File, _: Mode, _: Span) -> io::Result<Option<Mode>> {
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
        let held = try_lock(&path, Mode::Exclusive).unwrap().expect("free");
        assert!(is_locked(&path).unwrap());
        assert!(
            try_lock(&path, Mode::Exclusive).unwrap().is_none(),
            "another open of this process"
        );
        // Closing another descriptor of the file keeps the lock (a POSIX lock would go).
        drop(File::open(&path).unwrap());
        assert!(is_locked(&path).unwrap());
        drop(held);
        assert!(!is_locked(&path).unwrap());
        assert!(try_lock(&path, Mode::Exclusive).unwrap().is_some());
    }

    /// A lock file removed or replaced under its holder no longer excludes anyone: the
    /// holder can tell, and the next locker locks the file the path names.
    #[test]
    fn a_replaced_lock_file_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let held = try_lock(&path, Mode::Exclusive).unwrap().expect("free");
        assert!(names_it(&held, &path).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(!names_it(&held, &path).unwrap());
        let next = try_lock(&path, Mode::Exclusive)
            .unwrap()
            .expect("a new file");
        assert!(names_it(&next, &path).unwrap() && !names_it(&held, &path).unwrap());
    }

    #[test]
    fn a_symbolic_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        assert!(try_lock(&path, Mode::Exclusive).is_err());
        assert!(
            !dir.path().join("elsewhere").exists(),
            "nothing created through it"
        );
    }

    #[test]
    fn shared_locks_share_and_exclude_the_exclusive_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let first = try_lock(&path, Mode::Shared).unwrap().expect("free");
        let second = try_lock(&path, Mode::Shared).unwrap().expect("shared");
        assert_eq!(held_as(&path).unwrap(), Some(Mode::Shared));
        assert!(try_lock(&path, Mode::Exclusive).unwrap().is_none());
        drop(first);
        assert!(
            try_lock(&path, Mode::Exclusive).unwrap().is_none(),
            "one left"
        );
        drop(second);
        let writer = try_lock(&path, Mode::Exclusive)
            .unwrap()
            .expect("free again");
        assert!(try_lock(&path, Mode::Shared).unwrap().is_none());
        drop(writer);
    }

    #[test]
    fn a_bytes_lock_conflicts_on_that_byte_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.gate");
        let (a, b) = (open(&path).unwrap(), open(&path).unwrap());
        assert!(lock(&a, Mode::Exclusive, Span::Byte(0)).unwrap());
        assert!(conflicts(&b, Mode::Shared, Span::Byte(0)).unwrap());
        assert!(!conflicts(&b, Mode::Shared, Span::Byte(1)).unwrap());
        assert!(!lock(&b, Mode::Shared, Span::Byte(0)).unwrap());
        assert!(lock(&b, Mode::Exclusive, Span::Byte(1)).unwrap());
        assert!(
            !conflicts(&a, Mode::Exclusive, Span::Byte(0)).unwrap(),
            "its own"
        );
        drop(a);
        assert!(!conflicts(&b, Mode::Exclusive, Span::Byte(0)).unwrap());
        let c = open(&path).unwrap();
        assert!(conflicts(&c, Mode::Shared, Span::Byte(1)).unwrap());
    }
}
