//! Backends on local servers, for `tenure bench --all-local` and `tenure matrix`: each
//! backend's testbed (its crate's `TESTBED`, feature `testbed`) starts them — Redis ×1,
//! Redlock ×5, etcd ×3, ZooKeeper ×3, Postgres.

use tenure_api::LockError;
use tenure_conformance::broken::BrokenVariant;
use tenure_conformance::testbed::{BoxError, Testbed};
pub use tenure_conformance::testbed::{Lab, TestbedOptions};

/// The testbeds of the backends `tenure matrix` starts locally, in matrix order.
static TESTBEDS: [Testbed; 5] = [
    tenure_redis::TESTBED,
    tenure_redlock::TESTBED,
    tenure_etcd::TESTBED,
    tenure_zk::TESTBED,
    tenure_postgres::TESTBED,
];

/// The backends `start` knows, in matrix order.
pub fn backends() -> Vec<&'static str> {
    TESTBEDS.iter().map(|testbed| testbed.name).collect()
}

/// The testbed of `backend`, if this build has one.
pub fn testbed(backend: &str) -> Option<&'static Testbed> {
    TESTBEDS.iter().find(|testbed| testbed.name == backend)
}

/// Starts the servers of `backend` on free loopback ports.
///
/// # Cancel safety
/// Cancel-safe: servers started so far are stopped when dropped.
pub async fn start(backend: &str, options: TestbedOptions) -> Result<Lab, BoxError> {
    let Some(testbed) = testbed(backend) else {
        return Err(format!(
            "no local servers for backend {backend:?} in this build (known: {})",
            backends().join(", ")
        )
        .into());
    };
    testbed.start(options).await
}

/// Every deliberately broken variant's name (after `broken:`), backend by backend.
pub fn broken_names() -> Vec<&'static str> {
    TESTBEDS
        .iter()
        .flat_map(|testbed| testbed.broken.iter().map(|variant| variant.name))
        .collect()
}

/// The broken variant a backend name `broken:NAME` names, with its real backend's
/// testbed; `Ok(None)` for other names.
pub fn broken(name: &str) -> Result<Option<(&'static Testbed, BrokenVariant)>, LockError> {
    let Some(wanted) = name.strip_prefix("broken:") else {
        return Ok(None);
    };
    let found = TESTBEDS.iter().find_map(|testbed| {
        let variant = testbed.broken.iter().find(|v| v.name == wanted)?;
        Some((testbed, *variant))
    });
    match found {
        Some(found) => Ok(Some(found)),
        None => Err(LockError::InvalidInput(format!(
            "no broken variant {wanted:?} (known: {})",
            broken_names().join(", ")
        ))),
    }
}
