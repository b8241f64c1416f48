//! Readers (`acquire_shared`) on files: who `inspect` names, a dead reader's record, and
//! another program's shared lock.

use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, Backoff, DistributedLock, LockAdmin, LockKey, Problem, ReleaseOutcome,
};

use crate::files::{client, PythonHolder};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(30);

fn now() -> AcquireOptions {
    AcquireOptions::new(TTL).wait(Duration::ZERO)
}

/// The state file names the key's last grant; once that reader lets go while an older
/// one holds, `inspect` (and the listing) names the older one, from its own record.
#[tokio::test]
async fn inspect_names_a_reader_that_holds_not_the_last_grant() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (first, second, observer) = (
        client(&dir).await?,
        client(&dir).await?,
        client(&dir).await?,
    );
    let key = LockKey::new("reports/daily")?;
    let older = first.acquire_shared(&key, &now()).await?;
    let younger = second.acquire_shared(&key, &now()).await?;
    assert!(older.is_shared() && younger.token() > older.token());
    second.release(younger).await?;
    let seen = observer.inspect(&key).await?.expect("a reader holds");
    assert_eq!(seen.owner, older.owner(), "{seen:?}");
    assert_eq!(seen.token, Some(older.token()));
    let listed = observer.holders("").await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].1.owner, older.owner());
    assert_eq!(first.release(older).await?, ReleaseOutcome::Released);
    // Free once this process's other tests' children, forked meanwhile with a copy of
    // every open file, have exec'd and so closed it (an open file description's lock
    // outlives a release while a fork holds the file).
    let started = Instant::now();
    while observer.inspect(&key).await?.is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "still held after release"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let readers: Vec<_> = std::fs::read_dir(dir.path().join("reports%2Fdaily.readers"))?
        .filter_map(|e| e.ok())
        .collect();
    assert!(
        readers.is_empty(),
        "each reader removed its record: {readers:?}"
    );
    Ok(())
}

/// A reader whose process died leaves its record unlocked: never named, also while
/// another reader holds, and removed by the next reader's grant.
#[tokio::test]
async fn a_dead_readers_record_is_never_named_and_is_swept() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (lock, other) = (client(&dir).await?, client(&dir).await?);
    let key = LockKey::new("reports/daily")?;
    let reader = lock.acquire_shared(&key, &now()).await?;
    let token = reader.token().get() + 7;
    let dead = dir
        .path()
        .join(format!("reports%2Fdaily.readers/{token}.reader"));
    std::fs::write(&dead, record_text(token, 99_999_999_999_999))?;
    let seen = lock.inspect(&key).await?.expect("held");
    assert_eq!(
        seen.owner,
        reader.owner(),
        "not the dead one, whose lease ends later"
    );
    let next = other.acquire_shared(&key, &now()).await?;
    assert!(!dead.exists(), "swept by the next reader's grant");
    lock.release(reader).await?;
    other.release(next).await?;
    Ok(())
}

/// A reader's record in the state file's format.
fn record_text(token: u64, expires_unix_ms: u64) -> String {
    format!(
        "tenure-file 1\nkey reports%2Fdaily\ntoken {token}\n\
         owner 9c5e5384857a033209e121e90f630497\npid 4242\nexpires_unix_ms {expires_unix_ms}\n"
    )
}

/// Readers granted at once, each on a client of its own (as processes are), get tokens of
/// their own, one after the other from the counter: they take turns at it. (The counter
/// starts far above the clock here, so the clock floor cannot make them distinct.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_granted_at_once_take_turns_at_the_counter() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = LockKey::new("reports/daily")?;
    let from = 1u64 << 62;
    let state = record_text(from, 1_000);
    std::fs::write(dir.path().join("reports%2Fdaily.state"), state)?;
    let mut asked = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (client, key) = (client(&dir).await?, key.clone());
        asked.spawn(async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
            let lease = client.acquire_shared(&key, &opts).await?;
            Ok::<_, tenure_api::LockError>((client, lease))
        });
    }
    let mut granted = Vec::new();
    while let Some(joined) = asked.join_next().await {
        granted.push(joined??);
    }
    let mut tokens: Vec<u64> = granted.iter().map(|(_, l)| l.token().get()).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, (from + 1..=from + 16).collect::<Vec<_>>());
    for (client, lease) in granted {
        assert_eq!(client.release(lease).await?, ReleaseOutcome::Released);
    }
    Ok(())
}

/// A writer in line keeps later readers out; dropped (its future, as by a timeout around
/// it), it leaves the gate and wakes its own client's waiting readers at once.
#[tokio::test]
async fn a_dropped_waiting_writer_lets_readers_in_at_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (first, writer, late) = (
        client(&dir).await?,
        client(&dir).await?,
        client(&dir).await?,
    );
    let key = LockKey::new("reports/daily")?;
    let held = first.acquire_shared(&key, &now()).await?;
    let (lock, k) = (writer.clone(), key.clone());
    let write = tokio::spawn(async move {
        let waits = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
        lock.acquire(&k, &waits).await
    });
    let started = Instant::now();
    while late.acquire_shared(&key, &now()).await.is_ok_and(|l| {
        drop(l);
        true
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the writer never got in line"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A reader of the writer's own client, polling once every 20 s unless woken.
    let slow = AcquireOptions::new(TTL)
        .wait(Duration::from_secs(30))
        .backoff(Backoff {
            initial: Duration::from_secs(20),
            max: Duration::from_secs(20),
            jitter: 0.0,
        });
    let (lock, k) = (writer.clone(), key.clone());
    let read = tokio::spawn(async move { lock.acquire_shared(&k, &slow).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    write.abort();
    let reader = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| "the reader was not woken when the writer left")???;
    writer.release(reader).await?;
    first.release(held).await?;
    Ok(())
}

/// A reader stopped past its deadline keeps writers out: `doctor` reports it, with its
/// pid, beside a live reader in date (here another program holds the key shared, and the
/// stopped reader's record's lock, as a reader that stopped would).
#[tokio::test]
async fn doctor_reports_a_reader_past_its_deadline() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock = client(&dir).await?;
    let key = LockKey::new("reports/daily")?;
    std::fs::create_dir(dir.path().join("reports%2Fdaily.readers"))?;
    let record = dir.path().join("reports%2Fdaily.readers/5.reader");
    std::fs::write(&record, record_text(5, 1_000))?;
    let _shared = PythonHolder::start_in(&dir.path().join("reports%2Fdaily.lock"), "LOCK_SH")?;
    let _alive = PythonHolder::start_in(&record, "LOCK_EX")?;
    let in_date = lock.acquire_shared(&key, &now()).await?;
    let findings = lock.doctor().await?;
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].problem, Problem::Stale);
    assert!(
        findings[0].detail.contains("pid 4242, a reader"),
        "{findings:?}"
    );
    assert!(
        findings[0]
            .location
            .ends_with("reports%2Fdaily.readers/5.reader"),
        "{findings:?}"
    );
    let seen = lock.inspect(&key).await?.expect("held");
    assert_eq!(
        seen.owner,
        in_date.owner(),
        "the reader whose lease ends last"
    );
    lock.release(in_date).await?;
    Ok(())
}

/// Another program's shared POSIX lock (`fcntl.lockf(f, LOCK_SH)`) on the key's file is a
/// reader to tenure: tenure's readers share the key with it, its writers wait.
#[tokio::test]
async fn another_programs_shared_lock_is_a_reader() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock = client(&dir).await?;
    let key = LockKey::new("reports/daily")?;
    let foreign = PythonHolder::start_in(&dir.path().join("reports%2Fdaily.lock"), "LOCK_SH")?;
    let seen = lock.inspect(&key).await?.expect("held shared");
    assert!(seen.foreign, "no reader's record of tenure's: {seen:?}");
    assert!(
        lock.try_acquire(&key, TTL).await?.is_none(),
        "a writer waits"
    );
    let reader = lock.acquire_shared(&key, &now()).await?;
    lock.release(reader).await?;
    drop(foreign);
    let writer = lock.try_acquire(&key, TTL).await?.expect("free");
    lock.release(writer).await?;
    Ok(())
}
