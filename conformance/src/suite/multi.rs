//! The multi-lock's scenarios: all of several keys or none, without deadlock, and the
//! loss of one key reported while the others hold.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tenure_api::{AcquireOptions, LockError, LockKey, MultiLock, ReleaseOutcome};

use super::{holder, keepalive_ttl, must_acquire, Ctx, Failure, Outcome, LONG_TTL};
use crate::ensure;

/// A multi-lock that finds one of its keys held takes none (the keys it took are given
/// back); once the key is free it takes them all, each with its own token, and releases
/// them together.
pub async fn multilock_takes_all_keys_or_none(ctx: &Ctx<'_>) -> Outcome {
    let keys = [ctx.key("multi/a"), ctx.key("multi/b"), ctx.key("multi/c")];
    let (other, lock) = (ctx.client().await?, ctx.client().await?);
    let held = must_acquire(&other, &keys[1], LONG_TTL).await?;
    let multi = MultiLock::new(lock, keys.clone())?;
    let once = AcquireOptions::new(LONG_TTL).wait(Duration::ZERO);
    match multi.lock(&once).await {
        Err(LockError::Timeout { .. }) => {}
        other => return Err(Failure(format!("with a key held elsewhere: {other:?}"))),
    }
    for key in [&keys[0], &keys[2]] {
        ensure!(
            holder(&other, key).await?.is_none(),
            "`{key}` stayed held after the multi-lock gave up"
        );
    }
    other.release(held).await?;
    let guard = multi.lock(&once).await?;
    let tokens = guard.fencing_tokens();
    ensure!(tokens.len() == 3, "three keys, three tokens: {tokens:?}");
    for (key, token) in &tokens {
        let seen = other.inspect(key).await?;
        ensure!(seen.is_some(), "`{key}` is not held by the multi-lock");
        if let Some(reported) = seen.and_then(|h| h.token) {
            ensure!(
                reported == *token,
                "`{key}`: token {reported} held, {token} given"
            );
        }
    }
    let outcome = guard.release().await?;
    ensure!(outcome == ReleaseOutcome::Released, "release: {outcome:?}");
    for key in &keys {
        ensure!(holder(&other, key).await?.is_none(), "`{key}` not released");
    }
    Ok(())
}

/// Multi-locks on overlapping keys, each given its keys in another order, all get their
/// turns within a bound (no deadlock), and no key ever has two of them inside at once.
pub async fn multilocks_on_overlapping_keys_never_deadlock(ctx: &Ctx<'_>) -> Outcome {
    const ROUNDS: usize = 3;
    let [a, b, c] = [ctx.key("ring/a"), ctx.key("ring/b"), ctx.key("ring/c")];
    let sets = [
        vec![a.clone(), b.clone()],
        vec![c.clone(), b.clone()],
        vec![a.clone(), c.clone()],
        vec![c, b, a],
    ];
    let inside: Arc<Mutex<HashSet<LockKey>>> = Arc::default();
    let mut tasks = Vec::new();
    for keys in sets {
        let multi = MultiLock::new(ctx.client().await?, keys)?;
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(LONG_TTL).wait(Duration::from_secs(30));
            for _ in 0..ROUNDS {
                let guard = multi.lock(&opts).await?;
                for key in multi.keys() {
                    let fresh = inside
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(key.clone());
                    ensure!(fresh, "`{key}` had two multi-locks inside at once");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                for key in multi.keys() {
                    inside
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(key);
                }
                guard.release().await?;
            }
            Ok(())
        }));
    }
    let aborts: Vec<_> = tasks.iter().map(|task| task.abort_handle()).collect();
    let all = futures::future::join_all(tasks);
    let Ok(done) = tokio::time::timeout(Duration::from_secs(60), all).await else {
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
        return Err(Failure(
            "multi-locks on overlapping keys did not finish in 60 s".into(),
        ));
    };
    for result in done {
        result.map_err(|e| Failure(format!("a multi-lock task failed: {e}")))??;
    }
    Ok(())
}

/// When one key's lease is lost (here: released behind the guard's back), the guard
/// reports that key and keeps the others until it is released.
pub async fn multilock_reports_a_lost_member(ctx: &Ctx<'_>) -> Outcome {
    let keys = [ctx.key("lost/a"), ctx.key("lost/b")];
    let (lock, other) = (ctx.client().await?, ctx.client().await?);
    // Key b must stay renewed throughout: the keep-alive TTL, not the shortest.
    let ttl = keepalive_ttl(ctx);
    let multi = MultiLock::new(lock.clone(), keys.clone())?;
    let guard = multi
        .lock(&AcquireOptions::new(ttl).wait(Duration::from_secs(10)))
        .await?;
    let lease = guard.members()[0]
        .lease()
        .await
        .ok_or_else(|| Failure("the guard of the first key has no lease".into()))?;
    let outcome = lock.release(lease).await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "releasing behind the guard: {outcome:?}"
    );
    tokio::time::timeout(ttl * 4 + Duration::from_secs(5), guard.lost())
        .await
        .map_err(|_| Failure("the lost key was not reported".into()))?;
    let reasons: Vec<_> = guard
        .members()
        .iter()
        .map(|member| (member.key().clone(), member.lost_signal().reason()))
        .collect();
    ensure!(
        guard.lost_keys() == [keys[0].clone()],
        "lost keys: {:?}; why: {reasons:?}",
        guard.lost_keys()
    );
    ensure!(
        holder(&other, &keys[1]).await?.is_some(),
        "the other key was let go with the lost one"
    );
    let outcome = guard.release().await?;
    ensure!(
        outcome == ReleaseOutcome::NotHeld,
        "release with a lost key: {outcome:?}"
    );
    ensure!(
        holder(&other, &keys[1]).await?.is_none(),
        "the other key not released"
    );
    Ok(())
}
