//! A lock directory shared with other processes and programs.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tenure_api::{DistributedLock, LockAdmin, LockKey, Problem};
use tenure_file::{FileConfig, FileLock};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(30);

/// A Python process holding a POSIX record lock (`fcntl.lockf`) on `path`, which
/// conflicts with an open-file-description lock; killed (by its pid) when dropped.
pub(crate) struct PythonHolder(Child);

impl PythonHolder {
    /// Holds an exclusive lock (`fcntl.LOCK_EX`).
    pub(crate) fn start(path: &std::path::Path) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_in(path, "LOCK_EX")
    }

    /// Holds a lock in `mode`, `LOCK_EX` or `LOCK_SH`.
    pub(crate) fn start_in(
        path: &std::path::Path,
        mode: &str,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let script = "import fcntl, sys\n\
                      f = open(sys.argv[1], 'a+')\n\
                      fcntl.lockf(f, getattr(fcntl, sys.argv[2]))\n\
                      print('locked', flush=True)\n\
                      sys.stdin.read()\n";
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", script])
            .arg(path)
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().ok_or("stdout")?),
            &mut line,
        )?;
        assert_eq!(line.trim(), "locked");
        Ok(Self(child))
    }
}

impl Drop for PythonHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) async fn client(
    dir: &tempfile::TempDir,
) -> Result<FileLock, Box<dyn std::error::Error>> {
    Ok(FileLock::connect(&FileConfig::in_dir(dir.path())?.url()).await?)
}

/// Another program's lock on the key's file keeps tenure out and shows as a foreign
/// holder; its process killed, the kernel frees the lock at once.
#[tokio::test]
async fn another_programs_lock_excludes_and_dies_with_its_process() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock = client(&dir).await?;
    let key = LockKey::new("jobs/nightly")?;
    let holder = PythonHolder::start(&dir.path().join("jobs%2Fnightly.lock"))?;
    assert!(lock.try_acquire(&key, TTL).await?.is_none());
    let seen = lock.inspect(&key).await?.expect("held by python");
    assert!(seen.foreign && seen.token.is_none(), "{seen:?}");
    let listed = lock.holders("").await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, key, "the key, read back from its file name");
    drop(holder);
    let lease = lock
        .try_acquire(&key, TTL)
        .await?
        .expect("freed with its process");
    lock.release(lease).await?;
    Ok(())
}

/// Tokens keep rising across clients, and past a deleted state file (the clock floor).
#[tokio::test]
async fn tokens_rise_across_clients_and_a_lost_record() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (a, b) = (client(&dir).await?, client(&dir).await?);
    let key = LockKey::new("k")?;
    let first = a.try_acquire(&key, TTL).await?.expect("free");
    let t1 = first.token();
    a.release(first).await?;
    let second = b.try_acquire(&key, TTL).await?.expect("free");
    let t2 = second.token();
    b.release(second).await?;
    std::fs::remove_file(dir.path().join("k.state"))?;
    let third = a.try_acquire(&key, TTL).await?.expect("free");
    assert!(
        t1 < t2 && t2 < third.token(),
        "{t1:?} {t2:?} {:?}",
        third.token()
    );
    let record = std::fs::read_to_string(dir.path().join("k.state"))?;
    assert!(
        record.contains(&format!("token {}\n", third.token().get())),
        "{record}"
    );
    assert!(
        record.contains(&format!("pid {}\n", std::process::id())),
        "{record}"
    );
    Ok(())
}

/// A lease not renewed is given up at its TTL, and its loss notice fires.
#[tokio::test]
async fn a_lease_not_renewed_is_given_up_at_its_ttl() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (a, b) = (client(&dir).await?, client(&dir).await?);
    let key = LockKey::new("k")?;
    let lease = a
        .try_acquire(&key, Duration::from_millis(300))
        .await?
        .expect("free");
    assert!(b.try_acquire(&key, TTL).await?.is_none());
    let notice = lease
        .loss_notice()
        .expect("a file lease reports its loss")
        .clone();
    tokio::time::timeout(Duration::from_secs(5), notice.fired()).await?;
    let taken = b
        .try_acquire(&key, TTL)
        .await?
        .expect("given up at the TTL");
    assert!(
        a.extend(&mut lease.clone(), TTL).await.is_err(),
        "never re-acquires"
    );
    b.release(taken).await?;
    Ok(())
}

/// `doctor` calls a held lock whose record is unreadable malformed, and one held past
/// its recorded deadline stale; a free key with a damaged record is granted anyway,
/// with a token above the clock.
#[tokio::test]
async fn doctor_finds_damaged_and_stale_records_of_held_locks() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock = client(&dir).await?;
    std::fs::write(dir.path().join("bad.state"), "not a record\n")?;
    let bad = PythonHolder::start(&dir.path().join("bad.lock"))?;
    let stale_record = format!(
        "tenure-file 1\nkey stale\ntoken 7\nowner {}\npid 1\nexpires_unix_ms 1000\n",
        "0".repeat(32)
    );
    std::fs::write(dir.path().join("stale.state"), stale_record)?;
    let stale = PythonHolder::start(&dir.path().join("stale.lock"))?;
    let findings = lock.doctor().await?;
    let problems: Vec<(&str, Problem)> = findings
        .iter()
        .map(|f| (f.key.as_str(), f.problem))
        .collect();
    assert_eq!(
        problems,
        [("bad", Problem::Malformed), ("stale", Problem::Stale)],
        "{findings:?}"
    );
    drop((bad, stale));
    assert!(lock.doctor().await?.is_empty());
    let granted = lock
        .try_acquire(&LockKey::new("bad")?, TTL)
        .await?
        .expect("free");
    assert!(
        granted.token().get() > 1_700_000_000_000_000,
        "{:?}",
        granted.token()
    );
    Ok(())
}

/// Two prefixes in one directory are two namespaces; a listing shows its own, without
/// the prefix.
#[tokio::test]
async fn prefixes_are_namespaces_in_one_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let config = FileConfig::in_dir(dir.path())?;
    let billing = FileLock::with_config(config.clone().with_prefix("billing/")).await?;
    let reports = FileLock::with_config(config.with_prefix("reports/")).await?;
    let key = LockKey::new("nightly")?;
    let held = billing.try_acquire(&key, TTL).await?.expect("free");
    let other = reports
        .try_acquire(&key, TTL)
        .await?
        .expect("another namespace");
    let listed = billing.holders("").await?;
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0].0, listed[0].1.owner), (&key, held.owner()));
    assert!(dir.path().join("billing%2Fnightly.lock").exists());
    billing.release(held).await?;
    reports.release(other).await?;
    Ok(())
}

/// A lock file removed from under its holder excludes no one: the next locker locks a new
/// file, and the holder's next extension reports the lease lost instead of renewing it.
#[tokio::test]
async fn a_lock_file_removed_from_under_its_holder_ends_the_lease() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (a, b) = (client(&dir).await?, client(&dir).await?);
    let key = LockKey::new("k")?;
    let mut lease = a.try_acquire(&key, TTL).await?.expect("free");
    std::fs::remove_file(dir.path().join("k.lock"))?;
    let other = b.try_acquire(&key, TTL).await?.expect("a new lock file");
    let lost = a.extend(&mut lease, TTL).await.unwrap_err();
    assert!(
        matches!(lost, tenure_api::LockError::LeaseLost { .. }),
        "{lost:?}"
    );
    assert!(other.token() > lease.token());
    b.release(other).await?;
    Ok(())
}

/// A record whose token is the largest there is cannot be followed by a larger one: the
/// grant is refused (and gives the lock back), never handed out with a repeated token.
#[tokio::test]
async fn a_token_that_cannot_grow_refuses_the_grant() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock = client(&dir).await?;
    let record = format!(
        "tenure-file 1\nkey k\ntoken {}\nowner {}\npid 1\nexpires_unix_ms 1000\n",
        u64::MAX,
        "0".repeat(32)
    );
    std::fs::write(dir.path().join("k.state"), record)?;
    let key = LockKey::new("k")?;
    let refused = lock.try_acquire(&key, TTL).await.unwrap_err();
    assert!(refused.to_string().contains("largest token"), "{refused}");
    assert!(
        lock.inspect(&key).await?.is_none(),
        "the lock was given back"
    );
    Ok(())
}
