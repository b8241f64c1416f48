//! [`Driver`]: a backend as URL dispatch sees it (sqlx's `AnyDriver`). Each backend crate
//! exports one `DRIVER`; the `tenure` facade keeps the table of the enabled ones, so a
//! scheme is mapped to its backend in one place.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{DistributedLock, LockAdmin, LockError};

/// A backend's name, URL schemes and connect function.
#[derive(Clone, Copy)]
pub struct Driver {
    /// The backend's name: `memory`, `redis`, `etcd`, … — its [`Capabilities::backend`]
    /// and its cargo feature in `tenure`.
    ///
    /// [`Capabilities::backend`]: crate::Capabilities::backend
    pub name: &'static str,
    /// The URL schemes it accepts, e.g. `redis` and `rediss`.
    pub schemes: &'static [&'static str],
    /// Connects a client to a URL with one of [`schemes`](Self::schemes).
    pub connect: for<'a> fn(&'a str) -> BoxFuture<'a, Result<Backend, LockError>>,
}

impl Driver {
    /// Whether this driver accepts `scheme`.
    pub fn accepts(&self, scheme: &str) -> bool {
        self.schemes.contains(&scheme)
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

/// One connected client, seen as a lock and as an administration handle.
#[derive(Clone)]
pub struct Backend {
    /// The client as a lock.
    pub lock: Arc<dyn DistributedLock>,
    /// The same client for listing holders and finding leaked locks.
    pub admin: Arc<dyn LockAdmin>,
}

impl Backend {
    /// Wraps a connected client.
    pub fn new<L: DistributedLock + LockAdmin + 'static>(client: L) -> Self {
        let client = Arc::new(client);
        Self {
            lock: client.clone(),
            admin: client,
        }
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("backend", &self.lock.capabilities().backend)
            .finish_non_exhaustive()
    }
}
