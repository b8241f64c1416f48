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
//! `wait_replicas=1` no replica can confirm a grant, so the holders are refused: what
//! the option buys (no double grant from this lag) and what it costs (no lock while the
//! replicas are behind), measured; and what it leaves open: a replica that confirmed
//! dying with the primary, while one that did not is promoted.

use std::sync::Arc;
use std::time::Duration;

use tenure_api::{DistributedLock, LockError, LockKey};
use tenure_conformance::servers::redis::sentinel::RedisSentinels;
use tenure_conformance::servers::redis::sharded::RedisShardedCluster;
use tenure_conformance::servers::redis::RedisNode;
use tenure_redis::RedisLock;

use super::{
    contend, round_failed, setup_failed, Ending, Fault, Holder, Record, Trial, CONTENDER, HOLDER,
};
use crate::matrix::Target;

/// How long the sentinels, or the cluster's nodes, wait before they call a silent primary
/// down: long enough that a loaded machine does not fail one over on its own.
const DOWN_AFTER: Duration = Duration::from_secs(3);
/// The holders' leases: far longer than a failover takes, so a contender granted after
/// one is granted while its holder's lease runs.
const HOLD_TTL: Duration = Duration::from_secs(60);
/// How long the confirming replica, restarted, may take to sync with the promoted primary.
const REJOIN: Duration = Duration::from_secs(30);
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

/// One round of a Sentinel or Cluster failover with `pairs` trials.
pub(super) async fn round(fault: Fault, target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let confirmed = matches!(
        fault,
        Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailoverConfirmed
    );
    // One replica stays in step, confirms the grants, and dies with the primary.
    let keep = usize::from(fault == Fault::SentinelConfirmingReplicaLost);
    let group = match Group::start(fault).await {
        Ok(group) => group,
        Err(e) => return round_failed(pairs, "servers", LockError::backend(e)),
    };
    // The target's own options (e.g. `fence=counter`), and the confirmation asked for.
    let mut options: Vec<String> = target
        .harness
        .url()
        .split_once('?')
        .map(|(_, query)| query.to_owned())
        .into_iter()
        .collect();
    if confirmed {
        options.push("wait_replicas=1&wait_timeout_ms=100".into());
    }
    let url = match options.is_empty() {
        true => group.url(),
        false => format!("{}?{}", group.url(), options.join("&")),
    };
    let holder = match RedisLock::connect(&url).await {
        Ok(lock) => Arc::new(lock),
        Err(e) => return round_failed(pairs, "holder", e),
    };
    let (primary, keys) =
        match keys_on_one_primary(&group, &holder, target, fault, round, pairs).await {
            Ok(found) => found,
            Err(e) => return round_failed(pairs, "keys", LockError::backend(e)),
        };
    let lock_key = holder.lock_key(&keys[0]);
    let replicas = match group.replicas_of(&primary).await {
        Ok(replicas) if replicas.len() > keep => replicas,
        Ok(replicas) => {
            let e = format!("the primary has {} replica(s)", replicas.len());
            return round_failed(pairs, "replicas", LockError::backend(e));
        }
        Err(e) => return round_failed(pairs, "replicas", LockError::backend(e)),
    };
    let (confirming, behind) = replicas.split_at(keep);
    let confirming = confirming.first().cloned();
    let mut stranded = primary
        .strand_replicas(behind)
        .await
        .map_err(|e| e.to_string());
    // The confirming replica's link was closed too: it reconnects before the grants.
    if let (Some(replica), Ok(())) = (&confirming, &stranded) {
        stranded = reconnected(&primary, replica).await;
    }

    let mut holders = Vec::with_capacity(pairs);
    let mut trials = Vec::new();
    let holder: Arc<dyn DistributedLock> = holder;
    for key in keys {
        let record = Record::new(key);
        let lock = record.client(HOLDER, holder.clone());
        let refused = "the holder's grant was refused: no replica confirmed it";
        match lock.try_acquire(&record.key, HOLD_TTL).await {
            Ok(Some(lease)) => {
                let _ = record.register.write(lease.token(), 0);
                let ending = Ending::Lease(lease);
                holders.push((record, held(lock, ending), None));
            }
            Err(LockError::Unavailable { .. }) if confirmed => {
                holders.push((record, held(lock, Ending::Nothing), Some(refused)));
            }
            Ok(None) => trials.push(setup_failed(
                "holder",
                LockError::backend("the key was held"),
            )),
            Err(e) => trials.push(setup_failed("holder", e)),
        }
    }

    let mut killed = primary.kill().await.map_err(|e| e.to_string());
    if let (Some(replica), Ok(())) = (&confirming, &killed) {
        killed = replica.kill().await.map_err(|e| e.to_string());
    }
    let resumed: Result<Vec<()>, String> = behind
        .iter()
        .map(|r| r.resume().map_err(|e| e.to_string()))
        .collect();
    let failover = match (stranded, killed, resumed) {
        (Ok(()), Ok(()), Ok(_)) => group.wait_failover(&lock_key, &primary).await,
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
    };
    let failover = match (failover, &confirming) {
        (Ok(promoted), Some(replica)) => rejoin(replica, &promoted).await.map(|()| promoted),
        (failover, _) => failover,
    };
    let fired = failover.is_ok();

    // A fresh client finds the promoted primary; the witness asks through another.
    let contender = match RedisLock::connect(&url).await {
        Ok(lock) => Arc::new(lock) as Arc<dyn DistributedLock>,
        Err(e) => return round_failed(pairs, "contender", e),
    };
    let witness = RedisLock::connect(&url)
        .await
        .ok()
        .map(|lock| Arc::new(lock) as Arc<dyn DistributedLock>);
    let contenders: Vec<_> = holders
        .iter_mut()
        .map(|(record, _, _)| {
            record.witness = witness.clone();
            record.client(CONTENDER, contender.clone())
        })
        .collect();
    let outcomes = futures::future::join_all(
        holders
            .iter()
            .zip(&contenders)
            .map(|((record, _, _), contender)| contend(target, contender, &record.key)),
    )
    .await;
    // With wait_replicas, a promoted primary left without replicas confirms no grant.
    let orphaned = match (&failover, confirmed) {
        (Ok(promoted), true) => promoted
            .info_field("replication", "connected_slaves")
            .await
            .is_ok_and(|n| n.as_deref() == Some("0")),
        _ => false,
    };
    for (((record, holder, refused), contender), outcome) in
        holders.into_iter().zip(&contenders).zip(outcomes)
    {
        let refused_too = orphaned && outcome.granted.is_none();
        let mut trial = record
            .judge(target, holder, contender, outcome, fired)
            .await;
        if refused_too {
            trial.note = Some(
                "the promoted primary has no replica (connected_slaves:0), so wait_replicas \
                 refuses the contender too"
                    .into(),
            );
        } else if let (Some(refused), None) = (refused, &trial.note) {
            trial.note = Some(refused.to_owned());
        }
        if let Err(e) = &failover {
            trial.note = Some(format!("no failover: {e}"));
        }
        trials.push(trial);
    }
    trials
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
    let (synced, _) = tenure_conformance::retrying(REJOIN, || async {
        match replica
            .info_field("replication", "master_link_status")
            .await
        {
            Ok(Some(status)) if status == "up" => Ok(()),
            // Unavailable is what `retrying` tries again.
            Ok(status) => Err(LockError::Unavailable {
                message: format!("master_link_status {status:?}"),
                source: None,
            }),
            Err(e) => Err(LockError::backend(e.to_string())),
        }
    })
    .await;
    synced.map_err(|e| format!("the restarted replica did not sync: {e}"))
}

/// Waits until `replica` is back in sync with `primary`.
async fn reconnected(primary: &RedisNode, replica: &RedisNode) -> Result<(), String> {
    let (online, _) = tenure_conformance::retrying(REJOIN, || async {
        match primary.replica_online(replica).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::Unavailable {
                message: format!("{} not back in sync", replica.addr()),
                source: None,
            }),
            Err(e) => Err(LockError::backend(e.to_string())),
        }
    })
    .await;
    online.map_err(|e| e.to_string())
}

fn held(lock: Arc<dyn DistributedLock>, ending: Ending) -> Holder {
    Holder {
        lock,
        ending,
        stale_write: None,
    }
}

/// `pairs` trial keys whose locks all live on one primary (a Cluster spreads keys over
/// its three), with that primary.
async fn keys_on_one_primary(
    group: &Group,
    lock: &RedisLock,
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
            let on = group.primary_for(&lock.lock_key(&key)).await?;
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
