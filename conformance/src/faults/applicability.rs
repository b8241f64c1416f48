//! Which faults a target can run: the cell to report instead when a fault cannot be
//! injected there, or does not apply to the backend.

use tenure_api::{FencingKind, Replication};

use super::{Cell, Fault, Target};
use crate::Harness as _;

/// Why `fault` cannot run on `target`, if it cannot: the cell to report instead.
pub fn applicability(fault: Fault, target: &Target) -> Option<Cell> {
    // The backend's own reasons, where the rules below leave a fault to it.
    let declared = || target.why_not(fault);
    let not_injectable = |reason: &str| {
        Some(Cell::NotInjectable {
            reason: reason.into(),
        })
    };
    let no_process = target.nodes.is_empty() && fault.is_server_fault();
    // Link faults run on a client whose every server link passes through a proxy.
    let no_links = fault.is_link_fault() && !target.harness.can_cut_links();
    // What the backend's protocol rules out is not applicable in any setup (a file lock
    // has no network to cut, no server to stop).
    if let Some(cell @ Cell::NotApplicable { .. }) = declared() {
        return Some(cell);
    }
    match fault {
        Fault::MixedFleet if target.foreign.is_some() => None,
        Fault::MixedFleet => declared().or_else(|| {
            not_injectable("the harness declares no other recipe's client for these servers")
        }),
        _ if no_process => not_injectable("no process control over these servers"),
        _ if no_links => not_injectable("the harness cannot put a client's links behind proxies"),
        Fault::ClockJump if !target.clock_shim => {
            declared().or_else(|| not_injectable("servers not started under the clock shim"))
        }
        Fault::PausedLeader if target.caps.fencing == FencingKind::None => {
            Some(Cell::NotApplicable {
                reason: "no fencing tokens, so no terms: Election refuses this configuration"
                    .into(),
            })
        }
        Fault::PausedReader if !target.caps.shared => Some(Cell::NotApplicable {
            reason: "no shared (read) locks".into(),
        }),
        Fault::MinorityLoss if target.nodes.len() < 3 => Some(Cell::NotApplicable {
            reason: "a single node has no minority to lose".into(),
        }),
        _ if fault.is_replica_failover() => {
            let replicated = target.deployments.is_some();
            match target.caps.replication {
                _ if replicated && target.secured => {
                    not_injectable(if fault.is_topology_failover() {
                        "the harness starts its Sentinel and Cluster groups without TLS and ACL users"
                    } else {
                        "the harness's primary-replica pair does not run with TLS and ACL users"
                    })
                }
                _ if replicated => None,
                _ if declared().is_some() => declared(),
                _ if fault.is_topology_failover() => Some(Cell::NotApplicable {
                    reason: "a failover of a Redis deployment".into(),
                }),
                Replication::IndependentQuorum { .. } => Some(Cell::NotApplicable {
                    reason: "independent masters without replicas".into(),
                }),
                Replication::Consensus { .. } => Some(Cell::NotApplicable {
                    reason: "replication is synchronous consensus".into(),
                }),
                _ => not_injectable("the harness starts no replica for this backend"),
            }
        }
        Fault::StaleAcquire | Fault::StaleExtend | Fault::StaleRelease => declared(),
        Fault::VanishedQueueRecord if target.waiter_records.is_none() => declared()
            .or_else(|| not_injectable("the harness declares no way to remove a waiter's record")),
        Fault::MinorityPartition => match target.caps.replication {
            Replication::SingleNode => Some(Cell::NotApplicable {
                reason: "one server: no minority side".into(),
            }),
            _ if target.nodes.len() < 3 => Some(Cell::NotApplicable {
                reason: "fewer than three servers: no minority side".into(),
            }),
            Replication::IndependentQuorum { .. } => None,
            // The holder's follower is cut off from the leader's side: which is which
            // must be known.
            _ if target.peer_links.is_some() && target.leader.is_some() => None,
            _ if target.peer_links.is_some() => {
                not_injectable("member links declared, but no way to find the leader")
            }
            _ if declared().is_some() => declared(),
            _ => not_injectable("no control over the links between the members"),
        },
        _ => None,
    }
}
