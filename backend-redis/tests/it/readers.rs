//! Readers on a real server (the shared suite runs the read-write scenarios on every
//! deployment): what the keys hold, who `inspect` and `holders` name, a dead reader's
//! record, a waiting writer's mark.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tenure_api::{AcquireOptions, DistributedLock, LockAdmin, LockKey, ReleaseOutcome};
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_redis::scripts::READERS_MARK;
use tenure_redis::RedisLock;

use super::fence::{plain, query};

/// A server, tenure's client of it, and a plain connection to read its keys.
async fn server() -> (RedisCluster, RedisLock, MultiplexedConnection) {
    let server = RedisCluster::start(RedisOptions::default()).await.unwrap();
    let url = server.urls()[0].clone();
    let lock = RedisLock::connect(&url).await.unwrap();
    let conn = plain(&url).await;
    (server, lock, conn)
}

fn once(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new(ttl).wait(Duration::ZERO)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_held_key_shows_its_last_reader_until_the_last_release_frees_it() {
    let (_server, lock, mut conn) = server().await;
    let k = LockKey::new("readers/shown").unwrap();
    let (lock_key, records) = (lock.lock_key(&k), format!("{}:readers", lock.lock_key(&k)));

    let first = lock
        .acquire_shared(&k, &once(Duration::from_secs(10)))
        .await
        .unwrap();
    let second = lock
        .acquire_shared(&k, &once(Duration::from_secs(30)).label("second"))
        .await
        .unwrap();
    assert!(
        second.token() > first.token(),
        "tokens from the fence counter"
    );
    let mark: String = query(&mut conn, &["GET", &lock_key]).await;
    assert_eq!(mark, READERS_MARK);
    let pttl: i64 = query(&mut conn, &["PTTL", &lock_key]).await;
    assert!(
        pttl > 20_000,
        "the mark lives as long as the last reader: {pttl}"
    );
    let held: i64 = query(&mut conn, &["HLEN", &records]).await;
    assert_eq!(held, 2);

    let shown = lock.inspect(&k).await.unwrap().expect("read-held");
    assert_eq!(
        shown.owner,
        second.owner(),
        "the reader whose lease ends last"
    );
    assert_eq!(shown.token, Some(second.token()));
    assert_eq!(shown.label.as_deref(), Some("second"));
    assert!(!shown.foreign, "{shown:?}");
    let holders = LockAdmin::holders(&lock, "readers/").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!((&holders[0].0, holders[0].1.owner), (&k, second.owner()));

    let released = lock.release(second).await.unwrap();
    assert_eq!(released, ReleaseOutcome::Released);
    let shown = lock.inspect(&k).await.unwrap().expect("still read-held");
    assert_eq!(shown.owner, first.owner());
    let pttl: i64 = query(&mut conn, &["PTTL", &lock_key]).await;
    assert!(
        (0..=10_000).contains(&pttl),
        "the mark follows the reader left: {pttl}"
    );
    let released = lock.release(first).await.unwrap();
    assert_eq!(released, ReleaseOutcome::Released);
    for key in [&lock_key, &records] {
        let left: i64 = query(&mut conn, &["EXISTS", key]).await;
        assert_eq!(left, 0, "{key} left behind the last reader");
    }
    assert!(lock.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_record_is_pruned_and_its_lease_alone_keeps_writers_out() {
    let (_server, lock, mut conn) = server().await;
    let k = LockKey::new("readers/dead").unwrap();
    let records = format!("{}:readers", lock.lock_key(&k));
    // Long enough that the checks while a reader is in date land in time on a loaded
    // machine.
    let short = Duration::from_secs(2);

    // A reader that dies holding: never released.
    let dead = lock.acquire_shared(&k, &once(short)).await.unwrap();
    assert!(lock.try_acquire(&k, short).await.unwrap().is_none());
    tokio::time::sleep(short * 3 / 2).await;
    let writer = lock.try_acquire(&k, short).await.unwrap();
    let writer = writer.expect("a writer once the dead reader's lease ran out");
    lock.release(writer).await.unwrap();

    // Beside a live reader, a dead one's record goes with the next grant.
    let live = lock
        .acquire_shared(&k, &once(Duration::from_secs(30)))
        .await
        .unwrap();
    let dying = lock.acquire_shared(&k, &once(short)).await.unwrap();
    tokio::time::sleep(short * 3 / 2).await;
    let next = lock
        .acquire_shared(&k, &once(Duration::from_secs(30)))
        .await
        .unwrap();
    let fields: Vec<String> = query(&mut conn, &["HKEYS", &records]).await;
    let mut expected = vec![live.owner().to_string(), next.owner().to_string()];
    let mut fields = fields;
    fields.sort();
    expected.sort();
    assert_eq!(fields, expected, "the dead reader's record is pruned");
    assert!(
        lock.try_acquire(&k, short).await.unwrap().is_none(),
        "readers in date keep writers out"
    );
    let mut ended = dying.clone();
    assert!(lock.extend(&mut ended, short).await.is_err(), "ended alone");
    for lease in [dead, dying] {
        let outcome = lock.release(lease).await.unwrap();
        assert_eq!(outcome, ReleaseOutcome::NotHeld);
    }
    for lease in [live, next] {
        assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
    assert!(lock.try_acquire(&k, short).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_is_dropped_while_waiting_takes_its_mark_back() {
    let (_server, lock, mut conn) = server().await;
    let k = LockKey::new("readers/mark").unwrap();
    let mark = format!("{}:writer", lock.lock_key(&k));
    let ttl = Duration::from_secs(30);

    let reader = lock.acquire_shared(&k, &once(ttl)).await.unwrap();
    let patient = AcquireOptions::new(ttl).wait(Duration::from_secs(60));
    let writing = lock.acquire(&k, &patient);
    let (asked, mark_pttl, refused) = tokio::select! {
        written = writing => panic!("the writer beside a reader: {written:?}"),
        seen = async {
            // The writer found the key read-held and marked itself.
            let began = Instant::now();
            loop {
                let asked = Instant::now();
                let pttl: i64 = query(&mut conn, &["PTTL", &mark]).await;
                if pttl > 0 {
                    let refused = lock.acquire_shared(&k, &once(ttl)).await;
                    break (asked, pttl, refused);
                }
                assert!(began.elapsed() < Duration::from_secs(10), "no mark");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } => seen,
    };
    assert!(
        matches!(refused, Err(tenure_api::LockError::Timeout { .. })),
        "a later reader beside a waiting writer: {refused:?}"
    );
    // The writer's future is gone (dropped by the select): its mark is taken back, well
    // before it would have run out.
    loop {
        let left: i64 = query(&mut conn, &["EXISTS", &mark]).await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Run out, it would be gone no sooner than its PTTL after it was asked.
    let gone_after = asked.elapsed();
    assert!(
        gone_after < Duration::from_millis(u64::try_from(mark_pttl).unwrap()),
        "the mark ran out ({gone_after:?}, PTTL {mark_pttl} ms) rather than being taken back"
    );
    let later = lock.acquire_shared(&k, &once(ttl)).await.unwrap();
    lock.release(later).await.unwrap();
    lock.release(reader).await.unwrap();
}
