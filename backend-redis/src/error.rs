//! Error mapping: a Redis client error to a [`LockError`] of its class, and bounded calls.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use redis::RedisError;
use tenure_api::tls::TlsRefusal;
use tenure_api::LockError;

use crate::RedisConfig;

/// Runs `future` for at most `limit`; running out counts as a timeout error.
pub(crate) fn bounded<T>(
    limit: Duration,
    future: impl Future<Output = Result<T, RedisError>>,
) -> impl Future<Output = Result<T, RedisError>> {
    // A combinator, not an `async fn`: that would keep `future` twice in its own.
    tokio::time::timeout(limit, future)
        .map(move |replied| replied.unwrap_or_else(|_| Err(timed_out(limit))))
}

/// The error of a call that got no reply within `limit`.
pub(crate) fn timed_out(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no reply within {limit:?}"),
    ))
}

/// What a Redis client error means for a lock call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ErrorClass {
    /// The server cannot serve us now but may soon: [`LockError::Unavailable`].
    Unavailable,
    /// Our credentials or client settings are wrong: [`LockError::Config`], never retried.
    Config,
    /// Anything else: [`LockError::Backend`].
    Backend,
}

/// Sorts a client error into a class, by the client's [`ErrorKind`](redis::ErrorKind)
/// and the server's error code (the first word of an error reply, which Redis keeps when
/// a command inside a script fails).
///
/// - Unavailable (retryable): I/O errors, timeouts, refused or dropped connections, and
///   the server states that pass — `LOADING` (loading its dataset), `MASTERDOWN` (a
///   replica that lost its primary), `TRYAGAIN`, `CLUSTERDOWN`, `READONLY` (a replica,
///   e.g. a former primary after a failover), `BUSY` (a long script is running),
///   `NOREPLICAS` (`min-replicas-to-write` not met: a replica is catching up), `OOM`
///   (`maxmemory` reached: keys expire or get freed), `MISCONF` (writes stopped after a
///   failed snapshot, until one succeeds), and on
///   a Redis Cluster `MOVED`/`ASK` and `NOSCRIPT` left over after the client's own
///   retries (a slot moving, a failover under way).
/// - Config (never retried): authentication failures (`NOAUTH`, `WRONGPASS`, the client's
///   own "authentication failed"), `NOPERM` (the ACL user may not run the scripts) and
///   invalid client settings.
/// - Backend: everything else (`ERR`, `WRONGTYPE`, a malformed reply, …).
fn error_class(error: &RedisError) -> ErrorClass {
    use redis::ErrorKind;
    if tls_refusal(error).is_some() {
        return ErrorClass::Config;
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
            return ErrorClass::Config
        }
        ErrorKind::IoError
        | ErrorKind::BusyLoadingError
        | ErrorKind::MasterDown
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::Moved
        | ErrorKind::Ask
        | ErrorKind::NoScriptError
        | ErrorKind::ReadOnly => return ErrorClass::Unavailable,
        _ => {}
    }
    match error.code() {
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => ErrorClass::Config,
        Some(
            "BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY" | "MOVED"
            | "ASK" | "NOSCRIPT" | "NOREPLICAS" | "OOM" | "MISCONF",
        ) => ErrorClass::Unavailable,
        _ if error.is_timeout()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_unrecoverable_error() =>
        {
            ErrorClass::Unavailable
        }
        _ => ErrorClass::Backend,
    }
}

/// The TLS handshake failed for a reason a retry cannot fix, and what to do about it.
fn tls_refusal(error: &RedisError) -> Option<&'static str> {
    Some(match tenure_api::tls::tls_refusal(error)? {
        TlsRefusal::UntrustedServer => {
            "the server's TLS certificate is not trusted: set ca_file to the CA that signed it, \
             and connect by a name or address the certificate lists"
        }
        TlsRefusal::ClientCertificate => {
            "the server refused the TLS client certificate, or needs one: set cert_file and \
             key_file to a certificate its tls-ca-cert-file trusts"
        }
        _ => {
            "the server refused the TLS handshake: it may need a client certificate \
             (cert_file and key_file) or a TLS version or cipher suite this client lacks"
        }
    })
}

/// Converts a client error from step `what` into a [`LockError`] of its class (see
/// [`error_class`]); the message names the server and the error code, never a password.
pub(crate) fn classify(config: &RedisConfig, what: &str, error: RedisError) -> LockError {
    let mut message = match error.code() {
        Some(code) => format!("{what} on {}: {error} [{code}]", config.endpoint()),
        None => format!("{what} on {}: {error}", config.endpoint()),
    };
    if let Some(hint) = tls_refusal(&error) {
        message = format!("{message} ({hint})");
    }
    if error.code() == Some("WRONGTYPE") {
        message = format!(
            "{message} (a lock or fence key is not a string, as tenure's and redis-py's are: \
             another recipe's lock in another layout, such as Redisson's RLock hash, which \
             tenure does not share; see docs/interop.md)"
        );
    }
    match error_class(&error) {
        ErrorClass::Unavailable => LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        },
        ErrorClass::Config => LockError::Config(message),
        ErrorClass::Backend => LockError::Backend {
            message,
            source: Some(Box::new(error)),
        },
    }
}

#[cfg(test)]
mod tests {
    use redis::ErrorKind;

    use super::*;

    /// The error a client sees for this raw server reply (`-CODE detail`).
    fn reply(line: &str) -> RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn class(error: RedisError) -> &'static str {
        let config = RedisConfig::from_url("redis://h").unwrap();
        match classify(&config, "acquire", error) {
            LockError::Unavailable { .. } => "unavailable",
            LockError::Config(_) => "config",
            LockError::Backend { .. } => "backend",
            _ => "other",
        }
    }

    #[test]
    fn transient_server_states_are_unavailable() {
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "READONLY You can't write against a read only replica. script: 7cd7, on @user_script:1.",
            "CLUSTERDOWN The cluster is down",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "NOREPLICAS Not enough good replicas to write.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        ] {
            assert_eq!(class(reply(line)), "unavailable", "{line}");
        }
        for kind in [
            ErrorKind::BusyLoadingError,
            ErrorKind::MasterDown,
            ErrorKind::TryAgain,
            ErrorKind::ReadOnly,
            ErrorKind::ClusterDown,
        ] {
            assert_eq!(
                class(RedisError::from((kind, "x"))),
                "unavailable",
                "{kind:?}"
            );
        }
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply");
        assert_eq!(class(RedisError::from(io)), "unavailable");
    }

    #[test]
    fn authentication_failures_are_config_errors() {
        for line in [
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User app has no permissions to run the 'evalsha' command",
        ] {
            assert_eq!(class(reply(line)), "config", "{line}");
        }
        let failed = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(class(failed), "config");
        let bad = RedisError::from((ErrorKind::InvalidClientConfig, "bad URL"));
        assert_eq!(class(bad), "config");
    }

    #[test]
    fn other_server_errors_are_backend_errors() {
        for line in [
            "ERR Error running script",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "TENURE fence counter {k}:fence reached 2^53",
        ] {
            assert_eq!(class(reply(line)), "backend", "{line}");
        }
    }
}
