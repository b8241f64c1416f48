//! The fault suite (`tenure_conformance::faults`, the matrix's) against a live Postgres
//! server: every fault, checked against the table's row for Postgres.

use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::faults::expect::{self, Config};
use tenure_conformance::faults::FaultTarget;
use tenure_conformance::servers::postgres::Postgres;
use tenure_conformance::servers::Node;
use tenure_conformance::{runner, UrlHarness};
use tenure_postgres::PgLock;

fn main() {
    runner::run_fault_suite(|| async {
        let server = Arc::new(Postgres::start().await?);
        let nodes: Vec<Arc<dyn Node>> = vec![server.clone()];
        let template = "postgres://postgres@{hosts}/postgres";
        let harness = UrlHarness::new(
            "postgres",
            template,
            vec![server.addr()],
            |url| async move { PgLock::connect(&url).await },
        )
        // The schema exists once a direct client has connected; a short command timeout
        // would cut a migration queued behind concurrent ones.
        .cut_query("request_timeout_ms=300&migrate=false")
        .follow_nodes(&nodes)
        .owning(server);
        let url = harness.url();
        let target = FaultTarget::new("postgres", harness, Duration::from_millis(500))
            .await?
            .with_nodes(nodes)
            .with_patient_query("request_timeout_ms=5000");
        let config = Config::of("postgres", &url, 1)?;
        Ok((target, move |fault| expect::expect(&config, fault)))
    })
    .exit();
}
