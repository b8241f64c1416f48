//! Backends on local servers, for `tenure bench --all-local` and `tenure matrix`: each
//! backend's testbed (its crate's `TESTBED`, feature `testbed`) starts them — Redis ×1,
//! Redlock ×5, etcd ×3, ZooKeeper ×3, Postgres, MariaDB, and a lock directory for the file backend
//! (no server). The matrix's columns are the backends
//! and the configurations their testbeds measure as columns of their own (`postgres
//! lease`), named as the bench names its rows.

use tenure_api::LockError;
use tenure_conformance::broken::BrokenVariant;
use tenure_conformance::testbed::{BenchVariant, BoxError, Testbed};
pub use tenure_conformance::testbed::{Lab, TestbedOptions};

/// The testbeds of the backends `tenure matrix` starts locally, in matrix order.
static TESTBEDS: [Testbed; 7] = [
    tenure_redis::TESTBED,
    tenure_redlock::TESTBED,
    tenure_etcd::TESTBED,
    tenure_zk::TESTBED,
    tenure_postgres::TESTBED,
    tenure_mysql::TESTBED,
    tenure_file::TESTBED,
];

/// The backends of this build's testbeds, in matrix order (the matrix's columns add
/// their configurations: [`columns`]).
pub fn backends() -> Vec<&'static str> {
    TESTBEDS.iter().map(|testbed| testbed.name).collect()
}

/// The matrix's columns, in matrix order: each backend, then the configurations its
/// testbed measures as columns of their own (`postgres lease`).
pub fn columns() -> Vec<String> {
    TESTBEDS
        .iter()
        .flat_map(|testbed| {
            let variants = testbed.bench_variants.iter().filter(|v| v.matrix_column);
            std::iter::once(testbed.name.to_owned())
                .chain(variants.map(|v| format!("{} {}", testbed.name, v.name)))
        })
        .collect()
}

/// The testbed of `backend`, if this build has one: a backend's name as its capabilities
/// give it, or a [column](columns)'s (`postgres lease`, Postgres's testbed).
pub fn testbed(backend: &str) -> Option<&'static Testbed> {
    column(backend).map(|(testbed, _)| testbed)
}

/// The configuration a column's name names beside its backend (`postgres lease`'s
/// `locking=lease`), if it names one.
pub fn variant(name: &str) -> Option<&'static BenchVariant> {
    column(name).and_then(|(_, variant)| variant)
}

/// The testbed a column's name names, and its configuration (`None`: the default).
fn column(name: &str) -> Option<(&'static Testbed, Option<&'static BenchVariant>)> {
    let (backend, variant) = name.split_once(' ').unwrap_or((name, ""));
    let testbed = TESTBEDS.iter().find(|testbed| testbed.name == backend)?;
    match variant {
        "" => Some((testbed, None)),
        _ => {
            let variants = testbed.bench_variants.iter();
            let variant = variants
                .filter(|v| v.matrix_column)
                .find(|v| v.name == variant)?;
            Some((testbed, Some(variant)))
        }
    }
}

/// Starts the servers of `backend` (a backend, or a [column](columns) such as `postgres
/// lease`: its backend's servers, every client configured as the column says) on free
/// loopback ports.
///
/// # Cancel safety
/// Cancel-safe: servers started so far are stopped when dropped.
pub async fn start(backend: &str, options: TestbedOptions) -> Result<Lab, BoxError> {
    let Some((testbed, variant)) = column(backend) else {
        return Err(format!(
            "no local servers for backend {backend:?} in this build (known: {})",
            columns().join(", ")
        )
        .into());
    };
    let lab = testbed.start(options).await?;
    match variant {
        Some(variant) => Ok(lab.configured(variant).await?),
        None => Ok(lab),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Postgres's lease mode is a column of its own, after Postgres's; advisory locking
    /// (the row lock's protocol) is not.
    #[test]
    fn a_configuration_measured_apart_is_a_column_after_its_backend() {
        let columns = columns();
        let at = |name: &str| columns.iter().position(|c| c == name);
        assert_eq!(
            at("postgres lease"),
            at("postgres").map(|i| i + 1),
            "{columns:?}"
        );
        assert_eq!(at("postgres advisory"), None, "{columns:?}");
        assert_eq!(testbed("postgres lease").map(|t| t.name), Some("postgres"));
        assert!(testbed("postgres advisory").is_none());
        assert!(testbed("postgres  lease").is_none());
        assert!(testbed("lease").is_none());
        assert_eq!(
            variant("postgres lease").map(|v| v.query),
            Some("locking=lease")
        );
        assert_eq!(variant("postgres"), None);
        for backend in backends() {
            assert!(columns.iter().any(|c| c == backend), "{backend}");
        }
    }
}
