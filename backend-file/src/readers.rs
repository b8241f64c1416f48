//! Each reader's record, `<stem>.readers/<token>.reader`: its grant, in the state file's
//! format, made when it is granted and locked exclusively by the reader for as long as it
//! holds (so a record whose lock is free names a reader that is gone: its process died).
//! The reader removes it when it lets go (when the [`ReaderRecord`] is dropped); a dead
//! reader's is removed by the next reader's grant. A record appears whole and locked
//! (written under a temporary name, then renamed), so a sweep never takes a live one.
//! `inspect` names a live reader from these: the state file names only the key's last
//! grant, which may be a reader that already let go while others hold. One directory per
//! key, so a grant's sweep and an `inspect` list that key's readers only.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use crate::names::KeyFiles;
use crate::ofd::{self, Mode, Span};
use crate::record::{self, Record};

/// A live reader's record, locked while this value lives.
#[derive(Debug)]
pub(crate) struct ReaderRecord {
    path: PathBuf,
    file: File,
}

impl ReaderRecord {
    /// Makes the record of `record`, a reader's grant, first removing those of readers
    /// that are gone: written and locked under a temporary name, then renamed into place,
    /// so that a record is never seen unlocked under its name while its reader lives.
    pub(crate) fn create(files: &KeyFiles, record: &Record) -> io::Result<Self> {
        make_dir(&files.readers_dir)?;
        sweep(files);
        let path = files.reader(record.token);
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        let mut made = Self { path: tmp, file };
        if !ofd::lock(&made.file, Mode::Exclusive, Span::Whole)? {
            return Err(io::Error::other(format!(
                "{} was locked by another program as it was made",
                made.path.display()
            )));
        }
        made.rewrite(record)?;
        std::fs::rename(&made.path, &path)?;
        // Renamed: dropped from here on, it removes the record under its name.
        made.path = path;
        Ok(made)
    }

    /// Writes `record` over the record in place (its lock is on this file, which a rename
    /// would replace): a new deadline. A reader of the file at that instant may find a
    /// torn record, which it leaves out (see [`live`]).
    pub(crate) fn rewrite(&self, record: &Record) -> io::Result<()> {
        let text = record.encode();
        self.file.write_all_at(text.as_bytes(), 0)?;
        self.file.set_len(text.len() as u64)
    }
}

impl Drop for ReaderRecord {
    /// Removes the record, then lets its lock go (with the file).
    fn drop(&mut self) {
        remove(&self.path);
    }
}

/// Makes the readers' directory `dir` unless it is there; one that is not a directory (a
/// symbolic link, say, which could lead the records elsewhere) is refused.
fn make_dir(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(dir)?.file_type().is_dir() {
                true => Ok(()),
                false => Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", dir.display()),
                )),
            }
        }
        made => made,
    }
}

/// Removes the file at `path`, if it can (a missing one is gone already).
fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Removes the records of readers that are gone (unlocked), as far as it can: what cannot
/// be checked or removed (another user's file, a directory of that name) stays, and
/// keeps no reader from its grant.
fn sweep(files: &KeyFiles) {
    for (_, path) in files.readers().unwrap_or_default() {
        if matches!(ofd::is_locked(&path), Ok(false)) {
            remove(&path);
        }
    }
}

/// The records of the key's live readers (those a reader holds locked), by token; what
/// cannot be checked or read as a record is left out.
pub(crate) fn live(files: &KeyFiles) -> io::Result<Vec<Record>> {
    let mut live = Vec::new();
    for (_, path) in files.readers()? {
        if matches!(ofd::is_locked(&path), Ok(true)) {
            if let Ok(Some(Ok(record))) = record::read(&path) {
                live.push(record);
            }
        }
    }
    Ok(live)
}
