//! The one error type every backend returns.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;

/// A boxed error from a backend's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lock operation failed. Each variant has one meaning, so callers can tell
/// "someone else holds it" ([`Timeout`](Self::Timeout)) from "the backend is down"
/// ([`Unavailable`](Self::Unavailable)) from "we lost it" ([`LeaseLost`](Self::LeaseLost)).
///
/// Contention on its own is not an error: [`crate::DistributedLock::try_acquire`] returns
/// `Ok(None)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Waited the whole bound and the lock was still held by another owner.
    #[error("timed out after {waited:?} waiting for the lock: still held by another owner")]
    Timeout {
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease is no longer ours: it expired, was taken over, or its session/connection
    /// ended. Never silently re-acquired.
    #[error("lease lost: {reason}")]
    LeaseLost {
        /// What was observed.
        reason: String,
    },
    /// A quorum backend reached fewer nodes than it needs.
    #[error("no quorum: {got} of the {needed} nodes needed agreed")]
    NoQuorum {
        /// Nodes that granted the request.
        got: usize,
        /// Nodes needed for a majority.
        needed: usize,
    },
    /// The backend could not be reached (connection refused, reset, timed out, no leader).
    #[error("backend unavailable: {message}")]
    Unavailable {
        /// What failed, without secrets.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// A key, TTL or option the caller passed is not acceptable.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The backend's configuration (URL, options) is not acceptable.
    #[error("configuration error: {0}")]
    Config(String),
    /// Anything else the backend reported, such as an unexpected server reply.
    #[error("backend error: {message}")]
    Backend {
        /// What failed, without secrets.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl LockError {
    /// True when the same call may succeed if tried again later: [`Timeout`](Self::Timeout),
    /// [`NoQuorum`](Self::NoQuorum) and [`Unavailable`](Self::Unavailable).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::NoQuorum { .. } | Self::Unavailable { .. }
        )
    }

    /// A [`LeaseLost`](Self::LeaseLost) with the given reason.
    pub fn lost(reason: impl Into<String>) -> Self {
        Self::LeaseLost {
            reason: reason.into(),
        }
    }

    /// An [`Unavailable`](Self::Unavailable) wrapping a client error.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Unavailable`](Self::Unavailable): step `what` on `endpoint` got no reply within
    /// `limit`.
    pub fn no_reply(what: &str, endpoint: &str, limit: Duration) -> Self {
        Self::Unavailable {
            message: format!("{what} on {endpoint}: no reply within {limit:?}"),
            source: None,
        }
    }

    /// A [`Backend`](Self::Backend) error with only a message (e.g. a malformed reply).
    pub fn backend(message: impl Into<String>) -> Self {
        Self::Backend {
            message: message.into(),
            source: None,
        }
    }
}

/// Runs a client call for at most `limit`, converting its error with `convert`; running
/// out is [`LockError::no_reply`] for step `what` on `endpoint`. Backends bound every
/// request with it. The limit counts from this call, not from the first poll, so call
/// it where the request starts; like `tokio::time::timeout`, it panics outside a Tokio
/// runtime.
///
/// # Cancel safety
/// As cancel-safe as `call`, which is dropped with the returned future.
pub fn bounded<'a, T, E>(
    limit: Duration,
    what: &'a str,
    endpoint: &'a str,
    call: impl Future<Output = Result<T, E>> + 'a,
    convert: impl FnOnce(E) -> LockError + 'a,
) -> impl Future<Output = Result<T, LockError>> + 'a {
    // A combinator, not an `async fn`: that would keep `call` twice in its future (the
    // argument, and the timeout it moves into), and calls run on every node request.
    tokio::time::timeout(limit, call).map(move |replied| match replied {
        Ok(result) => result.map_err(convert),
        Err(_) => Err(LockError::no_reply(what, endpoint, limit)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bounded_converts_errors_and_names_a_silent_endpoint() {
        let limit = Duration::from_millis(250);
        let silent = std::future::pending::<Result<(), &str>>();
        let err = bounded(limit, "grant", "h:1", silent, LockError::backend)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!(
            err.to_string(),
            "backend unavailable: grant on h:1: no reply within 250ms"
        );
        let failed = async { Err::<(), _>("refused") };
        let err = bounded(limit, "grant", "h:1", failed, LockError::backend)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        let fine = async { Ok::<_, &str>(7) };
        assert_eq!(
            bounded(limit, "grant", "h:1", fine, LockError::backend)
                .await
                .unwrap(),
            7
        );
    }
}
