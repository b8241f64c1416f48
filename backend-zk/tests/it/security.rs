//! Against a ZooKeeper whose client port requires TLS with client certificates: each way
//! of getting the security wrong is a typed error with a clear message, and no message
//! shows a password. Digest identities are not registered in ZooKeeper (any
//! `user:password` is accepted at connect), so a wrong password shows up as the ACL
//! refusing that identity. On a TLS port ZooKeeper also authenticates every session by
//! its client certificate (scheme `x509`), and the nodes tenure creates grant that identity
//! too: a client must differ in both to be refused.
//!
//! The ZooKeeper client retries every server until `connect_timeout_ms` and keeps no
//! cause, so a refused TLS handshake is `Unavailable` after that time (3 s here), with a
//! hint, not an immediate `Config` error.

use tenure_api::LockError;
use tenure_conformance::security::{self, expect_config};
use tenure_conformance::servers::tls::TestPki;
use tenure_zk::lab::{ZkEnsemble, ZkOptions, ZkSecrets};
use tenure_zk::ZkLock;

struct Server {
    ensemble: ZkEnsemble,
    secrets: ZkSecrets,
}

impl Server {
    async fn start() -> Server {
        let ensemble = ZkEnsemble::start(ZkOptions::default().secured())
            .await
            .unwrap();
        let secrets = ensemble.secrets().unwrap().clone();
        Server { ensemble, secrets }
    }

    fn addr(&self) -> String {
        self.ensemble.nodes()[0].addr().to_string()
    }

    /// A URL for `user` with `password` on chroot `/tenure` and the given query.
    fn url(&self, scheme: &str, user: &str, password: &str, query: &str) -> String {
        format!(
            "{scheme}://{user}:{password}@{}/tenure?connect_timeout_ms=3000&{query}",
            self.addr()
        )
    }

    /// Takes and releases a lock as `tenure`, so that the lock nodes exist, with their
    /// ACL.
    async fn used_by_tenure(&self) {
        let lock = ZkLock::connect(&self.secrets.url(&self.addr()))
            .await
            .unwrap();
        security::locks_and_unlocks(&lock).await;
    }
}

/// `error` is `Unavailable` at the end of the connect timeout, saying what to check.
fn expect_no_session(error: &LockError, hint: &str) {
    assert!(
        matches!(error, LockError::Unavailable { message, .. }
            if message.contains("no session within 3s") && message.contains(hint)),
        "{error:?}"
    );
}

/// Connects with `url`: the refusal (see [`security::refusal`]).
async fn refusal(url: &str, password: &str) -> LockError {
    security::refusal(ZkLock::connect(url), password).await
}

#[tokio::test]
async fn the_right_credentials_lock_and_unlock() {
    Server::start().await.used_by_tenure().await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = Server::start().await;
    let (_dir, other) = TestPki::unrelated().unwrap();
    let query = server.secrets.tls_options_trusting(&other.ca());
    let password = &server.secrets.password;
    let error = refusal(&server.url("zks", "tenure", password, &query), password).await;
    expect_no_session(&error, "check ca_file");
}

#[tokio::test]
async fn a_plaintext_client_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let error = refusal(&server.url("zk", "tenure", password, ""), password).await;
    expect_no_session(&error, "use zks://");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let server = Server::start().await;
    let query = format!("ca_file={}", server.secrets.pki.ca().display());
    let password = &server.secrets.password;
    let error = refusal(&server.url("zks", "tenure", password, &query), password).await;
    expect_no_session(&error, "cert_file and key_file");
}

#[tokio::test]
async fn zks_without_a_ca_file_is_a_config_error() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let error = refusal(&server.url("zks", "tenure", password, ""), password).await;
    expect_config(&error, "zks:// needs ca_file");
}

/// User `tenure` with a wrong password (and a certificate that is not tenure's): another
/// identity, which the lock nodes' ACL refuses on the first call.
#[tokio::test]
async fn a_wrong_password_is_refused_by_the_acl() {
    let server = Server::start().await;
    server.used_by_tenure().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url(
        "zks",
        "tenure",
        wrong,
        &server.secrets.stranger_tls_options(),
    );
    let error = refusal(&url, wrong).await;
    expect_config(&error, "an ACL refuses this client");
}

#[tokio::test]
async fn another_user_is_refused_by_the_acl() {
    let server = Server::start().await;
    server.used_by_tenure().await;
    let password = &server.secrets.stranger_password;
    let url = server.url(
        "zks",
        "stranger",
        password,
        &server.secrets.stranger_tls_options(),
    );
    let error = refusal(&url, password).await;
    expect_config(&error, "an ACL refuses this client");
    // The same user under its own chroot may lock: the refusal was the ACL.
    let own = url.replace("/tenure?", "/stranger?");
    let lock = ZkLock::connect(&own).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}

/// What ZooKeeper does with certificates: a wrong digest password with `tenure`'s own
/// client certificate is still `tenure` (its `x509` identity is on the nodes' ACL). This
/// test pins that down, since the README tells users about it.
#[tokio::test]
async fn tenures_certificate_alone_is_enough_for_the_acl() {
    let server = Server::start().await;
    server.used_by_tenure().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url("zks", "tenure", wrong, &server.secrets.tls_options());
    let lock = ZkLock::connect(&url).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}
