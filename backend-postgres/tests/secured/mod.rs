//! A Postgres server that requires TLS with a client certificate and a SCRAM password
//! ([`Postgres::start_secured`]), with the lock objects created by its owner and role
//! `tenure` given exactly [`PgConfig::grant_sql`]: the least privilege the README
//! documents. Role `stranger` has no privilege at all.

use std::error::Error;

use tenure_postgres::lab::{PgSecrets, Postgres};
use tenure_postgres::PgConfig;

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// Starts the server, creates the lock objects as `postgres` and grants `tenure` its
/// privileges.
pub(crate) async fn start() -> Result<(Postgres, PgSecrets), BoxError> {
    let server = Postgres::start_secured().await?;
    let secrets = server.secrets().ok_or("a secured server")?.clone();
    let config = PgConfig::from_url(&secrets.url(&server.addr().to_string()))?;
    server.psql(&config.schema_sql()).await?;
    server.psql(&config.grant_sql("tenure")?).await?;
    Ok((server, secrets))
}
