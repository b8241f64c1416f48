//! Postgres's row of the matrix's table of expected verdicts (feature `testbed`): what
//! each fault must show on one PostgreSQL server, from how the protocol works.

use std::sync::Arc;

use tenure_api::{ExpiryKind, FencingKind};
use tenure_conformance::faults::expect::{
    cell, minority_lost, server_frozen, url_option, Expect, Premise, Protocol, CLIENT_SUSPEND,
    F_SAFE, LATE_REQUEST_NAMES_ITS_RECORD, NOT_APPLICABLE, NOT_A_REDIS_DEPLOYMENT, NO_OTHER_RECIPE,
    ONE_SERVER_NO_MINORITY_SIDE, SAFE, SAFE_OR_F_SAFE, SAFE_OR_UNSAFE, STALE_RELEASE,
};
use tenure_conformance::faults::Fault;

/// One PostgreSQL server; `locking=lease` (leases timed by the server's clock, no
/// transaction held) has a row of its own, `row` and `advisory` share one. Every mode
/// depends on the server's wall clock: a lease's expiry is read from it, and so is the
/// deadline of a held transaction's idle timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PostgresProtocol {
    lease: bool,
}

/// The row for a `postgres://` URL.
pub(crate) fn protocol(url: &str) -> Result<Arc<dyn Protocol>, String> {
    Ok(Arc::new(PostgresProtocol {
        lease: url_option(url, "locking") == Some("lease"),
    }))
}

impl Protocol for PostgresProtocol {
    fn premise(&self, _nodes: usize) -> Premise {
        match self.lease {
            true => Premise::single_node(FencingKind::Sequence, ExpiryKind::ServerTtl, true),
            false => Premise::single_node(
                FencingKind::Sequence,
                ExpiryKind::ConnectionTransaction,
                true,
            ),
        }
    }

    fn expect(&self, fault: Fault, nodes: usize) -> Expect {
        if self.lease {
            return lease(fault, nodes);
        }
        match fault {
            Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader => cell(
                F_SAFE,
                "idle_in_transaction_session_timeout ends the paused holder's transaction; \
                 the contender's committed nextval is larger, so the woken holder's write \
                 is rejected",
            ),
            Fault::PausedReader => cell(NOT_APPLICABLE, "no shared (read) locks"),
            Fault::ClientSuspend => CLIENT_SUSPEND,
            Fault::MixedFleet => NO_OTHER_RECIPE,
            Fault::VanishedQueueRecord => cell(
                NOT_APPLICABLE,
                "a waiter's place is its lock wait inside the server, which only ending its \
                 session removes (the connection-cut cell)",
            ),
            Fault::DelayedReply => cell(
                SAFE,
                "the deadline counts from the send, and the server's idle timer from its \
                 grant: a late grant arrives expired; a release ends the holder's \
                 transaction on arrival",
            ),
            Fault::ClockJump => cell(
                SAFE_OR_F_SAFE,
                "Postgres keeps a timeout as a wall-clock deadline and checks every deadline \
                 whenever its alarm goes off: after a forward jump, the backend's next \
                 alarm (one left pending from before the transaction, about a second after \
                 the grant) finds the idle timeout due and ends the holder's transaction \
                 before its TTL; the contender's committed nextval is larger, so the stale \
                 write is rejected",
            ),
            Fault::Restart => cell(
                SAFE,
                "the restart ends the holder's transaction and closes its connection, which \
                 its guard sees before the restarted server can grant; fence values were \
                 flushed before they were handed out",
            ),
            Fault::Blackhole => cell(
                SAFE,
                "the guard gives up at its deadline, counted from a send, before the \
                 server's idle timeout ends the transaction",
            ),
            Fault::ConnectionCut => cell(
                SAFE,
                "the reset ends the holder's transaction at once; the closed connection is \
                 pushed to its guard before a contender's grant, a round trip and a fence \
                 commit later",
            ),
            Fault::MinorityLoss => minority_lost(nodes),
            Fault::ServerPause => server_frozen(nodes),
            Fault::ReplicaFailover => cell(
                SAFE_OR_UNSAFE,
                "the holder's transaction dies with the primary, but an asynchronous \
                 standby may hand out fence values again",
            ),
            Fault::SentinelFailover
            | Fault::SentinelFailoverConfirmed
            | Fault::SentinelConfirmingReplicaLost
            | Fault::ClusterFailover
            | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
            Fault::LostReply => cell(
                SAFE,
                "the reset ends the orphan's transaction, which frees the row",
            ),
            Fault::MinorityPartition => ONE_SERVER_NO_MINORITY_SIDE,
            Fault::StaleAcquire => LATE_REQUEST_NAMES_ITS_RECORD,
            Fault::StaleExtend => cell(
                SAFE,
                "the transaction's idle timeout restarts with every statement: a late one \
                 only lengthens it",
            ),
            Fault::StaleRelease => STALE_RELEASE,
        }
    }
}

/// `locking=lease`: a row with an expiry by the server's clock, each call one autocommit
/// statement, no connection or transaction held.
fn lease(fault: Fault, nodes: usize) -> Expect {
    match fault {
        Fault::PausedHolder | Fault::PausedPermitHolder | Fault::PausedLeader => cell(
            F_SAFE,
            "the server's clock ends the paused holder's lease; the contender's token, a \
             later nextval taken under the row's lock, is larger, so the woken holder's \
             write is rejected",
        ),
        Fault::PausedReader => cell(NOT_APPLICABLE, "no shared (read) locks"),
        Fault::ClientSuspend => CLIENT_SUSPEND,
        Fault::MixedFleet => NO_OTHER_RECIPE,
        Fault::VanishedQueueRecord => cell(
            NOT_APPLICABLE,
            "waiters keep no record on the server: they try again when woken",
        ),
        Fault::DelayedReply => cell(
            SAFE,
            "the deadline counts from the send and the server's expiry from its statement: \
             a late grant arrives expired; a late release names its grant's owner and token",
        ),
        Fault::ClockJump => cell(
            F_SAFE,
            "the server expires leases by its wall clock (clock_timestamp()): a forward jump \
             ends the lease while the holder's own deadline has not passed; the sequence \
             still rises, so the stale write is rejected",
        ),
        Fault::Restart => cell(
            SAFE,
            "the grant and every extension were committed with synchronous_commit on, so \
             the restarted server still has the lease until its expiry; fence values were \
             flushed before they were handed out",
        ),
        Fault::Blackhole => cell(
            SAFE,
            "the guard gives up at its deadline, counted from a send, before the server's \
             expiry, counted from its statement",
        ),
        Fault::ConnectionCut => cell(
            SAFE,
            "a lease holds no connection: the cut costs a reconnection, and the lease stands \
             until it is extended or runs out",
        ),
        Fault::MinorityLoss => minority_lost(nodes),
        Fault::ServerPause => server_frozen(nodes),
        Fault::ReplicaFailover => cell(
            SAFE_OR_UNSAFE,
            "an asynchronous standby may lack the grant and hand out fence values again",
        ),
        Fault::SentinelFailover
        | Fault::SentinelFailoverConfirmed
        | Fault::SentinelConfirmingReplicaLost
        | Fault::ClusterFailover
        | Fault::ClusterFailoverConfirmed => NOT_A_REDIS_DEPLOYMENT,
        Fault::LostReply => cell(
            SAFE,
            "the attempt whose reply was lost had an owner id of its own: the client gives \
             its grant back (or, if that is lost too, the grant is held by nobody and runs \
             out at its TTL)",
        ),
        Fault::MinorityPartition => ONE_SERVER_NO_MINORITY_SIDE,
        Fault::StaleAcquire => cell(
            SAFE,
            "every attempt has an owner id of its own, so a late grant acts only on that \
             attempt",
        ),
        Fault::StaleExtend => cell(
            SAFE,
            "an extension names the lease's owner and token: a late one finds the lease \
             ended, or lengthens its own",
        ),
        Fault::StaleRelease => STALE_RELEASE,
    }
}

#[cfg(test)]
mod tests {
    use tenure_conformance::faults::expect::Config;
    use tenure_conformance::faults::Verdict;

    use super::*;
    use crate::lab::TESTBED;

    /// Only a failover to an asynchronous standby, which may hand out fence values again,
    /// lets a double grant go uncontained.
    #[test]
    fn only_a_standby_failover_allows_an_uncontained_violation() {
        for url in ["postgres://h/db", "postgres://h/db?locking=lease"] {
            let config = Config::of(&TESTBED, url, 1).unwrap();
            assert_eq!(
                config.allowing(Verdict::Unsafe),
                [Fault::ReplicaFailover],
                "{url}"
            );
        }
    }

    /// The lease mode's row is its own: its expiry is the server's clock.
    #[test]
    fn the_lease_mode_has_a_row_of_its_own() {
        let lease = Config::of(&TESTBED, "postgres://h/db?pool_size=2&locking=lease", 1).unwrap();
        let rows = Config::of(&TESTBED, "postgres://h/db?locking=row", 1).unwrap();
        assert_eq!(lease.protocol.premise(1).expiry, ExpiryKind::ServerTtl);
        assert!(lease.protocol.premise(1).clock_dependent);
        assert!(
            rows.protocol.premise(1).clock_dependent,
            "a wall-clock idle timeout"
        );
        assert_eq!(
            rows.protocol.premise(1).expiry,
            ExpiryKind::ConnectionTransaction
        );
        let jump = |c: &Config| c.protocol.expect(Fault::ClockJump, 1).verdicts;
        assert_ne!(jump(&lease), jump(&rows));
    }
}
