//! Against an etcd member that serves clients over TLS only, requires client certificates
//! and has authentication on: each way of getting the security wrong is a typed error
//! with a clear message, returned at once, and no message shows a password.

use crate::secured;

use tenure_api::LockError;
use tenure_conformance::security::{self, expect_config};
use tenure_conformance::servers::tls::TestPki;
use tenure_etcd::lab::{EtcdCluster, EtcdSecrets};
use tenure_etcd::EtcdLock;

struct Server {
    cluster: EtcdCluster,
    secrets: EtcdSecrets,
}

impl Server {
    async fn start() -> Server {
        let (cluster, secrets) = secured::start(1).await.unwrap();
        Server { cluster, secrets }
    }

    /// A URL for `user` with `password` on prefix `tenure` and the given query.
    fn url(&self, scheme: &str, user: &str, password: &str, query: &str) -> String {
        let addr = self.cluster.members()[0].addr();
        format!("{scheme}://{user}:{password}@{addr}/tenure?{query}")
    }
}

/// Connects with `url`: the refusal (see [`security::refusal`]).
async fn refusal(url: &str, password: &str) -> LockError {
    security::refusal(EtcdLock::connect(url), password).await
}

/// The server closes a connection it will not serve without saying why in a way the
/// client sees: `Unavailable` (a network fault looks the same), with what to check.
fn expect_unavailable(error: &LockError, hint: &str) {
    assert!(
        matches!(error, LockError::Unavailable { message, .. } if message.contains(hint)),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_right_credentials_lock_and_unlock() {
    let server = Server::start().await;
    let addr = server.cluster.members()[0].addr().to_string();
    let lock = EtcdLock::connect(&server.secrets.url(&addr)).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = Server::start().await;
    let (_dir, other) = TestPki::unrelated().unwrap();
    let query = server.secrets.tls_options_trusting(&other.ca());
    let password = &server.secrets.password;
    let error = refusal(&server.url("etcds", "tenure", password, &query), password).await;
    expect_config(&error, "certificate is not trusted: set ca_file");
}

#[tokio::test]
async fn a_plaintext_client_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let error = refusal(&server.url("etcd", "tenure", password, ""), password).await;
    expect_unavailable(&error, "if the cluster serves TLS, use etcds://");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let server = Server::start().await;
    let query = format!("ca_file={}", server.secrets.pki.ca().display());
    let password = &server.secrets.password;
    let error = refusal(&server.url("etcds", "tenure", password, &query), password).await;
    expect_unavailable(&error, "set cert_file and key_file");
}

#[tokio::test]
async fn a_wrong_password_is_refused() {
    let server = Server::start().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url("etcds", "tenure", wrong, &server.secrets.tls_options());
    let error = refusal(&url, wrong).await;
    expect_config(&error, "wrong user or password");
}

/// `stranger`'s role grants `stranger/` only: locks under `tenure/` are refused by the
/// server (permission denied), at once, not retried.
#[tokio::test]
async fn a_user_without_rights_on_the_prefix_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.stranger_password;
    let url = server.url("etcds", "stranger", password, &server.secrets.tls_options());
    let error = refusal(&url, password).await;
    expect_config(&error, "permission denied");
    // The same user on its own prefix may lock: the refusal was the role, not the user.
    let own = url.replace("/tenure?", "/stranger?");
    let lock = EtcdLock::connect(&own).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}
