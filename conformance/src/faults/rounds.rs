//! Server faults: a round injects one fault into the servers under several trials at
//! once (a kill, a pause, a partition, a failover) and judges each pair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_api::{
    AcquireOptions, DistributedLock, LockError, LockKey, ReleaseOutcome, Replication,
};

use super::cell::{Trial, Verdict};
use super::failover;
use super::inject::{clock_jump_ttl, exited, heal, inject, Evidence};
use super::trial::{
    contend, describe, hold, round_failed, setup_failed, short, Holder, Record, CONTENDER, HOLDER,
};
use super::{Fault, Target};
use crate::proxy::ProxyMode;
use crate::{retrying, History, Links, LostUpdates};

/// Which nodes each side of a partitioned Redlock trial reaches: the holder the first
/// majority, the contender the last; they share one node (the middle one).
pub(super) fn redlock_sides(nodes: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let quorum = nodes / 2 + 1;
    let holder: Vec<usize> = (0..quorum).collect();
    let contender: Vec<usize> = (nodes - quorum..nodes).collect();
    (holder, contender, quorum - 1)
}

/// A client reaching only the nodes in `reach` (the others black-holed).
pub(super) async fn partitioned(
    target: &Target,
    reach: &[usize],
) -> Result<(Arc<dyn DistributedLock>, Links), LockError> {
    let (lock, links) = target
        .harness
        .proxied_client(target.harness.cut_options())
        .await?;
    for (i, proxy) in links.proxies().iter().enumerate() {
        if !reach.contains(&i) {
            proxy.set_mode(ProxyMode::Blackhole);
        }
    }
    Ok((lock, links))
}

/// Whether the servers are independent masters a client asks a majority of (Redlock).
pub(super) fn independent_quorum(target: &Target) -> bool {
    matches!(
        target.caps.replication,
        Replication::IndependentQuorum { .. }
    )
}

/// The node a server fault hits: the leader if there is one, else node 0; for a
/// partitioned Redlock, the node both sides share.
pub(super) async fn victim(target: &Target) -> usize {
    if independent_quorum(target) {
        return redlock_sides(target.nodes.len()).2;
    }
    match &target.leader {
        Some(leader) => leader().await.unwrap_or(0),
        None => 0,
    }
}

/// One injection of a server fault with `pairs` trials around it.
pub(super) async fn server_round(
    fault: Fault,
    target: &Target,
    round: usize,
    pairs: usize,
) -> Vec<Trial> {
    if fault == Fault::ReplicaFailover {
        return replica_failover(target, round, pairs).await;
    }
    if fault.is_topology_failover() {
        return failover::round(fault, target, round, pairs).await;
    }
    if fault == Fault::MinorityLoss {
        return minority_loss(target, round, pairs).await;
    }
    let n = target.nodes.len();
    let redlock = independent_quorum(target) && fault != Fault::ServerPause;
    let (mut holder_side, mut contender_side, _) = redlock_sides(n);
    // A minority partition on ZooKeeper: the holder talks to one follower only, the
    // contender to the others (the leader's side).
    let follower = match fault {
        Fault::MinorityPartition if !redlock => Some((victim(target).await + 1) % n),
        _ => None,
    };
    if let Some(f) = follower {
        holder_side = vec![f];
        contender_side = (0..n).filter(|&i| i != f).collect();
    }
    // On Redlock: the holder takes the lock on every master, then loses its links to a
    // majority (it keeps the first ⌊n/2⌋); the contender reaches only that majority.
    let cut: Vec<usize> = match fault {
        Fault::MinorityPartition if redlock => (n / 2..n).collect(),
        _ => Vec::new(),
    };
    if !cut.is_empty() {
        holder_side = (0..n).collect();
        contender_side = cut.clone();
    }
    let mut clients = Vec::with_capacity(pairs);
    let mut early = Vec::new();
    for pair in 0..pairs {
        let record = Record::new(target.key(fault, round, pair));
        let sides = if redlock || follower.is_some() {
            // The follower may still be rejoining after the previous round.
            let side =
                |reach| retrying(Duration::from_secs(30), move || partitioned(target, reach));
            (side(&holder_side).await.0, side(&contender_side).await.0)
        } else {
            // A server restarted by the previous round may still be recovering (slowly,
            // with every other backend's trials running on the same two cores).
            let direct = |_| async {
                let (client, _) = retrying(Duration::from_secs(30), || target.client()).await;
                client.map(|c| (c, Links::empty()))
            };
            (direct(0).await, direct(1).await)
        };
        match sides {
            (Ok((lock, holder_links)), Ok((contender, contender_links))) => {
                let contender = record.client(CONTENDER, contender);
                clients.push((record, lock, contender, [holder_links, contender_links]));
            }
            (Err(e), _) | (_, Err(e)) => early.push(setup_failed("clients", e)),
        }
    }
    // A clock jump is judged against the holder's own deadline (a bare lease: what a
    // holder between two renewals relies on); other faults against a renewing guard.
    // Bare leases are taken all at once, just before the injection, so that each still
    // runs when the fault lands.
    let guard = fault != Fault::ClockJump;
    let ttl = match guard {
        true => target.ttl,
        false => clock_jump_ttl(target),
    };
    let holds = clients
        .iter()
        .map(|(record, lock, _, _)| hold(record, lock.clone(), ttl, guard));
    let taken = if guard {
        // Renewing holders keep their locks: one after another spares the two cores.
        let mut taken = Vec::with_capacity(clients.len());
        for hold in holds {
            taken.push(hold.await);
        }
        taken
    } else {
        futures::future::join_all(holds).await
    };
    let mut pairs_held = Vec::with_capacity(taken.len());
    for (taken, (record, _, contender, links)) in taken.into_iter().zip(clients) {
        match taken {
            Ok(holder) => pairs_held.push((record, holder, contender, links)),
            Err(e) => early.push(setup_failed("holder", e)),
        }
    }
    let node = match follower {
        Some(f) => f,
        None => victim(target).await,
    };
    let dropped = || match (follower, &target.peer_links) {
        (Some(f), Some(links)) => links.dropped(f),
        _ => 0,
    };
    let dropped_before = dropped();
    // Bytes black-holed on each holder's cut links.
    let blackholed = |links: &[Links; 2]| -> u64 {
        cut.iter()
            .filter_map(|&i| links[0].proxies().get(i))
            .map(|p| p.stats().bytes_blackholed)
            .sum()
    };
    let blackholed_before: Vec<u64> = pairs_held
        .iter()
        .map(|(_, _, _, links)| blackholed(links))
        .collect();

    let fired = if cut.is_empty() {
        inject(fault, target, node).await
    } else {
        for (_, _, _, links) in &pairs_held {
            for &i in &cut {
                if let Some(proxy) = links[0].proxies().get(i) {
                    proxy.set_mode(ProxyMode::Blackhole);
                }
            }
        }
        Ok(Evidence(
            "the holder's traffic to a majority of the masters was black-holed".into(),
        ))
    };
    // By now the server sees the fault (a clock jump has been read and applied).
    let landed = Instant::now();
    let outcomes = futures::future::join_all(
        pairs_held
            .iter()
            .map(|(record, _, contender, _)| contend(target, contender, record)),
    )
    .await;
    let mut trials = early;
    // Every pair is judged at once, as its contender got the lock: one after another,
    // the later pairs' witnesses would ask (and their contenders write) after their
    // leases ran out, waiting on the earlier pairs' stale holders.
    let (injected, dropped, blackholed) = (&fired, &dropped, &blackholed);
    let partitioned = !cut.is_empty();
    let judged = pairs_held
        .into_iter()
        .zip(outcomes)
        .zip(blackholed_before)
        .map(
            |(((record, holder, contender, links), outcome), before)| async move {
                let mut fired = injected.is_ok();
                if fault == Fault::ClockJump {
                    // The jump counts only where it landed while the holder still believed.
                    fired &= record.history.believed_at(HOLDER, landed);
                }
                if follower.is_some() {
                    // Evidence: the follower's traffic with the other members was dropped.
                    fired &= dropped() > dropped_before;
                }
                if partitioned {
                    // Evidence: the holder's requests to the cut-off majority were dropped.
                    fired &= blackholed(&links) > before;
                }
                record
                    .judge(target, holder, &contender, outcome, fired)
                    .await
            },
        );
    trials.extend(futures::future::join_all(judged).await);
    let healed = heal(fault, target, node).await;
    for trial in &mut trials {
        let note = match (&fired, &healed) {
            (Err(e), _) => format!("injection failed: {e}"),
            (Ok(_), Err(e)) => format!("heal failed: {e}"),
            (Ok(evidence), Ok(())) => evidence.to_string(),
        };
        trial.note.get_or_insert(note);
    }
    trials
}

/// Kills a minority (the leader first, where there is one), runs hand-offs between two
/// healthy clients per pair, and restarts the killed nodes.
pub(super) async fn minority_loss(target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let n = target.nodes.len();
    let leader = victim(target).await;
    let doomed: Vec<usize> = std::iter::once(leader)
        .chain((0..n).filter(|&i| i != leader))
        .take((n - 1) / 2)
        .collect();
    // Evidence: every doomed server's process exited.
    let mut killed = Ok(());
    for &i in &doomed {
        let node = &target.nodes[i];
        let Some(pid) = node.pid() else {
            killed = Err(format!("node {i} was not running"));
            continue;
        };
        if let Err(e) = node.kill().await {
            killed = Err(e.to_string());
        } else if !exited(pid) || node.is_running() {
            killed = Err(format!(
                "node {i} (pid {pid}) is still running after SIGKILL"
            ));
        }
    }
    let mut trials = futures::future::join_all((0..pairs).map(|pair| {
        let key = target.key(Fault::MinorityLoss, round, pair);
        let fired = killed.is_ok();
        async move { hand_off(target, &key, fired).await }
    }))
    .await;
    let mut restarted = Ok(());
    for &i in &doomed {
        if let Err(e) = target.nodes[i].restart().await {
            restarted = Err(format!("node {i} did not come back: {e}"));
        }
    }
    for trial in &mut trials {
        let note = match (&killed, &restarted) {
            (Err(e), _) => format!("injection failed: {e}"),
            (Ok(()), Err(e)) => format!("heal failed: {e}"),
            (Ok(()), Ok(())) => {
                Evidence(format!("{} server process(es) exited", doomed.len())).to_string()
            }
        };
        trial.note.get_or_insert(note);
    }
    trials
}

/// [`retrying`] for up to 20 s: a cluster that lost its leader recovers after an
/// election, which on two loaded cores can take longer than 5 s (ZooKeeper's hand-offs
/// once read UNAVAIL ⚠ with "connect … timeout" after 5 s).
pub(super) async fn retried<T, F, Fut>(op: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    retrying(Duration::from_secs(20), op).await.0
}

/// A hand-off between two healthy clients: the second must see the lock held, then get
/// it after the release, with a larger token; the checker examines both holds.
pub(super) async fn hand_off(target: &Target, key: &LockKey, fired: bool) -> Trial {
    let history = History::new();
    let attempt = async {
        let (a, b) = (
            history.recorded(HOLDER, target.client().await?),
            history.recorded(CONTENDER, target.client().await?),
        );
        let opts = AcquireOptions::new(target.ttl * 4).wait(Duration::from_secs(10));
        let first = a.acquire(key, &opts).await?;
        let sneaked = retried(|| b.try_acquire(key, target.ttl)).await?;
        let released = retried(|| a.release(first.clone())).await?;
        let second = b.acquire(key, &opts).await?;
        let ok = sneaked.is_none() && released == ReleaseOutcome::Released;
        if let Some(lease) = sneaked {
            let _ = b.release(lease).await;
        }
        let _ = b.release(second).await;
        Ok::<bool, LockError>(ok)
    };
    let result = attempt.await;
    let report = history.check();
    let (verdict, note) = match result {
        _ if !report.is_safe() => (Verdict::Unsafe, report.definite.first().map(describe)),
        Ok(true) => (Verdict::Safe, None),
        Ok(false) => (
            Verdict::Unsafe,
            Some("a hand-off broke exclusion or token order".into()),
        ),
        Err(e) => (Verdict::Unavail, Some(short(&e))),
    };
    Trial {
        verdict,
        fired,
        note,
        updates: LostUpdates::default(),
    }
}

/// A primary and its asynchronous replica (the testbed's deployment for this fault): the
/// replica is cut off its primary's writes, the holder is granted on the primary, the
/// primary dies, the replica is promoted, a contender asks the new primary.
pub(super) async fn replica_failover(target: &Target, round: usize, pairs: usize) -> Vec<Trial> {
    let Some(deployments) = &target.deployments else {
        let error = LockError::backend("the target declares no replicated deployments");
        return round_failed(pairs, "servers", error);
    };
    let servers = match (deployments.start)(Fault::ReplicaFailover).await {
        Ok(servers) => servers,
        Err(e) => {
            let error = LockError::backend(format!("replica pair: {e}"));
            return round_failed(pairs, "servers", error);
        }
    };
    let connect = |url: String| target.harness.client_of(url);
    let server_key = (deployments.server_key)(&target.key(Fault::ReplicaFailover, round, 0));
    let nodes = servers.nodes();
    let setup = async {
        let old = servers.primary_of(&server_key).await;
        let old = old.map_err(LockError::backend)?;
        let replicas = servers.replicas_of(old).await;
        let replicas = replicas.map_err(LockError::backend)?;
        for &replica in &replicas {
            let synced = servers.in_sync(old, replica).await;
            synced.map_err(LockError::backend)?;
        }
        let primary = connect(servers.url()).await?;
        let stranded = servers.strand(old, &replicas).await;
        stranded.map_err(LockError::backend)?;
        Ok::<_, LockError>((primary, old, replicas))
    };
    let (primary, old, replicas) = match setup.await {
        Ok(setup) => setup,
        Err(e) => return round_failed(pairs, "primary", e),
    };
    let mut holders = Vec::new();
    let mut trials = Vec::new();
    for i in 0..pairs {
        let record = Record::new(target.key(Fault::ReplicaFailover, round, i));
        match hold(&record, primary.clone(), target.ttl * 10, false).await {
            Ok(holder) => holders.push((record, holder)),
            Err(e) => trials.push(setup_failed("holder", e)),
        }
    }
    let failover = async {
        nodes[old].kill().await.map_err(|e| e.to_string())?;
        for &replica in &replicas {
            nodes[replica].resume().map_err(|e| e.to_string())?;
        }
        servers.wait_failover(&server_key, old).await
    };
    let fired = failover.await;
    let url = servers.url();
    let judged = after_failover(target, holders, || connect(url.clone()), fired.is_ok()).await;
    match judged {
        Ok(judged) => trials.extend(judged),
        Err(e) => return round_failed(pairs, "contender", e),
    }
    trials
}

/// The end of a failover round: a contender and a witness connect (`connect`, to the
/// promoted primary); every contender asks at once, so each trial is judged at its own
/// takeover while its holder's lease still runs. A client that cannot connect is the
/// round's error.
pub(super) async fn after_failover<F, Fut>(
    target: &Target,
    mut holders: Vec<(Record, Holder)>,
    connect: F,
    fired: bool,
) -> Result<Vec<Trial>, LockError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn DistributedLock>, LockError>>,
{
    let contender = connect().await?;
    // The witness must ask the promoted primary too, never the target's own servers.
    let witness = connect().await?;
    let contenders: Vec<_> = holders
        .iter_mut()
        .map(|(record, _)| {
            record.witness = Some(witness.clone());
            record.client(CONTENDER, contender.clone())
        })
        .collect();
    let outcomes = futures::future::join_all(
        holders
            .iter()
            .zip(&contenders)
            .map(|((record, _), contender)| contend(target, contender, record)),
    )
    .await;
    // Judged at once, as in `server_round`.
    let judged = holders.into_iter().zip(&contenders).zip(outcomes).map(
        |(((record, holder), contender), outcome)| async move {
            record
                .judge(target, holder, contender, outcome, fired)
                .await
        },
    );
    Ok(futures::future::join_all(judged).await)
}
