//! Operator tools across backends: [`connect_admin`] gives a [`LockAdmin`] for any lock
//! URL, to list holders under a key prefix (`tenure inspect --prefix`) and find leaked
//! locks (`tenure doctor`).
//!
//! What each backend's doctor reports ([`Problem`](tenure_api::Problem)):
//!
//! | backend | `no_expiry` | `stale` |
//! |---|---|---|
//! | redis, redlock (per node) | lock key without TTL (`PTTL -1`), found with `SCAN` | — |
//! | etcd | lock key without a lease | lock key whose lease is gone |
//! | zk | lock node that is not ephemeral | — (the ensemble deletes an ended session's nodes) |
//! | postgres | — | holder idle in its transaction past its TTL (+1 s) |
//! | memory | — | — |
//!
//! Any backend also reports `malformed` entries in its lock namespace.

use std::sync::Arc;

use tenure_api::{LockAdmin, LockError};

/// Connects to the backend named by `url`'s scheme, like [`crate::connect`], for
/// administration. A scheme whose cargo feature is off is a [`LockError::Config`] naming
/// the feature. (`memory://` gives an empty in-process lock table.)
///
/// # Cancel safety
/// Cancel-safe: a half-made client is dropped.
pub async fn connect_admin(url: &str) -> Result<Arc<dyn LockAdmin>, LockError> {
    Ok((crate::driver_for(url)?.connect)(url).await?.admin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_are_dispatched_and_checked() {
        let admin = connect_admin("memory://").await.unwrap();
        assert!(admin.holders("").await.unwrap().is_empty());
        assert!(admin.doctor().await.unwrap().is_empty());
        let err = connect_admin("bogus://u:hunter2@h").await.unwrap_err();
        assert!(matches!(err, LockError::Config(_)));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = connect_admin("no-scheme").await.unwrap_err();
        assert!(err.to_string().contains("no scheme"), "{err}");
    }
}
