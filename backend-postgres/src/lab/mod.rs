//! How the lab starts PostgreSQL (feature `testbed`): one server on loopback, plain or
//! requiring TLS with a client certificate and a SCRAM password, its clients a role with
//! only the privileges of [`PgConfig::grant_sql`].

use std::sync::Arc;

use tenure_conformance::faults::expect::NO_OTHER_RECIPE;
use tenure_conformance::faults::{Fault, WhyNot};
use tenure_conformance::servers::Node;
use tenure_conformance::testbed::{
    harness_on, BenchVariant, BoxError, BoxFuture, Lab, Testbed, TestbedOptions,
};

use crate::{PgConfig, PgLock};

mod broken;
mod pgbouncer;
mod servers;
pub use pgbouncer::PgBouncer;
pub use servers::{PgSecrets, PgServerOptions, Postgres, SECURED_SCHEMA};

/// Postgres's testbed: one server.
pub const TESTBED: Testbed = Testbed {
    name: "postgres",
    servers: start_boxed,
    patient_query: "request_timeout_ms=5000",
    waiter_records: None,
    server_bounds: None,
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    // Advisory locking and leases, each against floors of its own (their rows stay apart
    // from the row lock's). Leases are another protocol (expiry by the server's clock, no
    // transaction held): a matrix column of their own. Advisory locks share the row
    // lock's (a transaction's lifetime).
    bench_variants: &[
        BenchVariant {
            name: "advisory",
            query: "locking=advisory",
            matrix_column: false,
        },
        LEASE,
    ],
    why_not: WHY_NOT,
    protocol: crate::verdicts::protocol,
    broken: broken::BROKEN,
    foreign: None,
};

/// `locking=lease`, measured by the bench and the matrix apart from row locks.
pub const LEASE: BenchVariant = BenchVariant {
    name: "lease",
    query: "locking=lease",
    matrix_column: true,
};

/// What the fault suite cannot do to Postgres here, or what does not apply to it.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotInjectable(
        &[Fault::StaleAcquire, Fault::StaleExtend, Fault::StaleRelease],
        "a Postgres lock is its session's transaction: the client cannot move a held lock \
         to a fresh connection, and gives up a stalled connection with what it was doing",
    ),
    WhyNot::NotApplicable(&[Fault::MixedFleet], NO_OTHER_RECIPE.reason),
    WhyNot::NotApplicable(
        &[Fault::VanishedQueueRecord],
        "a waiter's place is its lock wait inside the server, which only ending its \
         session removes (the connection-cut cell)",
    ),
];

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start(options))
}

/// Starts a server that requires TLS with a client certificate and a SCRAM password
/// ([`Postgres::start_secured`]), creates the lock objects of the row and lease modes as
/// its owner and grants role `tenure` exactly [`PgConfig::grant_sql`] for each: the least
/// privilege the README documents (role `stranger` has no privilege at all).
///
/// # Cancel safety
/// Cancel-safe: the server is stopped when dropped.
pub async fn start_secured() -> Result<(Postgres, PgSecrets), BoxError> {
    start_secured_with(PgServerOptions::default()).await
}

/// [`start_secured`] under `options` (the clock shim, if asked for).
async fn start_secured_with(options: PgServerOptions) -> Result<(Postgres, PgSecrets), BoxError> {
    let options = PgServerOptions {
        secured: true,
        ..options
    };
    let server = Postgres::start_with(options).await?;
    let secrets = server.secrets().ok_or("a secured server")?.clone();
    let url = secrets.url(&server.addr().to_string());
    // Every mode's objects (leases have a table of their own), so that each runs on it.
    for url in [url.clone(), LEASE.url(&url)] {
        let config = PgConfig::from_url(&url)?;
        server.psql(&config.schema_sql()).await?;
        server.psql(&config.grant_sql("tenure")?).await?;
    }
    Ok((server, secrets))
}

async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let server_options = PgServerOptions {
        secured: options.secured,
        clock_shim: options.clock_shim,
    };
    let (server, template) = if options.secured {
        let (server, secrets) = start_secured_with(server_options).await?;
        (server, secrets.url("{hosts}"))
    } else {
        let template = "postgres://postgres@{hosts}/postgres".to_owned();
        (Postgres::start_with(server_options).await?, template)
    };
    let server = Arc::new(server);
    let nodes: Vec<Arc<dyn Node>> = vec![server.clone()];
    let harness = harness_on("postgres", &template, &nodes, |url| async move {
        PgLock::connect(&url).await
    })
    // The schema exists once the queue's client below has connected; a short command
    // timeout would cut a migration queued behind concurrent ones.
    .cut_query("request_timeout_ms=300&migrate=false");
    // The FIFO scenario counts a key's queue through a client of its own.
    let observer = PgLock::connect(&harness.url()).await?;
    let harness = harness.with_queue_admin(observer).owning(server);
    Ok(Lab::new(TESTBED, harness, nodes)
        .secured(options.secured)
        .clock_shim(options.clock_shim))
}
