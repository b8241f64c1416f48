//! Against a Postgres server that requires TLS with a client certificate and a SCRAM
//! password (`hostssl` only): each way of getting the security wrong is a typed error
//! with a clear message, returned at once, and no message shows a password.

use crate::secured;

use tenure_api::LockError;
use tenure_conformance::security::{self, expect_config};
use tenure_conformance::servers::tls::TestPki;
use tenure_postgres::lab::{PgSecrets, Postgres};
use tenure_postgres::PgLock;

struct Server {
    server: Postgres,
    secrets: PgSecrets,
}

impl Server {
    async fn start() -> Server {
        let (server, secrets) = secured::start().await.unwrap();
        Server { server, secrets }
    }

    /// A URL for `user` with `password` on the lock schema and the given query.
    fn url(&self, user: &str, password: &str, query: &str) -> String {
        format!(
            "postgres://{user}:{password}@{}/postgres?schema=locks&{query}",
            self.server.addr()
        )
    }
}

/// Connects with `url`: the refusal (see [`security::refusal`]).
async fn refusal(url: &str, password: &str) -> LockError {
    security::refusal(PgLock::connect(url), password).await
}

#[tokio::test]
async fn the_right_credentials_lock_and_unlock() {
    let server = Server::start().await;
    let url = server.secrets.url(&server.server.addr().to_string());
    let lock = PgLock::connect(&url).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = Server::start().await;
    let (_dir, other) = TestPki::unrelated().unwrap();
    let query = server.secrets.ssl_options_trusting(&other.ca());
    let password = &server.secrets.password;
    let error = refusal(&server.url("tenure", password, &query), password).await;
    expect_config(&error, "certificate is not trusted: set sslrootcert");
}

#[tokio::test]
async fn a_plaintext_client_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let error = refusal(&server.url("tenure", password, "sslmode=disable"), password).await;
    expect_config(&error, "over TLS only: set sslmode");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let server = Server::start().await;
    let query = format!(
        "sslmode=verify-full&sslrootcert={}",
        server.secrets.pki.ca().display()
    );
    let password = &server.secrets.password;
    let error = refusal(&server.url("tenure", password, &query), password).await;
    expect_config(&error, "connection requires a valid client certificate");
}

#[tokio::test]
async fn a_wrong_password_is_refused() {
    let server = Server::start().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url("tenure", wrong, &server.secrets.ssl_options());
    let error = refusal(&url, wrong).await;
    expect_config(&error, "password authentication failed");
}

/// `stranger` may log in but has no privilege on the lock objects: refused at connect
/// (the check that the objects exist), and, without that check, at the first acquire —
/// at once either way, not retried.
#[tokio::test]
async fn a_role_without_grants_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.stranger_password;
    let url = server.url("stranger", password, &server.secrets.ssl_options());
    let error = refusal(&url, password).await;
    expect_config(&error, "permission denied");
    let error = refusal(&format!("{url}&migrate=false"), password).await;
    expect_config(&error, "PgConfig::grant_sql");
}

/// The grants are the least privilege: without `CREATE` on the schema, `tenure` cannot
/// create lock objects of its own (another table), and says which privilege is missing.
#[tokio::test]
async fn the_granted_role_cannot_create_objects() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let url = server.url(
        "tenure",
        password,
        &format!("table=other&{}", server.secrets.ssl_options()),
    );
    let error = refusal(&url, password).await;
    expect_config(&error, "permission denied for schema locks");
}
