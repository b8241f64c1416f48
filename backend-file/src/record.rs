//! A key's state file: its last grant — key, fencing token, owner, label, the holder's
//! pid and the lease's deadline — as `name value` lines a shell or another language can
//! read:
//!
//! ```text
//! tenure-file 1
//! key jobs%2Fnightly
//! token 1733580000000123
//! owner 9c5e5384857a033209e121e90f630497
//! pid 4242
//! expires_unix_ms 1733580030000
//! label host-a
//! ```
//!
//! (`key` and `label` `%`-escaped; no `label` line without one.) It is replaced whole,
//! never edited in place: a temporary file in the same directory, renamed over it, so a
//! reader sees the old record or the new one. A grant's record is flushed (the file and
//! the directory) before the grant is reported, so its token survives a crash; an
//! extension's (a new deadline, for `inspect`) is not, so after a crash the record may be
//! empty — the token's clock floor still keeps the next one above every earlier token.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tenure_api::admin::percent_decode;
use tenure_api::urls::percent_encode;
use tenure_api::{FencingToken, HolderInfo, OwnerId};

/// The first line of every state file: the format and its version.
const HEADER: &str = "tenure-file 1";

/// The last grant of a key, as its state file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) owner: OwnerId,
    pub(crate) pid: u32,
    /// The lease's deadline, milliseconds since the Unix epoch (the holder's wall clock).
    pub(crate) expires_unix_ms: u64,
    pub(crate) label: Option<String>,
}

impl Record {
    /// The record's text.
    pub(crate) fn encode(&self) -> String {
        let mut text = format!(
            "{HEADER}\nkey {}\ntoken {}\nowner {}\npid {}\nexpires_unix_ms {}\n",
            percent_encode(&self.key),
            self.token,
            self.owner,
            self.pid,
            self.expires_unix_ms,
        );
        if let Some(label) = &self.label {
            text.push_str(&format!("label {}\n", percent_encode(label)));
        }
        text
    }

    /// Reads a record's text; what is wrong with it, if it is not one.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("its first line is not {HEADER:?}"));
        }
        let mut field = |name: &str| -> Result<Option<&str>, String> {
            let mut next = lines.clone();
            match next.next().and_then(|line| line.strip_prefix(name)) {
                Some(value) => {
                    lines = next;
                    value
                        .strip_prefix(' ')
                        .map(Some)
                        .ok_or_else(|| format!("no space after {name}"))
                }
                None => Ok(None),
            }
        };
        fn required<'a>(value: Option<&'a str>, name: &str) -> Result<&'a str, String> {
            value.ok_or_else(|| format!("no {name} line where expected"))
        }
        let number = |value: &str, name: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{name} {value:?} is not a number"))
        };
        let decode = |value: &str, name: &str| {
            percent_decode(value).ok_or_else(|| format!("{name} {value:?} is badly escaped"))
        };
        let key = decode(required(field("key")?, "key")?, "key")?;
        let token = number(required(field("token")?, "token")?, "token")?;
        let owner = required(field("owner")?, "owner")?;
        let owner =
            OwnerId::parse(owner).map_err(|_| format!("owner {owner:?} is not an owner id"))?;
        let pid = number(required(field("pid")?, "pid")?, "pid")?;
        let pid = u32::try_from(pid).map_err(|_| format!("pid {pid} is out of range"))?;
        let expires = required(field("expires_unix_ms")?, "expires_unix_ms")?;
        let expires_unix_ms = number(expires, "expires_unix_ms")?;
        let label = field("label")?.map(|l| decode(l, "label")).transpose()?;
        if let Some(extra) = lines.find(|line| !line.is_empty()) {
            return Err(format!("unexpected line {extra:?}"));
        }
        Ok(Self {
            key,
            token,
            owner,
            pid,
            expires_unix_ms,
            label,
        })
    }

    /// The holder this record names, as seen at `now_unix_ms`.
    pub(crate) fn holder(&self, now_unix_ms: u64) -> HolderInfo {
        HolderInfo {
            owner: self.owner,
            token: Some(FencingToken(self.token)),
            remaining: Some(Duration::from_millis(
                self.expires_unix_ms.saturating_sub(now_unix_ms),
            )),
            label: self.label.clone(),
            foreign: false,
        }
    }
}

/// Milliseconds since the Unix epoch now (0 before it).
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Microseconds since the Unix epoch now (0 before it): the floor of a new token.
pub(crate) fn unix_micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The record in `path`: `Ok(None)` if there is none, `Ok(Some(Err(why)))` if it is not
/// a record.
pub(crate) fn read(path: &Path) -> std::io::Result<Option<Result<Record, String>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(match String::from_utf8(bytes) {
            Ok(text) => Record::parse(&text),
            Err(_) => Err("it is not UTF-8".into()),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Counts this process's writes: each one's temporary file has a name of its own.
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Replaces the record in `path` with `record`: written to a temporary file beside it
/// and renamed over it; with `durable`, the file and then its directory are flushed to
/// the disk before this returns.
pub(crate) fn write(path: &Path, record: &Record, durable: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // A fresh file, never one planted at that name (nor through a symbolic link); a name
    // taken (left by a process killed midway, whose pid this one has now) is skipped.
    let mut taken = 0;
    let (tmp, mut file) = loop {
        let tmp = dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp);
        match opened {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && taken < 100 => taken += 1,
            Err(e) => return Err(e),
        }
    };
    let written = (|| {
        file.write_all(record.encode().as_bytes())?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(label: Option<&str>) -> Record {
        Record {
            key: "jobs/nightly report\n".into(),
            token: 1_733_580_000_000_123,
            owner: OwnerId::random(),
            pid: 4242,
            expires_unix_ms: 1_733_580_030_000,
            label: label.map(str::to_owned),
        }
    }

    #[test]
    fn a_record_reads_back() {
        for label in [None, Some("host-a: pid 1\nx"), Some("")] {
            let record = record(label);
            assert_eq!(Record::parse(&record.encode()), Ok(record.clone()));
        }
        let text = record(None).encode();
        assert!(text.starts_with("tenure-file 1\nkey jobs%2Fnightly%20report%0A\ntoken "));
    }

    #[test]
    fn what_is_not_a_record_says_why() {
        let good = record(Some("l")).encode();
        for (text, why) in [
            (String::new(), "first line"),
            (
                good.replacen("tenure-file 1", "tenure-file 2", 1),
                "first line",
            ),
            (good.replacen("token 1", "token x1", 1), "not a number"),
            (good.replacen("owner ", "owner z", 1), "not an owner id"),
            (
                good.replacen("pid 4242", "pid 99999999999", 1),
                "out of range",
            ),
            (good.replacen("key jobs", "key %zz", 1), "badly escaped"),
            (good.replacen("token ", "tokens ", 1), "no space"),
            (
                good.lines()
                    .filter(|l| !l.starts_with("pid"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                "no pid",
            ),
            (format!("{good}more\n"), "unexpected line"),
        ] {
            let error = Record::parse(&text).unwrap_err();
            assert!(error.contains(why), "{why}: {error}");
        }
    }

    #[test]
    fn a_write_replaces_the_record_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.state");
        assert_eq!(read(&path).unwrap(), None);
        let (first, second) = (record(None), record(Some("b")));
        write(&path, &first, true).unwrap();
        write(&path, &second, false).unwrap();
        assert_eq!(read(&path).unwrap(), Some(Ok(second)));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(read(&path).unwrap(), Some(Err("it is not UTF-8".into())));
    }

    #[test]
    fn a_temporary_name_left_by_a_killed_process_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.state");
        let next = WRITES.load(Ordering::Relaxed);
        for n in next..next + 3 {
            let planted = format!(".k.state.{}.{n}.tmp", std::process::id());
            std::fs::write(dir.path().join(planted), "left behind").unwrap();
        }
        write(&path, &record(None), true).unwrap();
        assert!(read(&path).unwrap().is_some_and(|r| r.is_ok()));
    }
}
