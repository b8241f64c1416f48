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
pub use servers::{PgSecrets, Postgres, SECURED_SCHEMA};

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
    // from the row lock's).
    bench_variants: &[
        BenchVariant {
            name: "advisory",
            query: "locking=advisory",
        },
        BenchVariant {
            name: "lease",
            query: "locking=lease",
        },
    ],
    why_not: WHY_NOT,
    protocol: crate::verdicts::protocol,
    broken: broken::BROKEN,
    foreign: None,
};

/// What the fault suite cannot do to Postgres here, or what does not apply to it.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotInjectable(
        &[Fault::ClockJump],
        "the harness runs no clock shim under postgres",
    ),
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
/// ([`Postgres::start_secured`]), creates the lock objects as its owner and grants role
/// `tenure` exactly [`PgConfig::grant_sql`]: the least privilege the README documents
/// (role `stranger` has no privilege at all).
///
/// # Cancel safety
/// Cancel-safe: the server is stopped when dropped.
pub async fn start_secured() -> Result<(Postgres, PgSecrets), BoxError> {
    let server = Postgres::start_secured().await?;
    let secrets = server.secrets().ok_or("a secured server")?.clone();
    let config = PgConfig::from_url(&secrets.url(&server.addr().to_string()))?;
    server.psql(&config.schema_sql()).await?;
    server.psql(&config.grant_sql("tenure")?).await?;
    Ok((server, secrets))
}

async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let (server, template) = if options.secured {
        let (server, secrets) = start_secured().await?;
        (server, secrets.url("{hosts}"))
    } else {
        let template = "postgres://postgres@{hosts}/postgres".to_owned();
        (Postgres::start().await?, template)
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
    Ok(Lab::new(TESTBED, harness, nodes).secured(options.secured))
}
