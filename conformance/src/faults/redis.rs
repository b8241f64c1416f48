//! Real failovers of Redis as people run it: a Sentinel-managed primary with two
//! replicas and three sentinels, and a Redis Cluster of three primaries with a replica
//! each, started afresh for every round.
//!
//! A round strands the replicas of the trials' primary — frozen, their links closed by
//! the primary, so its writes reach none of them (the replication lag in which an
//! asynchronous failover loses writes, made certain) — then each holder asks for its
//! key once, the primary is killed, the replicas resume, and the sentinels or the
//! cluster promote one of them on their own. Each contender then asks the promoted
//! primary through a fresh client, while its holder's lease still runs. With
//! `wait_replicas=1` and every replica stranded, no replica can confirm a grant, so the
//! holders are refused: what the option buys (no double grant from this lag) and what it
//! costs (no lock while the replicas are behind), measured. With one replica kept in step
//! to confirm the grants and killed with the primary: what it leaves open.

use std::sync::Arc;
use std::time::Duration;

use super::cell::{Trial, Verdict};
use super::rounds::after_failover;
use super::target::RedisKeyFn;
use super::trial::{round_failed, setup_failed, Ending, Holder, Record, HOLDER};
use super::{Fault, Target};
use crate::servers::poll_until;
use crate::servers::redis::sentinel::RedisSentinels;
use crate::servers::redis::sharded::RedisShardedCluster;
use crate::servers::redis::RedisNode;
use tenure_api::{DistributedLock, LockError, LockKey};

/// How long the sentinels, or the cluster's nodes, wait before they call a silent primary
/// down: long enough that a loaded machine does not fail one over on its own.
const DOWN_AFTER: Duration = Duration::from_secs(3);
/// How long a replica may take to come (back) in sync with its primary.
const SYNC: Duration = Duration::from_secs(30);
/// The holders' leases: longer than everything between the grant and the contender's
/// answer may take (a promotion, up to 60 s; a replica's sync; the contender's wait), so a contender
/// granted after the failover is granted while its holder's lease runs.
const HOLD_TTL: Duration = Duration::from_secs(300);
/// Tries at a round whose servers could not be set up (nothing was injected yet).
const SETUP_TRIES: usize = 2;
/// Key names tried per trial to find one whose slot the round's primary serves.
const KEY_CANDIDATES: usize = 64;

/// The servers of one round.
enum Group {
    Sentinel(RedisSentinels),
    Cluster(RedisShardedCluster),
}

impl Group {
    async fn start(fault: Fault) -> Result<Group, String> {
        let started = match fault {
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost => {
                RedisSentinels::start(DOWN_AFTER).await.map(Group::Sentinel)
            }
            _ => RedisShardedCluster::start(DOWN_AFTER)
                .await
                .map(Group::Cluster),
        };
        started.map_err(|e| e.to_string())
    }

    fn url(&self) -> String {
        match self {
            Group::Sentinel(group) => group.url(),
            Group::Cluster(cluster) => cluster.url(),
        }
    }

    /// The primary that holds `lock_key`.
    async fn primary_for(&self, lock_key: &str) -> Result<Arc<RedisNode>, String> {
        let primary = match self {
            Group::Sentinel(group) => group.primary().await,
            Group::Cluster(cluster) => cluster.primary_of(lock_key).await,
        };
        primary.map_err(|e| e.to_string())
    }

    async fn replicas_of(&self, primary: &RedisNode) -> Result<Vec<Arc<RedisNode>>, String> {
        match self {
            Group::Sentinel(group) => Ok(group
                .data_nodes()
                .iter()
                .filter(|n| n.addr() != primary.addr())
                .cloned()
                .collect()),
            Group::Cluster(cluster) => cluster
                .replicas_of(primary)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Waits for a replica to take over `lock_key` from `old`; returns it.
    async fn wait_failover(
        &self,
        lock_key: &str,
        old: &RedisNode,
    ) -> Result<Arc<RedisNode>, String> {
        let promoted = match self {
            Group::Sentinel(group) => group.wait_failover(old.addr()).await,
            Group::Cluster(cluster) => cluster.wait_failover(lock_key, old.addr()).await,
        };
        promoted.map_err(|e| e.to_string())
    }
}

/// The text of `wait_replicas`'s refusal (`tenure-redis`).
const UNCONFIRMED: &str = "replicas wait_replicas asks for";

/// One round of a Sentinel or Cluster failover with `pairs` trials. A round whose servers,
/// keys or stranded replicas could not be set up is tried again once: nothing was
/// injected yet.
pub(super) async fn round(fault: Fault, target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let mut failed = None;
    for _ in 0..SETUP_TRIES {
        match set_up(fault, target, round, pairs).await {
            Ok(setup) => return setup.run(target, pairs).await,
            Err((what, e)) => failed = Some((what, e)),
        }
    }
    let (what, e) = failed.expect("at least one try");
    round_failed(pairs, what, e)
}

/// A round with its servers up, the trials' keys on one primary and the replicas stranded.
struct Setup {
    fault: Fault,
    group: Group,
    /// The contender's and the witness's URL (the holder's may wait less).
    url: String,
    holder: Arc<dyn DistributedLock>,
    /// Where the backend keeps a lock (see [`RedisKeyFn`]).
    key_of: RedisKeyFn,
    keys: Vec<LockKey>,
    primary: Arc<RedisNode>,
    /// The replica kept in step, to confirm the grants and die with the primary.
    confirming: Option<Arc<RedisNode>>,
    /// The stranded replicas (frozen until [`Setup::run`] resumes them).
    behind: Vec<Arc<RedisNode>>,
}

type SetupError = (&'static str, LockError);

fn backend(what: &'static str) -> impl FnOnce(String) -> SetupError {
    move |e| (what, LockError::backend(e))
}

async fn set_up(
    fault: Fault,
    target: &Target,
    round: usize,
    pairs: usize,
) -> Result<Setup, SetupError> {
    let group = Group::start(fault).await.map_err(backend("servers"))?;
    // The target's own options (e.g. `fence=counter`), and the confirmation asked for.
    let options: Vec<String> = target
        .harness
        .url()
        .split_once('?')
        .map(|(_, query)| query.to_owned())
        .into_iter()
        .collect();
    // Where a replica must confirm, WAIT is patient (a replica acks within a round trip,
    // but on two loaded cores that can take long); where none can (every replica
    // stranded), the holders' is short: each waits it out while the replicas are frozen.
    let patient = "wait_replicas=1&wait_timeout_ms=2000&request_timeout_ms=5000";
    let (holder_wait, wait) = match fault {
        Fault::SentinelFailoverConfirmed | Fault::ClusterFailoverConfirmed => {
            (Some("wait_replicas=1&wait_timeout_ms=100"), Some(patient))
        }
        Fault::SentinelConfirmingReplicaLost => (Some(patient), Some(patient)),
        _ => (None, None),
    };
    let url_with = |extra: Option<&str>| {
        let options: Vec<&str> = options.iter().map(String::as_str).chain(extra).collect();
        match options.is_empty() {
            true => group.url(),
            false => format!("{}?{}", group.url(), options.join("&")),
        }
    };
    let url = url_with(wait);
    let key_of = target.redis_key.clone().ok_or((
        "servers",
        LockError::backend("the target declares no Redis deployments"),
    ))?;
    let holder = target.harness.client_of(url_with(holder_wait)).await;
    let holder = holder.map_err(|e| ("holder", e))?;
    let (primary, keys) = keys_on_one_primary(&group, &key_of, target, fault, round, pairs)
        .await
        .map_err(backend("keys"))?;
    let replicas = group
        .replicas_of(&primary)
        .await
        .map_err(backend("replicas"))?;
    let keep = usize::from(fault == Fault::SentinelConfirmingReplicaLost);
    if replicas.len() <= keep {
        let e = format!("the primary has {} replica(s)", replicas.len());
        return Err(("replicas", LockError::backend(e)));
    }
    // Every replica in sync first: one that never synced is too stale to be promoted.
    for replica in &replicas {
        in_sync(&primary, replica)
            .await
            .map_err(backend("replicas"))?;
    }
    let (confirming, behind) = replicas.split_at(keep);
    let setup = Setup {
        fault,
        group,
        url,
        holder,
        key_of,
        keys,
        confirming: confirming.first().cloned(),
        behind: behind.to_vec(),
        primary,
    };
    // On an error, dropping the setup kills every server, frozen or not.
    let stranded = setup.primary.strand_replicas(&setup.behind).await;
    stranded.map_err(|e| ("replicas", LockError::backend(e.to_string())))?;
    // CLIENT KILL closed the confirming replica's link too: it reconnects first.
    if let Some(replica) = &setup.confirming {
        in_sync(&setup.primary, replica)
            .await
            .map_err(backend("replicas"))?;
    }
    Ok(setup)
}

impl Setup {
    fn resume_behind(&self) -> Result<(), String> {
        for replica in &self.behind {
            replica.resume().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Grants, the primary's death, the promotion, and the trials judged.
    async fn run(self, target: &Target, pairs: usize) -> Vec<Trial> {
        // Refusals are the point only where every replica is stranded.
        let refusal_expected = matches!(
            self.fault,
            Fault::SentinelFailoverConfirmed | Fault::ClusterFailoverConfirmed
        );
        let mut holders = Vec::with_capacity(pairs);
        let mut refused = Vec::with_capacity(pairs);
        let mut trials = Vec::new();
        let holder: Arc<dyn DistributedLock> = self.holder.clone();
        for key in &self.keys {
            let record = Record::new(key.clone());
            let lock = record.client(HOLDER, holder.clone());
            match lock.try_acquire(&record.key, HOLD_TTL).await {
                Ok(Some(lease)) => {
                    let increment = record.counter.read(lease.token());
                    let holder = Holder {
                        increment: Some(increment),
                        ..Holder::idle(lock, Ending::Lease(lease))
                    };
                    holders.push((record, holder));
                    refused.push(false);
                }
                Err(LockError::Unavailable { message, .. })
                    if refusal_expected && message.contains(UNCONFIRMED) =>
                {
                    holders.push((record, Holder::idle(lock, Ending::Nothing)));
                    refused.push(true);
                }
                Ok(None) => trials.push(setup_failed(
                    "holder",
                    LockError::backend("the key was held"),
                )),
                Err(e) => trials.push(setup_failed("holder", e)),
            }
        }

        let lock_key = (self.key_of)(&self.keys[0]);
        let failover = self.fail_over(&lock_key).await;
        // With wait_replicas, a promoted primary left without replicas confirms no grant.
        let orphaned = match (&failover, refusal_expected) {
            (Ok(promoted), true) => promoted
                .info_field("replication", "connected_slaves")
                .await
                .is_ok_and(|n| n.as_deref() == Some("0")),
            _ => false,
        };
        let url = &self.url;
        let connect = || async move { target.harness.client_of(url.clone()).await };
        let judged = match after_failover(target, holders, connect, failover.is_ok()).await {
            Ok(judged) => judged,
            Err(e) => return round_failed(pairs, "contender", e),
        };
        for (mut trial, refused) in judged.into_iter().zip(refused) {
            let note = match &failover {
                Err(e) => Some(format!("no failover: {e}")),
                Ok(_) if orphaned && trial.verdict == Verdict::Unavail => Some(
                    "the promoted primary has no replica (connected_slaves:0), so \
                     wait_replicas refuses the contender too"
                        .into(),
                ),
                Ok(_) if refused && trial.note.is_none() => {
                    Some("the holder's grant was refused: no replica confirmed it".into())
                }
                Ok(_) => trial.note.take(),
            };
            trial.note = note;
            trials.push(trial);
        }
        trials
    }

    /// Kills the primary (and the confirming replica), resumes the stranded replicas and
    /// waits for the promotion; returns the promoted primary once a grant on it can be
    /// confirmed where a replica is left to confirm it.
    async fn fail_over(&self, lock_key: &str) -> Result<Arc<RedisNode>, String> {
        let killed = self.primary.kill().await.map_err(|e| e.to_string());
        let killed = match (&self.confirming, killed) {
            (Some(replica), Ok(())) => replica.kill().await.map_err(|e| e.to_string()),
            (_, killed) => killed,
        };
        let resumed = self.resume_behind();
        killed?;
        resumed?;
        let promoted = self.group.wait_failover(lock_key, &self.primary).await?;
        if let Some(replica) = &self.confirming {
            rejoin(replica, &promoted).await?;
        } else if let Group::Sentinel(group) = &self.group {
            // The sentinels point the other replica at the promoted one.
            let others = group
                .data_nodes()
                .iter()
                .filter(|n| n.addr() != promoted.addr() && n.is_running());
            for replica in others {
                in_sync(&promoted, replica).await?;
            }
        }
        Ok(promoted)
    }
}

/// The replica that confirmed the grants restarts empty (no persistence) and follows the
/// promoted primary, as the sentinels would have it do (after their failover timeout); a
/// grant on the promoted primary can then be confirmed. Waits until it is in sync.
async fn rejoin(replica: &RedisNode, promoted: &RedisNode) -> Result<(), String> {
    replica.restart().await.map_err(|e| e.to_string())?;
    let (ip, port) = (promoted.addr().ip().to_string(), promoted.addr().port());
    let reply = replica
        .command(&["REPLICAOF", &ip, &port.to_string()])
        .await
        .map_err(|e| e.to_string())?;
    if !reply.is_ok() {
        return Err(format!("REPLICAOF answered {reply:?}"));
    }
    in_sync(promoted, replica).await
}

/// Waits (up to [`SYNC`]) until `primary` reports `replica` connected and in sync.
async fn in_sync(primary: &RedisNode, replica: &RedisNode) -> Result<(), String> {
    let online = || async {
        match primary.replica_online(replica).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(None),
            Err(e) => Err(Some(e.to_string())),
        }
    };
    poll_until(SYNC, Duration::from_millis(50), online, |last| {
        format!(
            "{} in sync with {}{}",
            replica.addr(),
            primary.addr(),
            last.map(|e| format!(" (last: {e})")).unwrap_or_default()
        )
    })
    .await
    .map_err(|e| e.to_string())
}

/// `pairs` trial keys whose locks all live on one primary (a Cluster spreads keys over
/// its three), with that primary.
async fn keys_on_one_primary(
    group: &Group,
    key_of: &RedisKeyFn,
    target: &Target,
    fault: Fault,
    round: usize,
    pairs: usize,
) -> Result<(Arc<RedisNode>, Vec<LockKey>), String> {
    let mut primary: Option<Arc<RedisNode>> = None;
    let mut keys = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let base = target.key(fault, round, i);
        let mut found = None;
        for candidate in 0..KEY_CANDIDATES {
            let key = LockKey::new(format!("{}/{candidate}", base.as_str()))
                .map_err(|e| e.to_string())?;
            let on = group.primary_for(&key_of(&key)).await?;
            match &primary {
                Some(p) if p.addr() != on.addr() => continue,
                Some(_) => {}
                None => primary = Some(on),
            }
            found = Some(key);
            break;
        }
        keys.push(found.ok_or("no key on the round's primary among the candidates")?);
    }
    let primary = primary.ok_or("no trials")?;
    Ok((primary, keys))
}
