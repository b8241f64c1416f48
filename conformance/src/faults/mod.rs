//! The fault suite: every fault scenario, written once for every backend, run by
//! `tenure matrix`, by the backends' tests and by any harness (see [`FaultTarget`] for
//! what a harness declares it controls).
//!
//! A trial is one holder/contender pair on a key of its own. The holder takes the lock
//! and starts an increment of a [`Counter`](crate::Counter) (reads it); the fault is
//! injected; a contender (a healthy client) asks for the lock, and increments the counter
//! if granted. If the contender is granted the lock while the holder still believes it
//! holds it (or, for a paused holder, before the holder's delayed write), mutual
//! exclusion was violated: the holder then finishes its stale increment, and the verdict
//! says whether fencing rejected it. The counter says what that cost: the updates lost by a store that
//! ignores the tokens, and by one that checks them (Jepsen's lock workload).

use client::client_trial;
use rounds::server_round;

mod applicability;
mod catalogue;
mod cell;
mod client;
pub mod expect;
mod failover;
mod health;
mod inject;
mod mixed;
mod paused;
mod replicated;
mod rounds;
mod target;
mod trial;
mod vanished;

pub use applicability::applicability;
pub use catalogue::{Fault, STALL};
pub use cell::{Cell, Trial, Verdict};
pub use health::ensure;
pub use inject::{
    clock_jump_offset_ms, clock_jump_ttl, heal, inject, Evidence, CLOCK_JUMP_MIN_TTL,
};
pub use replicated::{Deployments, ReplicatedServers, ServerKeyFn, StartDeploymentFn};
pub use target::{leader_of, FaultTarget, LeaderFn, PeerLinks, WaiterRecords, WhyNot};

type Target = FaultTarget;

/// Runs `trials` trials of `fault` against `target`.
///
/// # Cancel safety
/// Dropping it abandons the trials; their locks expire and faults stay injected until the
/// servers are dropped.
pub async fn run(fault: Fault, target: &Target, trials: usize, rounds: usize) -> Cell {
    if let Some(cell) = applicability(fault, target) {
        return cell;
    }
    if fault == Fault::MixedFleet {
        // One foreign client at a time: each is a process (a JVM for Curator).
        let mut results = Vec::with_capacity(trials);
        for i in 0..trials {
            results.push(mixed::mixed_fleet(target, i).await);
        }
        return Cell::from_trials(results, trials);
    }
    if !fault.is_server_fault() {
        let all = futures::future::join_all((0..trials).map(|i| client_trial(fault, target, i)));
        return Cell::from_trials(all.await, trials);
    }
    let rounds = rounds.clamp(1, trials.max(1));
    let mut results = Vec::with_capacity(trials);
    let mut injections = 0;
    for round in 0..rounds {
        let pairs = trials / rounds + usize::from(round < trials % rounds);
        if pairs == 0 {
            continue;
        }
        injections += 1;
        results.extend(server_round(fault, target, round, pairs).await);
    }
    Cell::from_trials(results, injections)
}
