//! What a backend whose servers replicate asynchronously gives the failover faults
//! ([`Fault::is_replica_failover`]): deployments of its servers started afresh for each
//! round (`tenure_redis` starts a primary/replica pair, a Sentinel group and a Redis
//! Cluster), where a lock's state lives on them, and how a client asks a replica to
//! confirm a grant.

use std::sync::Arc;

use futures::future::BoxFuture;
use tenure_api::{async_trait, LockKey};

use super::Fault;
use crate::servers::Node;

/// The key a backend keeps a lock's state under on its servers (its hash slot picks a
/// sharded deployment's primary).
pub type ServerKeyFn = Arc<dyn Fn(&LockKey) -> String + Send + Sync>;

/// Starts the deployment a failover fault runs on (`Err`: why it could not be started).
pub type StartDeploymentFn =
    fn(Fault) -> BoxFuture<'static, Result<Box<dyn ReplicatedServers>, String>>;

/// A primary (or several, each holding a share of the keys) with asynchronous replicas,
/// and whatever promotes a replica when its primary dies, started for one round. Nodes
/// are named by their index into [`nodes`](Self::nodes); every method bounds its own
/// waits, and dropping the deployment stops every process.
#[async_trait]
pub trait ReplicatedServers: Send + Sync {
    /// The URL a client reaches the current primary of every key with (before the
    /// target's own options).
    fn url(&self) -> String;
    /// The data servers, primaries and replicas.
    fn nodes(&self) -> Vec<Arc<dyn Node>>;
    /// The primary that holds `server_key` now.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only asks.
    async fn primary_of(&self, server_key: &str) -> Result<usize, String>;
    /// The replicas of `primary`.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only asks.
    async fn replicas_of(&self, primary: usize) -> Result<Vec<usize>, String>;
    /// Waits until `replica` is connected to `primary` and has every write it took.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only asks.
    async fn in_sync(&self, primary: usize, replica: usize) -> Result<(), String>;
    /// Cuts `replicas` off `primary`'s writes: the replication lag in which an
    /// asynchronous failover loses writes, made certain. How is the deployment's: frozen
    /// with their links closed (the rounds [resume](Node::resume) them once the primary
    /// is killed), or their replication links black-holed.
    ///
    /// # Cancel safety
    /// Not cancel-safe: some replicas may be left stranded.
    async fn strand(&self, primary: usize, replicas: &[usize]) -> Result<(), String>;
    /// Waits until a replica has taken over `server_key` from `old` (killed), promoted
    /// by the deployment itself or, where nothing would, as an operator would; returns
    /// it, once the deployment has pointed its other running replicas at it.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a promotion may be left half-way.
    async fn wait_failover(&self, server_key: &str, old: usize) -> Result<usize, String>;
    /// Restarts `replica` (killed) empty and makes it follow `promoted`, as the
    /// deployment would once its failover timeout passed; waits until it is in sync.
    ///
    /// # Cancel safety
    /// Not cancel-safe.
    async fn rejoin(&self, replica: usize, promoted: usize) -> Result<(), String>;
    /// How many replicas `primary` has connected.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only asks.
    async fn connected_replicas(&self, primary: usize) -> Result<usize, String>;
}

/// A backend's replicated deployments, as its testbed declares them for a URL.
#[derive(Clone)]
pub struct Deployments {
    /// Starts one round's deployment.
    pub start: StartDeploymentFn,
    /// Where a lock's state lives.
    pub server_key: ServerKeyFn,
    /// Client options that make a grant wait for a replica's confirmation, patiently
    /// (a replica acknowledges within a round trip, but on two loaded cores that can
    /// take long).
    pub confirmed_query: &'static str,
    /// The same, waiting briefly: for a holder no replica can confirm, which waits it
    /// out while the replicas are stranded.
    pub hasty_confirmed_query: &'static str,
    /// Words of the backend's refusal of a grant no replica confirmed.
    pub unconfirmed: &'static str,
}

impl std::fmt::Debug for Deployments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployments")
            .field("confirmed_query", &self.confirmed_query)
            .finish_non_exhaustive()
    }
}
