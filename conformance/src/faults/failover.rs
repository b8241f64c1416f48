//! Failovers of servers that replicate asynchronously, as people run them (for Redis: a
//! primary with one replica an operator promotes, a Sentinel-managed primary with two
//! replicas and three sentinels, and a Redis Cluster of three primaries with a replica
//! each), on a deployment the backend's testbed starts afresh for every round
//! ([`ReplicatedServers`]).
//!
//! A round strands the replicas of the trials' primary — so its writes reach none of them
//! (the replication lag in which an asynchronous failover loses writes, made certain) —
//! then each holder asks for its key once, the primary is killed, the replicas resume,
//! and the deployment promotes one of them. Each contender then asks the promoted
//! primary through a fresh client, while its holder's lease still runs. With a
//! replica's confirmation asked for and every replica stranded, no replica can confirm a
//! grant, so the holders are refused: what the option buys (no double grant from this
//! lag) and what it costs (no lock while the replicas are behind), measured. With one
//! replica kept in step to confirm the grants and killed with the primary: what it
//! leaves open.

use std::sync::Arc;
use std::time::Duration;

use super::cell::{Trial, Verdict};
use super::replicated::{Deployments, ReplicatedServers};
use super::rounds::after_failover;
use super::trial::{round_failed, setup_failed, Ending, Holder, Record, HOLDER};
use super::{Fault, Target};
use crate::servers::Node;
use tenure_api::{DistributedLock, LockError, LockKey};

/// The holders' leases: longer than everything between the grant and the contender's
/// answer may take (a promotion, up to 60 s; a replica's sync; the contender's wait), so a contender
/// granted after the failover is granted while its holder's lease runs.
const HOLD_TTL: Duration = Duration::from_secs(300);
/// Tries at a round whose servers could not be set up (nothing was injected yet).
const SETUP_TRIES: usize = 2;
/// Key names tried per trial to find one whose slot the round's primary serves.
const KEY_CANDIDATES: usize = 64;

/// One round of a failover with `pairs` trials. A round whose servers,
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
    deployments: Deployments,
    servers: Box<dyn ReplicatedServers>,
    nodes: Vec<Arc<dyn Node>>,
    /// The contender's and the witness's URL (the holder's may wait less).
    url: String,
    holder: Arc<dyn DistributedLock>,
    keys: Vec<LockKey>,
    primary: usize,
    /// The replica kept in step, to confirm the grants and die with the primary.
    confirming: Option<usize>,
    /// The stranded replicas (frozen until [`Setup::run`] resumes them).
    behind: Vec<usize>,
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
    let deployments = target.deployments.clone().ok_or((
        "servers",
        LockError::backend("the target declares no replicated deployments"),
    ))?;
    let servers = (deployments.start)(fault)
        .await
        .map_err(backend("servers"))?;
    let nodes = servers.nodes();
    // The target's own options (e.g. `fence=counter`), and the confirmation asked for.
    let options: Vec<String> = target
        .harness
        .url()
        .split_once('?')
        .map(|(_, query)| query.to_owned())
        .into_iter()
        .collect();
    // Where a replica must confirm, the wait is patient; where none can (every replica
    // stranded), the holders' is short: each waits it out while the replicas are frozen.
    let (patient, hasty) = (
        deployments.confirmed_query,
        deployments.hasty_confirmed_query,
    );
    let (holder_wait, wait) = match fault {
        Fault::SentinelFailoverConfirmed | Fault::ClusterFailoverConfirmed => {
            (Some(hasty), Some(patient))
        }
        Fault::SentinelConfirmingReplicaLost => (Some(patient), Some(patient)),
        _ => (None, None),
    };
    let url_with = |extra: Option<&str>| {
        let options: Vec<&str> = options.iter().map(String::as_str).chain(extra).collect();
        match options.is_empty() {
            true => servers.url(),
            false => format!("{}?{}", servers.url(), options.join("&")),
        }
    };
    let url = url_with(wait);
    let holder = target.harness.client_of(url_with(holder_wait)).await;
    let holder = holder.map_err(|e| ("holder", e))?;
    let (primary, keys) =
        keys_on_one_primary(servers.as_ref(), &deployments, target, fault, round, pairs)
            .await
            .map_err(backend("keys"))?;
    let replicas = servers
        .replicas_of(primary)
        .await
        .map_err(backend("replicas"))?;
    let keep = usize::from(fault == Fault::SentinelConfirmingReplicaLost);
    if replicas.len() <= keep {
        let e = format!("the primary has {} replica(s)", replicas.len());
        return Err(("replicas", LockError::backend(e)));
    }
    // Every replica in sync first: one that never synced is too stale to be promoted.
    for &replica in &replicas {
        servers
            .in_sync(primary, replica)
            .await
            .map_err(backend("replicas"))?;
    }
    let (confirming, behind) = replicas.split_at(keep);
    let setup = Setup {
        fault,
        deployments,
        servers,
        nodes,
        url,
        holder,
        keys,
        confirming: confirming.first().copied(),
        behind: behind.to_vec(),
        primary,
    };
    // On an error, dropping the setup kills every server, frozen or not.
    let stranded = setup.servers.strand(setup.primary, &setup.behind).await;
    stranded.map_err(backend("replicas"))?;
    // Stranding closed the confirming replica's link too: it reconnects first.
    if let Some(replica) = setup.confirming {
        setup
            .servers
            .in_sync(setup.primary, replica)
            .await
            .map_err(backend("replicas"))?;
    }
    Ok(setup)
}

impl Setup {
    fn resume_behind(&self) -> Result<(), String> {
        for &replica in &self.behind {
            self.nodes[replica].resume().map_err(|e| e.to_string())?;
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
                    if refusal_expected && message.contains(self.deployments.unconfirmed) =>
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

        let server_key = (self.deployments.server_key)(&self.keys[0]);
        let failover = self.fail_over(&server_key).await;
        // With a confirmation asked for, a promoted primary left without replicas
        // confirms no grant.
        let orphaned = match (&failover, refusal_expected) {
            (Ok(promoted), true) => self.servers.connected_replicas(*promoted).await == Ok(0),
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
                    "the promoted primary has no replica connected, so the confirmation \
                     asked for refuses the contender too"
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
    async fn fail_over(&self, server_key: &str) -> Result<usize, String> {
        let kill =
            |node: usize| async move { self.nodes[node].kill().await.map_err(|e| e.to_string()) };
        let killed = kill(self.primary).await;
        let killed = match (self.confirming, killed) {
            (Some(replica), Ok(())) => kill(replica).await,
            (_, killed) => killed,
        };
        let resumed = self.resume_behind();
        killed?;
        resumed?;
        let promoted = self.servers.wait_failover(server_key, self.primary).await?;
        if let Some(replica) = self.confirming {
            self.servers.rejoin(replica, promoted).await?;
        }
        Ok(promoted)
    }
}

/// `pairs` trial keys whose locks all live on one primary (a sharded deployment spreads
/// keys over its primaries), with that primary.
async fn keys_on_one_primary(
    servers: &dyn ReplicatedServers,
    deployments: &Deployments,
    target: &Target,
    fault: Fault,
    round: usize,
    pairs: usize,
) -> Result<(usize, Vec<LockKey>), String> {
    let mut primary: Option<usize> = None;
    let mut keys = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let base = target.key(fault, round, i);
        let mut found = None;
        for candidate in 0..KEY_CANDIDATES {
            let key = LockKey::new(format!("{}/{candidate}", base.as_str()))
                .map_err(|e| e.to_string())?;
            let on = servers.primary_of(&(deployments.server_key)(&key)).await?;
            match primary {
                Some(p) if p != on => continue,
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
