//! How the lab starts MariaDB (feature `testbed`): one server on loopback, plain or
//! requiring TLS with a client certificate and a password, its clients a user with only
//! the privileges of [`MySqlConfig::grant_sql`].

use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::faults::expect::{fixed, NO_OTHER_RECIPE};
use tenure_conformance::faults::{Fault, WhyNot};
use tenure_conformance::servers::Node;
use tenure_conformance::testbed::{
    harness_on, BenchVariant, BoxError, BoxFuture, Lab, Testbed, TestbedOptions,
};

use crate::verdicts::MySqlProtocol;
use crate::{MySqlConfig, MySqlLock};

mod servers;
pub use servers::*;

/// MySQL's testbed: one MariaDB server.
pub const TESTBED: Testbed = Testbed {
    name: "mysql",
    servers: start_boxed,
    patient_query: "request_timeout_ms=5000",
    waiter_records: None,
    server_bounds: None,
    deployments: None,
    floor: Some(crate::floor::floor),
    same_work_floor: Some(crate::floor::same_work),
    peer: None,
    // Row locks, against floors of their own (their rows stay apart from named locks');
    // one protocol with them: a session's lock, ended by its wait_timeout).
    bench_variants: &[ROW],
    why_not: WHY_NOT,
    protocol: fixed::<MySqlProtocol>,
    broken: &[],
    foreign: None,
};

/// `locking=row`, measured by the bench apart from named locks.
pub const ROW: BenchVariant = BenchVariant {
    name: "row",
    query: "locking=row",
    matrix_column: false,
};

/// What the fault suite cannot do to MySQL here, or what does not apply to it.
const WHY_NOT: &[WhyNot] = &[
    WhyNot::NotInjectable(
        &[Fault::StaleAcquire, Fault::StaleExtend, Fault::StaleRelease],
        "a named lock is its session's: the client cannot move a held lock to a fresh \
         connection, and gives up a stalled connection with what it was doing",
    ),
    WhyNot::NotApplicable(&[Fault::MixedFleet], NO_OTHER_RECIPE.reason),
    WhyNot::NotApplicable(
        &[Fault::VanishedQueueRecord],
        "a waiter's place is its GET_LOCK wait inside the server, which only ending its \
         session removes (the connection-cut cell)",
    ),
];

fn start_boxed(options: TestbedOptions) -> BoxFuture<'static, Result<Lab, BoxError>> {
    Box::pin(start(options))
}

/// Starts a server that requires TLS with a client certificate and a password
/// ([`MariaDb::start_secured`]), creates the lock table as `root` and grants user
/// `tenure` exactly [`MySqlConfig::grant_sql`]: the least privilege the README documents
/// (user `stranger` has none).
///
/// # Cancel safety
/// Cancel-safe: the server is stopped when dropped.
pub async fn start_secured() -> Result<(MariaDb, MariaDbSecrets), BoxError> {
    start_secured_with(MariaDbOptions::default()).await
}

async fn start_secured_with(
    options: MariaDbOptions,
) -> Result<(MariaDb, MariaDbSecrets), BoxError> {
    let options = MariaDbOptions {
        secured: true,
        ..options
    };
    let server = MariaDb::start_with(options).await?;
    let secrets = server.secrets().ok_or("a secured server")?.clone();
    let url = secrets.url(&server.addr().to_string());
    // Every mode's tables (row locks have one more), so that each runs on it.
    for url in [url.clone(), ROW.url(&url)] {
        let config = MySqlConfig::from_url(&url)?;
        server
            .sql(&format!("USE {DATABASE}; {}", config.schema_sql()))
            .await?;
        server
            .sql(&config.grant_sql(DATABASE, "'tenure'@'%'")?)
            .await?;
    }
    Ok((server, secrets))
}

async fn start(options: TestbedOptions) -> Result<Lab, BoxError> {
    let server_options = MariaDbOptions {
        secured: options.secured,
        clock_shim: options.clock_shim,
    };
    let (server, template) = if options.secured {
        let (server, secrets) = start_secured_with(server_options).await?;
        (server, secrets.url("{hosts}"))
    } else {
        let server = MariaDb::start_with(server_options).await?;
        let template = server.url().replace(&server.addr().to_string(), "{hosts}");
        (server, template)
    };
    let server = Arc::new(server);
    let nodes: Vec<Arc<dyn Node>> = vec![server.clone()];
    let harness = harness_on("mysql", &template, &nodes, |url| async move {
        MySqlLock::connect(&url).await
    })
    // The table exists once the first client has connected.
    .cut_query("request_timeout_ms=300&migrate=false")
    // `wait_timeout` counts whole seconds.
    .with_short_ttl(Duration::from_secs(1))
    .owning(server);
    Ok(Lab::new(TESTBED, harness, nodes)
        .secured(options.secured)
        .clock_shim(options.clock_shim))
}
