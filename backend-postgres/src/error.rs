//! Error mapping: SQLSTATEs, `sqlx` errors to [`LockError`], bounded calls.

use std::future::Future;
use std::time::Duration;

use tenure_api::tls::{tls_refusal, TlsRefusal};
use tenure_api::LockError;

use crate::PgConfig;

/// SQLSTATE `lock_not_available`: `NOWAIT` found the row locked, or `lock_timeout` ran out.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
/// Whether a connect error is the server refusing `client_connection_check_interval`:
/// SQLSTATE 22023 (`invalid value for parameter "client_connection_check_interval"`, on a
/// platform that cannot detect closed sockets) or 42704 (a server that does not know it).
pub(crate) fn client_check_rejected(code: Option<&str>, message: &str) -> bool {
    matches!(code, Some("22023" | "42704")) && message.contains("client_connection_check_interval")
}

/// SQLSTATE `insufficient_privilege`: the role may not use a lock object.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// SQLSTATE `too_many_connections`: the server (`max_connections`), role or database is out
/// of connection slots.
const TOO_MANY_CONNECTIONS: &str = "53300";

/// Runs `future` for at most `limit`, mapping errors; running out is `Unavailable`.
pub(crate) async fn bounded_for<T>(
    config: &PgConfig,
    limit: Duration,
    what: &str,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, LockError> {
    let endpoint = config.endpoint();
    tenure_api::backend::bounded(limit, what, &endpoint, future, |e| map_err(config, what, e)).await
}

pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// Connection-level failures are `Unavailable`; authentication, TLS refusals, missing
/// privileges and unknown databases are `Config`; anything else is `Backend`. Messages
/// name the endpoint, never the password.
pub(crate) fn map_err(config: &PgConfig, what: &str, error: sqlx::Error) -> LockError {
    let message = format!("{what} on {}: {error}", config.endpoint());
    if let Some(refusal) = tls_refusal(&error) {
        let hint = match refusal {
            TlsRefusal::UntrustedServer => {
                "the server's TLS certificate is not trusted: set sslrootcert to the CA that \
                 signed it, and connect by a name or address the certificate lists \
                 (sslmode=verify-full)"
            }
            TlsRefusal::ClientCertificate => {
                "the server refused the TLS client certificate, or needs one: set sslcert \
                 and sslkey to a certificate its ssl_ca_file trusts"
            }
            _ => "the server refused the TLS handshake (no TLS version or cipher suite in common)",
        };
        return LockError::Config(format!("{message} ({hint})"));
    }
    let code = sqlstate(&error);
    // A server's reply is untrusted input: a code whose first two bytes are not whole
    // characters has no class (never a panic).
    let class = code.as_deref().and_then(|c| c.get(..2));
    let unavailable = matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
    ) || matches!(class, Some("08"))
        || matches!(
            code.as_deref(),
            Some("57P01" | "57P02" | "57P03" | TOO_MANY_CONNECTIONS | "25P03" | "40P01")
        );
    if unavailable {
        let message = if code.as_deref() == Some(TOO_MANY_CONNECTIONS) {
            format!(
                "{message} (the server is out of connection slots: raise its max_connections, \
                 or the role's or database's CONNECTION LIMIT; each held lock and each \
                 blocking acquire uses one connection)"
            )
        } else {
            message
        };
        return LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        };
    }
    if code.as_deref() == Some(INSUFFICIENT_PRIVILEGE) {
        return LockError::Config(format!(
            "{message} (the role lacks a privilege tenure needs: PgConfig::grant_sql gives \
             the GRANT statements, see tenure's docs/security.md)"
        ));
    }
    if class == Some("28") && message.contains("no encryption") {
        return LockError::Config(format!(
            "{message} (the server accepts this user over TLS only: set sslmode=verify-full \
             and sslrootcert)"
        ));
    }
    if matches!(error, sqlx::Error::Configuration(_) | sqlx::Error::Tls(_))
        || matches!(class, Some("28"))
        || code.as_deref() == Some("3D000")
    {
        return LockError::Config(message);
    }
    LockError::Backend {
        message,
        source: Some(Box::new(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error as a foreign or broken server might send it.
    #[derive(Debug)]
    struct Foreign(&'static str);

    impl std::fmt::Display for Foreign {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "foreign error {}", self.0)
        }
    }

    impl std::error::Error for Foreign {}

    impl sqlx::error::DatabaseError for Foreign {
        fn message(&self) -> &str {
            "foreign error"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    /// Defect: a SQLSTATE whose second byte is inside a multi-byte character panicked
    /// (`&c[..2]`). Any code is now a typed error; a well-formed one keeps its class.
    #[test]
    fn a_malformed_sqlstate_is_a_typed_error_not_a_panic() {
        let config = PgConfig::from_url("postgres://tenure@localhost/tenure").unwrap();
        for code in ["€1234", "é", "0", "", "0\u{301}800"] {
            let error = sqlx::Error::Database(Box::new(Foreign(code)));
            let mapped = map_err(&config, "lock", error);
            assert!(
                matches!(mapped, LockError::Backend { .. }),
                "{code:?}: {mapped:?}"
            );
        }
        let error = sqlx::Error::Database(Box::new(Foreign("08006")));
        let mapped = map_err(&config, "lock", error);
        assert!(
            matches!(mapped, LockError::Unavailable { .. }),
            "{mapped:?}"
        );
    }

    #[test]
    fn a_refused_client_check_is_recognised() {
        // What Postgres 14+ says on a platform that cannot detect closed sockets (the
        // detail is "client_connection_check_interval must be set to 0 on this platform"),
        // and what a server that does not know the setting says.
        let refused = [
            (
                "22023",
                "invalid value for parameter \"client_connection_check_interval\": 1000",
            ),
            (
                "42704",
                "unrecognized configuration parameter \"client_connection_check_interval\"",
            ),
        ];
        for (code, message) in refused {
            assert!(
                client_check_rejected(Some(code), message),
                "{code} {message}"
            );
        }
        for (code, message) in [
            (
                Some("22023"),
                "invalid value for parameter \"tcp_keepalives_idle\": -5",
            ),
            (Some("53300"), "sorry, too many clients already"),
            (None, "client_connection_check_interval"),
        ] {
            assert!(!client_check_rejected(code, message), "{code:?} {message}");
        }
    }
}
