//! Converting `zookeeper-client` errors (kept private) into [`LockError`].

use std::future::Future;
use std::time::Duration;

use tenure_api::LockError;
use zookeeper_client::Error as ZkError;

/// Runs one request for at most `limit`; running out is [`ZkError::Timeout`].
pub(crate) async fn bounded<T>(
    limit: Duration,
    future: impl Future<Output = Result<T, ZkError>>,
) -> Result<T, ZkError> {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or(Err(ZkError::Timeout))
}

/// Whether the request may have been applied although no reply arrived.
///
/// When a connection fails (reset, I/O error, no reply within the client's connection
/// timeout), `zookeeper-client` fails every request in flight on it with the error that
/// ended the connection: [`ZkError::ConnectionLoss`] only for a clean EOF, otherwise a
/// [`ZkError::Custom`] wrapping the I/O error or timeout. Its other sources (TLS and SASL
/// set-up) are not used here, so a request failing with `Custom` lost its connection.
pub(crate) fn reply_lost(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)
    )
}

/// Whether the error says the session itself is gone.
pub(crate) fn session_gone(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::SessionExpired | ZkError::SessionMoved | ZkError::ClientClosed
    )
}

/// Connection and session failures (including a connection's I/O error, see
/// [`reply_lost`]) are `Unavailable`; an authentication failure or an ACL refusing this
/// client is a `Config` error; anything else is `Backend`. `target` must not carry secrets.
pub(crate) fn from_zk(what: &str, target: &str, error: ZkError) -> LockError {
    let message = format!("{what} on {target}: {error}");
    match error {
        ZkError::ConnectionLoss
        | ZkError::Timeout
        | ZkError::Custom(_)
        | ZkError::NoHosts
        | ZkError::Throttled
        | ZkError::NotReadOnly
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::ClientClosed => LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        },
        ZkError::AuthFailed => LockError::Config(message),
        ZkError::NoAuth => LockError::Config(format!(
            "{message} (an ACL refuses this client: the lock nodes belong to another identity \
             — another digest user:password, or, on a TLS port, another client certificate — \
             or the chroot's ACL does not grant it cdrwa)"
        )),
        _ => LockError::Backend {
            message,
            source: Some(Box::new(error)),
        },
    }
}
