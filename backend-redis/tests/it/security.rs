//! Against a redis-server that requires TLS with client certificates and a password
//! ([`RedisOptions::secured`]): each way of getting the security wrong is a typed error
//! with a clear message, returned at once (no retry loop, no waiting out the wait), and
//! no message shows a password.

use std::time::Duration;

use tenure_api::{DistributedLock, LockError, LockKey};
use tenure_conformance::security::{self, expect_config};
use tenure_conformance::servers::tls::TestPki;
use tenure_redis::lab::{RedisCluster, RedisOptions, RedisSecrets};
use tenure_redis::RedisLock;

struct Server {
    cluster: RedisCluster,
    secrets: RedisSecrets,
}

impl Server {
    async fn start() -> Server {
        let cluster =
            RedisCluster::start(RedisOptions::default().secured(tenure_redis::ACL_COMMANDS))
                .await
                .unwrap();
        let secrets = cluster.secrets().unwrap().clone();
        Server { cluster, secrets }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.cluster.nodes()[0].addr()
    }

    /// A URL for `user` with `password` and the given query.
    fn url(&self, scheme: &str, user: &str, password: &str, query: &str) -> String {
        format!(
            "{scheme}://{user}:{password}@{}?prefix=tenure/&{query}",
            self.addr()
        )
    }

    fn good_url(&self) -> String {
        self.secrets.url("rediss", &self.addr().to_string())
    }
}

/// Connects with `url`: the refusal (see [`security::refusal`]).
async fn refusal(url: &str, password: &str) -> LockError {
    security::refusal(RedisLock::connect(url), password).await
}

#[tokio::test]
async fn the_right_credentials_lock_and_unlock() {
    let server = Server::start().await;
    let lock = RedisLock::connect(&server.good_url()).await.unwrap();
    security::locks_and_unlocks(&lock).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = Server::start().await;
    let (_dir, other) = TestPki::unrelated().unwrap();
    let query = server.secrets.tls_options_trusting(&other.ca());
    let password = &server.secrets.password;
    let error = refusal(&server.url("rediss", "tenure", password, &query), password).await;
    expect_config(&error, "certificate is not trusted: set ca_file");
}

#[tokio::test]
async fn a_plaintext_client_is_told_to_use_tls() {
    let server = Server::start().await;
    let password = &server.secrets.password;
    let error = refusal(&server.url("redis", "tenure", password, ""), password).await;
    assert!(
        matches!(&error, LockError::Unavailable { message, .. } if message.contains("use rediss://")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let server = Server::start().await;
    let query = format!("ca_file={}", server.secrets.pki.ca().display());
    let password = &server.secrets.password;
    let error = refusal(&server.url("rediss", "tenure", password, &query), password).await;
    expect_config(&error, "set cert_file and key_file");
}

#[tokio::test]
async fn a_wrong_password_is_refused() {
    let server = Server::start().await;
    let wrong = "not-the-password-3f9a";
    let url = server.url("rediss", "tenure", wrong, &server.secrets.tls_options());
    let error = refusal(&url, wrong).await;
    expect_config(&error, "authentication failed");
}

/// The ACL lets `stranger` run the lock commands on `{stranger/*` only: locks under
/// `tenure/` are refused by the server (`NOPERM`), at once, not retried.
#[tokio::test]
async fn a_user_without_rights_on_the_prefix_is_refused() {
    let server = Server::start().await;
    let password = &server.secrets.stranger_password;
    let url = server.url(
        "rediss",
        "stranger",
        password,
        &server.secrets.tls_options(),
    );
    let error = refusal(&url, password).await;
    expect_config(&error, "NOPERM");
    // The same user on its own prefix may lock: the refusal was the ACL, not the user.
    let own = url.replace("prefix=tenure/", "prefix=stranger/");
    let lock = RedisLock::connect(&own).await.unwrap();
    let key = LockKey::new("job").unwrap();
    let lease = lock
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap();
    lock.release(lease.expect("free")).await.unwrap();
}

/// Settings that cannot work are refused before connecting, naming the file, never its
/// content.
#[tokio::test]
async fn tls_files_are_checked_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "secret-looking content").unwrap();
    for (url, says) in [
        (
            format!("rediss://h?ca_file={}", missing.display()),
            "missing.pem",
        ),
        (
            format!("rediss://h?ca_file={}", not_pem.display()),
            "no PEM",
        ),
        ("redis://h?ca_file=/x.pem".to_string(), "rediss://"),
        ("rediss://h?cert_file=/x.pem".to_string(), "go together"),
    ] {
        let error = RedisLock::connect(&url).await.unwrap_err();
        expect_config(&error, says);
        assert!(!error.to_string().contains("secret-looking"), "{error}");
    }
}
