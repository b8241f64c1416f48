//! The read-write lock's scenarios: readers share, a writer excludes, a waiting writer
//! holds back later readers, each reader's lease is its own, and the shared mode is
//! declared truly.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{AcquireOptions, LockError, ReleaseOutcome, RwLock};

use super::{holder, queue_reaches, Ctx, Failure, Outcome, LONG_TTL};
use crate::ensure;

/// Two clients read at once; neither a writer nor a plain lock of the key gets in while
/// either reads; once both are gone a writer does, and excludes readers. Every grant's
/// token is larger than every earlier one, a reader's and a writer's alike.
pub async fn readers_share_and_a_writer_excludes(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("rw");
    let (rw_a, rw_b) = (
        RwLock::new(a, key.clone())?,
        RwLock::new(b.clone(), key.clone())?,
    );
    let first = rw_a.try_read(LONG_TTL).await?;
    let first = first.ok_or_else(|| Failure("a free key refused a reader".into()))?;
    let second = rw_b.try_read(LONG_TTL).await?;
    let second = second.ok_or_else(|| Failure("a second reader was refused".into()))?;
    ensure!(
        first.is_shared() && second.is_shared(),
        "readers' leases not marked shared"
    );
    let (t1, t2) = (first.fencing_token(), second.fencing_token());
    ensure!(t2 > t1, "reader token {t2} after {t1}");
    ensure!(
        rw_b.try_write(LONG_TTL).await?.is_none(),
        "a writer got in beside two readers"
    );
    ensure!(
        b.try_acquire(&key, LONG_TTL).await?.is_none(),
        "a plain lock got in beside readers"
    );
    ensure!(
        holder(&b, &key).await?.is_some(),
        "inspect shows a read-held key as free"
    );
    ensure!(
        first.release().await? == ReleaseOutcome::Released,
        "first reader's release"
    );
    ensure!(
        rw_b.try_write(LONG_TTL).await?.is_none(),
        "a writer got in beside a reader"
    );
    ensure!(
        second.release().await? == ReleaseOutcome::Released,
        "second reader's release"
    );
    let writer = rw_b.try_write(LONG_TTL).await?;
    let writer = writer.ok_or_else(|| Failure("a writer was refused a free key".into()))?;
    let tw = writer.fencing_token();
    ensure!(tw > t2, "writer token {tw} after reader token {t2}");
    ensure!(!writer.is_shared(), "the writer's lease is marked shared");
    ensure!(
        rw_a.try_read(LONG_TTL).await?.is_none(),
        "a reader got in beside the writer"
    );
    writer.release().await?;
    let again = rw_a.try_read(LONG_TTL).await?;
    let again = again.ok_or_else(|| Failure("a reader was refused after the writer".into()))?;
    ensure!(
        again.fencing_token() > tw,
        "reader token {} after writer token {tw}",
        again.fencing_token()
    );
    again.release().await?;
    Ok(())
}

/// A stream of overlapping readers, the key never free of them, does not starve a
/// writer: once it waits, the readers that come after it wait for it, and no reader
/// holds while it does.
pub async fn a_waiting_writer_is_not_starved_by_readers(ctx: &Ctx<'_>) -> Outcome {
    const EVERY: Duration = Duration::from_millis(100);
    const HOLD: Duration = Duration::from_millis(400);
    let key = ctx.key("rw");
    let readers = RwLock::new(ctx.client().await?, key.clone())?;
    let writer = RwLock::new(ctx.client().await?, key.clone())?;
    let wait = Duration::from_secs(20);
    // The stream starts before the writer asks, so the key is read-held when it does.
    let first = readers
        .read(&AcquireOptions::new(LONG_TTL).wait(wait))
        .await?;
    let (reading, writing, done) = (
        Arc::new(AtomicUsize::new(1)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let stream = {
        let (reading, writing, done) = (reading.clone(), writing.clone(), done.clone());
        async move {
            let mut readers_run = Vec::new();
            let mut first = Some(first);
            let began = Instant::now();
            while !done.load(Ordering::SeqCst) && began.elapsed() < wait {
                let (readers, reading, writing) =
                    (readers.clone(), reading.clone(), writing.clone());
                let held = first.take();
                readers_run.push(tokio::spawn(async move {
                    let guard = match held {
                        Some(guard) => guard,
                        None => {
                            let guard = readers
                                .read(&AcquireOptions::new(LONG_TTL).wait(wait))
                                .await?;
                            reading.fetch_add(1, Ordering::SeqCst);
                            guard
                        }
                    };
                    let beside_writer = writing.load(Ordering::SeqCst);
                    tokio::time::sleep(HOLD).await;
                    reading.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                    Ok::<bool, LockError>(beside_writer)
                }));
                tokio::time::sleep(EVERY).await;
            }
            let mut beside = 0;
            for run in readers_run {
                match run.await {
                    Ok(Ok(true)) => beside += 1,
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => return Err(Failure(format!("a reader: {e}"))),
                    Err(e) => return Err(Failure(format!("a reader's task: {e}"))),
                }
            }
            Ok::<usize, Failure>(beside)
        }
    };
    let write = async {
        // Let the stream overlap before the writer asks.
        tokio::time::sleep(HOLD).await;
        let asked = Instant::now();
        let result = writer
            .write(&AcquireOptions::new(LONG_TTL).wait(wait))
            .await;
        let outcome = match result {
            Ok(guard) => {
                writing.store(true, Ordering::SeqCst);
                let inside = reading.load(Ordering::SeqCst);
                tokio::time::sleep(HOLD).await;
                writing.store(false, Ordering::SeqCst);
                guard.release().await?;
                Ok((asked.elapsed(), inside))
            }
            Err(e) => Err(Failure(format!(
                "the writer, asking while readers kept coming: {e} after {:?}",
                asked.elapsed()
            ))),
        };
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let (beside, written) = tokio::join!(stream, write);
    let (waited, inside) = written?;
    ensure!(
        inside == 0,
        "{inside} reader(s) held beside the writer when it was granted"
    );
    let beside = beside?;
    ensure!(
        beside == 0,
        "{beside} reader(s) were granted while the writer held"
    );
    ensure!(waited < wait, "the writer waited {waited:?}");
    Ok(())
}

/// A writer that stops waiting (its wait ran out) lets the readers it held back in:
/// they are granted while the first reader still holds, not left behind a writer gone.
pub async fn a_writer_that_stops_waiting_lets_later_readers_in(ctx: &Ctx<'_>) -> Outcome {
    let key = ctx.key("rw");
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let (rw_a, rw_b, rw_c) = (
        RwLock::new(a, key.clone())?,
        RwLock::new(b, key.clone())?,
        RwLock::new(c, key.clone())?,
    );
    let first = rw_a.try_read(LONG_TTL).await?;
    let first = first.ok_or_else(|| Failure("a free key refused a reader".into()))?;
    let writer_wait = Duration::from_secs(2);
    let wait = Duration::from_secs(15);
    let writer_opts = AcquireOptions::new(LONG_TTL).wait(writer_wait);
    let write = rw_b.write(&writer_opts);
    let writer_began = Instant::now();
    let read = async {
        // Asks once the writer is in line, where the harness counts the queue (else once
        // it most likely is; asked sooner, it is granted at once, which passes there).
        let counted = ctx.harness.queued(&key).await.is_some();
        match counted {
            true => queue_reaches(ctx, &key, |n| n >= 2, "the writer queued").await?,
            false => tokio::time::sleep(writer_wait / 4).await,
        }
        let asked = Instant::now();
        let read = rw_c.read(&AcquireOptions::new(LONG_TTL).wait(wait)).await;
        Ok::<_, Failure>((read, asked, Instant::now(), counted))
    };
    let (written, read) = tokio::join!(write, read);
    let (read, asked, granted, counted) = read?;
    match written {
        Err(LockError::Timeout { .. }) => {}
        other => return Err(Failure(format!("the writer beside a reader: {other:?}"))),
    }
    let reader = read.map_err(|e| {
        Failure(format!(
            "the later reader, after the writer gave up: {e} after {:?}",
            asked.elapsed()
        ))
    })?;
    ensure!(!first.is_lost(), "the first reader's lease was lost");
    // Queued behind the writer, the reader waits for it: it is granted only once the
    // writer's wait has run out, and then at once, not at the end of its own wait.
    if counted {
        let behind = granted.duration_since(writer_began);
        ensure!(
            behind + Duration::from_millis(10) >= writer_wait,
            "the reader queued behind a waiting writer was granted {behind:?} after the \
             writer asked, within the writer's {writer_wait:?} wait"
        );
    }
    let waited = granted.duration_since(asked);
    ensure!(
        waited < wait / 2,
        "the later reader waited {waited:?}: not woken when the writer gave up"
    );
    reader.release().await?;
    first.release().await?;
    Ok(())
}

/// Each reader's lease is its own: one that expires unrenewed is lost alone (its
/// extend fails, its release says not held), the other reader's holds on and keeps
/// writers out, until it is released.
pub async fn a_readers_lease_ends_alone(ctx: &Ctx<'_>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let key = ctx.key("rw");
    let ttl = ctx.short_ttl();
    let once = |ttl| AcquireOptions::new(ttl).wait(Duration::ZERO);
    let mut short = a.acquire_shared(&key, &once(ttl)).await?;
    let mut long = b.acquire_shared(&key, &once(LONG_TTL)).await?;
    ensure!(
        short.is_shared() && long.is_shared(),
        "readers' leases not marked shared"
    );
    tokio::time::sleep(ttl * 2 + Duration::from_millis(500)).await;
    match a.extend(&mut short, ttl).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => return Err(Failure(format!("extend of an expired reader: {other:?}"))),
    }
    ensure!(
        a.try_acquire(&key, LONG_TTL).await?.is_none(),
        "a writer got in beside the reader still in date"
    );
    b.extend(&mut long, LONG_TTL).await?;
    let outcome = a.release(short).await?;
    ensure!(
        outcome == ReleaseOutcome::NotHeld,
        "release of an expired reader: {outcome:?}"
    );
    ensure!(
        b.release(long).await? == ReleaseOutcome::Released,
        "the other reader's release"
    );
    let writer = a.try_acquire(&key, LONG_TTL).await?;
    let writer =
        writer.ok_or_else(|| Failure("a writer was refused once both readers left".into()))?;
    a.release(writer).await?;
    Ok(())
}

/// What [`Capabilities::shared`](tenure_api::Capabilities::shared) says is true: with
/// it, a reader is granted; without it, asking for one is [`LockError::Config`] and a
/// read-write lock is refused at once, never taken exclusive instead.
pub async fn the_shared_mode_is_declared_truly(ctx: &Ctx<'_>) -> Outcome {
    let lock = ctx.client().await?;
    let key = ctx.key("rw");
    let once = AcquireOptions::new(LONG_TTL).wait(Duration::ZERO);
    let shared = lock.capabilities().shared;
    let asked = lock.acquire_shared(&key, &once).await;
    let built = RwLock::new(lock.clone(), key.clone());
    match (shared, asked, built) {
        (true, Ok(lease), Ok(_)) => {
            ensure!(lease.is_shared(), "the reader's lease is not marked shared");
            lock.release(lease).await?;
        }
        (false, Err(LockError::Config(_)), Err(LockError::Config(_))) => {
            ensure!(
                holder(&lock, &key).await?.is_none(),
                "a refused reader left a holder"
            );
        }
        (shared, asked, built) => {
            return Err(Failure(format!(
                "shared declared {shared}: acquire_shared gave {asked:?}, RwLock::new {:?}",
                built.map(|_| ())
            )))
        }
    }
    Ok(())
}
