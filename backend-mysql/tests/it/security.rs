//! Against a MariaDB server that requires TLS (`require_secure_transport`) with a client
//! certificate (`REQUIRE X509`) and a password: each way of getting the security wrong is
//! a typed error with a clear message, returned at once, and no message shows a password.

use tenure_api::LockError;
use tenure_conformance::security::{self, expect_config};
use tenure_conformance::servers::tls::TestPki;
use tenure_mysql::lab::{MariaDb, MariaDbSecrets, DATABASE};
use tenure_mysql::MySqlLock;

struct Server {
    server: MariaDb,
    secrets: MariaDbSecrets,
}

impl Server {
    async fn start() -> Server {
        let (server, secrets) = tenure_mysql::lab::start_secured().await.unwrap();
        Server { server, secrets }
    }

    /// A URL for `user` with `password` on the lock database and the given query.
    fn url(&self, user: &str, password: &str, query: &str) -> String {
        format!(
            "mysql://{user}:{password}@{}/{DATABASE}?{query}",
            self.server.addr()
        )
    }
}

/// Connects with `url`: the refusal (see [`security::refusal`]).
async fn refusal(url: &str, password: &str) -> LockError {
    security::refusal(MySqlLock::connect(url), password).await
}

#[tokio::test]
async fn the_right_credentials_lock_and_unlock() {
    let server = Server::start().await;
    let url = server.secrets.url(&server.server.addr().to_string());
    let lock = MySqlLock::connect(&url).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = Server::start().await;
    let (_dir, other) = TestPki::unrelated().unwrap();
    let query = server.secrets.ssl_options_trusting(&other.ca());
    let password = &server.secrets.password;
    let error = refusal(&server.url("tenure", password, &query), password).await;
    expect_config(&error, "certificate is not trusted: set ssl-ca");
}

/// The server answers a plaintext login with "Access denied" (1045), as for a wrong
/// password: the hint names both causes.
#[tokio::test]
async fn a_plaintext_client_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let url = server.url("tenure", password, "ssl-mode=DISABLED");
    let error = refusal(&url, password).await;
    expect_config(&error, "the server accepts TLS only (ssl-mode)");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let server = Server::start().await;
    let query = format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        server.secrets.pki.ca().display()
    );
    let password = &server.secrets.password;
    let error = refusal(&server.url("tenure", password, &query), password).await;
    expect_config(&error, "must present a client certificate");
}

#[tokio::test]
async fn a_wrong_password_is_refused() {
    let server = Server::start().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url("tenure", wrong, &server.secrets.ssl_options());
    let error = refusal(&url, wrong).await;
    expect_config(&error, "Access denied for user 'tenure'");
}

/// `stranger` may log in but has no privilege on the lock database: refused at once,
/// with the grant it lacks named, not retried.
#[tokio::test]
async fn a_user_without_grants_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.stranger_password;
    let url = server.url("stranger", password, &server.secrets.ssl_options());
    let error = refusal(&url, password).await;
    expect_config(&error, "MySqlConfig::grant_sql");
    let error = refusal(&format!("{url}&migrate=false"), password).await;
    expect_config(&error, "MySqlConfig::grant_sql");
}

/// The grants are the least privilege: `tenure` cannot create a table of its own, and
/// is told which privilege is missing.
#[tokio::test]
async fn the_granted_user_cannot_create_tables() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let query = format!("table=other&{}", server.secrets.ssl_options());
    let error = refusal(&server.url("tenure", password, &query), password).await;
    expect_config(&error, "CREATE command denied");
}
