//! The lock directory of this host when nothing is configured (what `tenure run` uses).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use tenure_api::LockError;

/// The lock directory of this host when nothing is configured: `/var/lock/tenure` for
/// root; for another user `$XDG_RUNTIME_DIR/tenure`, else `/var/lock/tenure-<uid>`; and
/// `$TMPDIR/tenure-<uid>` where none of these can be made. The first that is, or can be
/// made (mode 0755 for root's, 0700 for a user's), a directory of this user's that no one
/// else can write in. One that exists but is not — another user's, writable by others, a
/// symbolic link — is [`LockError::Config`]: anyone could have made it, to see or steal
/// the locks.
pub fn default_dir() -> Result<PathBuf, LockError> {
    let uid = nix::unistd::geteuid();
    let var_lock = Path::new("/var/lock");
    let mut candidates = Vec::new();
    if uid.is_root() {
        candidates.push((var_lock.join("tenure"), 0o755));
    } else {
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            candidates.push((PathBuf::from(runtime).join("tenure"), 0o700));
        }
        candidates.push((var_lock.join(format!("tenure-{uid}")), 0o700));
    }
    candidates.push((std::env::temp_dir().join(format!("tenure-{uid}")), 0o700));
    let mut tried = Vec::new();
    for (dir, mode) in candidates {
        match std::fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                tried.push(format!("{}: {e}", dir.display()));
                continue;
            }
        }
        return owned(&dir, uid.as_raw()).map(|()| dir);
    }
    Err(LockError::Config(format!(
        "no lock directory could be made ({}): pass --url file:///a/directory",
        tried.join("; ")
    )))
}

/// Whether `dir` is a directory (not a link) of `uid`'s that no one else can write in.
fn owned(dir: &Path, uid: u32) -> Result<(), LockError> {
    let refuse = |why: String| {
        LockError::Config(format!(
            "the lock directory {} {why}: anyone could have made it; remove it, or pass \
             --url file:///a/directory",
            dir.display()
        ))
    };
    let meta =
        std::fs::symlink_metadata(dir).map_err(|e| refuse(format!("cannot be read ({e})")))?;
    if !meta.is_dir() {
        return Err(refuse("is not a directory (or is a symbolic link)".into()));
    }
    if meta.uid() != uid {
        return Err(refuse(format!("belongs to uid {}, not {uid}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "can be written by others (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn only_a_directory_of_ours_that_no_one_else_writes_in_is_taken() {
        let uid = nix::unistd::geteuid().as_raw();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("mine");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        assert!(owned(&dir, uid).is_ok());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let shared = owned(&dir, uid).unwrap_err().to_string();
        assert!(shared.contains("written by others (mode 777)"), "{shared}");
        let theirs = owned(root.path(), uid + 1).unwrap_err().to_string();
        assert!(theirs.contains(&format!("not {}", uid + 1)), "{theirs}");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let linked = owned(&link, uid).unwrap_err().to_string();
        assert!(linked.contains("symbolic link"), "{linked}");
    }

    #[test]
    fn the_default_is_made_and_kept() {
        let dir = default_dir().unwrap();
        assert!(dir.is_dir());
        assert_eq!(default_dir().unwrap(), dir, "the same one each time");
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("tenure"), "{name}");
    }
}
