//! `sqlx` errors as [`LockError`]s, by the server's error numbers.

use std::future::Future;
use std::time::Duration;

use sqlx::mysql::MySqlDatabaseError;
use tenure_api::tls::{tls_refusal, TlsRefusal};
use tenure_api::LockError;

use crate::MySqlConfig;

/// The server's error number, if the error is the server's.
pub(crate) fn number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// Runs `future` for at most `limit`, mapping errors; running out is `Unavailable`.
pub(crate) async fn bounded_for<T>(
    config: &MySqlConfig,
    limit: Duration,
    what: &str,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, LockError> {
    let endpoint = config.endpoint();
    tenure_api::backend::bounded(limit, what, endpoint, future, |e| map_err(config, what, e)).await
}

/// Connection failures, a server out of connections or shutting down, and a killed
/// session are `Unavailable`; authentication, TLS refusals, missing privileges and unknown
/// databases are `Config`; anything else is `Backend`. Messages name the endpoint, never
/// the password.
pub(crate) fn map_err(config: &MySqlConfig, what: &str, error: sqlx::Error) -> LockError {
    let message = format!("{what} on {}: {error}", config.endpoint());
    if let Some(refusal) = tls_refusal(&error) {
        let hint = match refusal {
            TlsRefusal::UntrustedServer => {
                "the server's TLS certificate is not trusted: set ssl-ca to the CA that \
                 signed it, and connect by a name or address the certificate lists \
                 (ssl-mode=VERIFY_IDENTITY)"
            }
            TlsRefusal::ClientCertificate => {
                "the server refused the TLS client certificate, or needs one: set ssl-cert \
                 and ssl-key to a certificate its ssl_ca trusts"
            }
            _ => "the server refused the TLS handshake (no TLS version or cipher suite in common)",
        };
        return LockError::Config(format!("{message} ({hint})"));
    }
    let code = number(&error);
    let unavailable = matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
    ) || matches!(
        // Too many connections (server, user), shutdown in progress, connection killed,
        // query interrupted, server gone or lost (as some servers report them), lock
        // wait timeout, deadlock, disconnected for inactivity (MySQL 8.0.24+).
        code,
        Some(1040 | 1203 | 1226 | 1053 | 1927 | 1317 | 2006 | 2013 | 1205 | 1213 | 4031)
    );
    if unavailable {
        return LockError::Unavailable {
            message: match code {
                Some(1040 | 1203) => format!(
                    "{message} (the server is out of connection slots: raise its \
                     max_connections or the user's limit; each held lock and each blocking \
                     acquire uses one connection)"
                ),
                _ => message,
            },
            source: Some(Box::new(error)),
        };
    }
    // Database, table or column access denied: a missing grant.
    if matches!(code, Some(1044 | 1142 | 1143)) {
        return LockError::Config(format!(
            "{message} (the user lacks a privilege tenure needs: MySqlConfig::grant_sql gives \
             the GRANT statement, see tenure's docs/security.md)"
        ));
    }
    // Access denied: the server gives one answer for every refused login.
    if matches!(code, Some(1045 | 1698)) {
        return LockError::Config(format!(
            "{message} (a wrong user or password; or the user must present a client \
             certificate (ssl-cert, ssl-key); or the server accepts TLS only (ssl-mode))"
        ));
    }
    // Unknown database, a connection that must use TLS, an old authentication plugin.
    if matches!(error, sqlx::Error::Configuration(_) | sqlx::Error::Tls(_))
        || matches!(code, Some(1049 | 3159 | 1251))
    {
        return LockError::Config(message);
    }
    LockError::Backend {
        message,
        source: Some(Box::new(error)),
    }
}
