//! Bounded requests to the cluster, and how their errors map onto [`LockError`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use tenure_api::LockError;

use crate::EtcdConfig;

/// The client and its configuration: every request of the backend goes through here.
#[derive(Clone)]
pub(crate) struct Rpc {
    pub(crate) config: Arc<EtcdConfig>,
    pub(crate) client: Client,
    /// What the conformance lab does to this handle's requests.
    #[cfg(feature = "testbed")]
    pub(crate) faults: Option<crate::testbed::RequestFaults>,
}

impl Rpc {
    /// Runs one request for at most the request timeout. A request that never left the
    /// client (its connection to one endpoint was refused, e.g. a dead member the
    /// balancer still tries) is sent again, with a short pause, within the same bound:
    /// that is safe for every request.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        #[cfg(feature = "testbed")]
        if let Some(fault) = self.faults.as_ref().and_then(|faults| faults(what)) {
            return self.faulted(what, fault, request()).await;
        }
        let retried = async {
            let mut pause = Duration::from_millis(5);
            loop {
                match request().await {
                    Err(e) if never_sent(&e) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                    other => return other,
                }
            }
        };
        bounded(&self.config, self.config.request_timeout, what, retried).await
    }

    pub(crate) async fn txn(
        &self,
        what: &str,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, LockError> {
        let request = || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        };
        self.call(what, request).await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: &str,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, LockError> {
        let request = || {
            let (mut kv, options) = (self.client.kv_client(), options.clone());
            let key = key.to_owned();
            async move { kv.get(key, Some(options)).await }
        };
        self.call(what, request).await
    }

    /// Deletes `key` (one key, no prefix); how many keys that deleted, 0 or 1.
    pub(crate) async fn delete(&self, what: &str, key: &str) -> Result<i64, LockError> {
        let request = || {
            let mut kv = self.client.kv_client();
            let key = key.to_owned();
            async move { kv.delete(key, None).await }
        };
        Ok(self.call(what, request).await?.deleted())
    }

    /// Grants a lease of `ttl` rounded up to whole seconds. Returns its id and the TTL to
    /// believe: the requested one, or the granted one if the server granted less.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<(i64, Duration), LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.grant(lease_seconds(ttl), None).await }
        };
        let reply = self.call("lease grant", request).await?;
        Ok((reply.id(), believed_ttl(ttl, reply.ttl())?))
    }

    pub(crate) async fn revoke(&self, lease_id: i64) -> Result<(), LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.revoke(lease_id).await }
        };
        self.call("lease revoke", request).await.map(|_| ())
    }

    /// The lease's remaining whole seconds as the leader sees them, truncated (a live
    /// lease with less than a second left reads 0; a lease that is gone reads −1).
    pub(crate) async fn time_to_live(&self, lease_id: i64) -> Result<i64, LockError> {
        let request = || {
            let mut leases = self.client.lease_client();
            async move { leases.time_to_live(lease_id, None).await }
        };
        Ok(self.call("lease time-to-live", request).await?.ttl())
    }

    /// Sends one lease keep-alive. `LeaseLost` if the lease no longer exists.
    pub(crate) async fn keep_alive(&self, lease_id: i64) -> Result<(), LockError> {
        let keep_alive = || {
            let mut leases = self.client.lease_client();
            async move { leases.keep_alive(lease_id).await }
        };
        match self.call("lease keep-alive", keep_alive).await {
            Ok(_) => Ok(()),
            Err(e) if is_lease_gone(&e) => Err(LockError::lost(format!(
                "etcd lease {lease_id:x} has expired or was revoked"
            ))),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn unavailable(&self, what: &str) -> LockError {
        LockError::Unavailable {
            message: format!("{what} on {}", self.config.hosts.join(",")),
            source: None,
        }
    }
}

/// A transaction deleting `key` only while it lives on etcd lease `lease_id` (a key
/// moved to another lease is left alone).
pub(crate) fn delete_on_lease(key: &str, lease_id: i64) -> Txn {
    Txn::new()
        .when([Compare::lease(key, CompareOp::Equal, lease_id)])
        .and_then([TxnOp::delete(key, None)])
}

/// etcd leases count whole seconds: a TTL rounded up (at least 1 s; the server may raise
/// it to its minimum, about 1.5 election timeouts).
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The TTL a lease granted `granted_secs` for `requested` may be believed for: never more
/// than the server granted (etcd raises short TTLs to its minimum, never lowers them, but
/// the reply is what counts). A non-positive grant is a malformed reply.
pub(crate) fn believed_ttl(requested: Duration, granted_secs: i64) -> Result<Duration, LockError> {
    let granted = u64::try_from(granted_secs)
        .ok()
        .filter(|&secs| secs > 0)
        .ok_or_else(|| LockError::backend(format!("etcd granted a lease of {granted_secs} s")))?;
    Ok(requested.min(Duration::from_secs(granted)))
}

/// Runs `request` for at most `limit`; running out is `Unavailable`.
pub(crate) async fn bounded<T>(
    config: &EtcdConfig,
    limit: Duration,
    what: &str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    let endpoint = config.hosts.join(",");
    tenure_api::backend::bounded(limit, what, &endpoint, request, |e| {
        convert(config, what, e)
    })
    .await
}

/// gRPC status codes (see `tonic::Code`).
mod code {
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const INVALID_ARGUMENT: i32 = 3;
    pub(super) const NOT_FOUND: i32 = 5;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const UNAVAILABLE: i32 = 14;
}

/// Unreachable, no leader, timed out or cut off is `Unavailable`; a refused TLS
/// handshake, a wrong or missing password or a missing permission is `Config`
/// (`Unauthenticated`, an expired auth token the client refreshes, is not); anything
/// else is `Backend`. The client error is kept as the source; no secret is in the message.
pub(crate) fn convert(config: &EtcdConfig, what: &str, error: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let message = format!("{what} on {}: {error}", config.hosts.join(","));
    if let Some(hint) = refusal(&error) {
        return LockError::Config(format!("{message} ({hint})"));
    }
    let transient = match &error {
        E::GRpcStatus(status) => matches!(
            i32::from(status.code()),
            code::CANCELLED
                | code::UNKNOWN
                | code::DEADLINE_EXCEEDED
                | code::RESOURCE_EXHAUSTED
                | code::ABORTED
                | code::UNAVAILABLE
        ),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::LeaseKeepAliveError(_) => !error.to_string().contains("not found"),
        _ => false,
    };
    if is_not_found(&error) {
        return LockError::Backend {
            message,
            source: Some(Box::new(error)),
        };
    }
    if transient {
        LockError::Unavailable {
            message,
            source: Some(Box::new(error)),
        }
    } else {
        LockError::Backend {
            message,
            source: Some(Box::new(error)),
        }
    }
}

/// Why the server refused this client for good, if it did: what to fix.
fn refusal(error: &etcd_client::Error) -> Option<&'static str> {
    use tenure_api::tls::TlsRefusal;
    if let Some(tls) = inner(error).and_then(tenure_api::tls::tls_refusal) {
        return Some(match tls {
            TlsRefusal::UntrustedServer => {
                "the server's TLS certificate is not trusted: set ca_file to the CA that \
                 signed it, and connect by a name or address the certificate lists (or set \
                 tls_domain)"
            }
            TlsRefusal::ClientCertificate => {
                "the server refused the TLS client certificate, or needs one: set cert_file \
                 and key_file to a certificate its --trusted-ca-file trusts"
            }
            _ => {
                "the server refused the TLS handshake: it may need a client certificate \
                 (cert_file and key_file) or a TLS version this client lacks"
            }
        });
    }
    let etcd_client::Error::GRpcStatus(status) = error else {
        return None;
    };
    match i32::from(status.code()) {
        code::PERMISSION_DENIED => Some(
            "the user's roles do not grant readwrite on the lock prefix: see tenure's \
             docs/security.md, etcd's least privilege",
        ),
        code::INVALID_ARGUMENT if status.message().contains("authentication failed") => {
            Some("wrong user or password")
        }
        code::INVALID_ARGUMENT if status.message().contains("user name is empty") => {
            Some("the cluster requires a user and password: user:password@")
        }
        _ => None,
    }
}

/// The error an `etcd_client::Error` wraps, whose source chain leads to the cause (the
/// client's own error does not chain its sources).
fn inner(error: &etcd_client::Error) -> Option<&(dyn std::error::Error + 'static)> {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => Some(status),
        E::TransportError(e) => Some(e),
        E::IoError(e) => Some(e),
        _ => None,
    }
}

/// Whether a request failed before it left the client: its connection was refused.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    let mut source = inner(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

pub(crate) fn is_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => i32::from(status.code()) == code::NOT_FOUND,
        etcd_client::Error::LeaseKeepAliveError(e) => e.contains("not found"),
        _ => false,
    }
}

/// Whether a converted error says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_gone(error: &LockError) -> bool {
    match error {
        LockError::Backend {
            source: Some(source),
            ..
        } => source
            .downcast_ref::<etcd_client::Error>()
            .is_some_and(is_not_found),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(10)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn a_lease_is_believed_for_no_longer_than_granted() {
        let asked = Duration::from_millis(2500);
        assert_eq!(believed_ttl(asked, 3).unwrap(), asked);
        assert_eq!(believed_ttl(asked, 60).unwrap(), asked);
        assert_eq!(believed_ttl(asked, 2).unwrap(), Duration::from_secs(2));
        for bad in [0, -1, i64::MIN] {
            let error = believed_ttl(asked, bad).unwrap_err();
            assert!(matches!(error, LockError::Backend { .. }), "{error}");
        }
    }

    #[test]
    fn lease_gone_is_recognised_only_for_not_found() {
        let config = EtcdConfig::from_url("etcd://h").unwrap();
        let gone = convert(
            &config,
            "x",
            etcd_client::Error::LeaseKeepAliveError("lease not found".into()),
        );
        assert!(is_lease_gone(&gone), "{gone}");
        let down = convert(&config, "x", etcd_client::Error::WatchError("eof".into()));
        assert!(matches!(down, LockError::Unavailable { .. }), "{down}");
        assert!(!is_lease_gone(&down));
    }

    #[test]
    fn only_refused_connections_count_as_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_sent(&etcd_client::Error::IoError(refused)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_sent(&etcd_client::Error::IoError(reset)));
        assert!(!never_sent(&etcd_client::Error::WatchError("x".into())));
    }
}
