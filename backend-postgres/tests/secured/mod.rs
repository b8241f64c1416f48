//! A Postgres server that requires TLS with a client certificate and a SCRAM password, its
//! role `tenure` given exactly the least privilege (`tenure_postgres::lab::start_secured`).

use std::error::Error;

use tenure_postgres::lab::{PgSecrets, Postgres};

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// Starts the server, creates the lock objects as `postgres` and grants `tenure` its
/// privileges.
pub(crate) async fn start() -> Result<(Postgres, PgSecrets), BoxError> {
    tenure_postgres::lab::start_secured().await
}
