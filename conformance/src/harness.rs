//! What a backend provides to run the suite: fresh clients, and optionally a link the
//! suite can cut.

use std::fmt::{self, Debug};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::TryFutureExt;
use tenure_api::{DistributedLock, LockAdmin, LockError, LockKey, MemoryLock};

use crate::proxy::FaultProxy;

/// A network path between one client and its server(s) that a scenario can cut.
pub trait Link: Send + Sync + Debug {
    /// Stops all traffic (sockets stay open, nothing is forwarded).
    fn cut(&self);
    /// Lets traffic flow again.
    fn heal(&self);
    /// Evidence the cut took effect: traffic was held back while cut.
    fn fired(&self) -> bool;
}

/// A client whose traffic passes through a [`Link`].
#[derive(Debug, Clone)]
pub struct CuttableClient {
    /// The client.
    pub lock: Arc<dyn DistributedLock>,
    /// Its link.
    pub link: Arc<dyn Link>,
}

/// Gives the suite what it needs from a backend. Implement it once per backend (in its
/// `tests/suite.rs`) or for your own deployment.
#[async_trait]
pub trait Harness: Send + Sync + Debug {
    /// Short backend name for reports.
    fn name(&self) -> String;

    /// A fresh, independent client: its own connections or session, as a separate
    /// process would have.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-made client.
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError>;

    /// Whether [`cuttable_client`](Self::cuttable_client) is available.
    fn can_cut_links(&self) -> bool {
        false
    }

    /// A fresh client whose traffic the suite can cut, if this harness can.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-made client.
    async fn cuttable_client(&self) -> Result<Option<CuttableClient>, LockError> {
        Ok(None)
    }

    /// A TTL short enough to wait out in expiry scenarios, long enough for the backend's
    /// TTL granularity.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// How many clients — the holder and its waiters — the servers have queued for
    /// `key`, where the harness can read a backend's queue (etcd's and ZooKeeper's are
    /// keys and nodes, Postgres's are in `pg_locks`); `None` where it cannot. The FIFO
    /// scenario then starts each waiter once the one before is queued, instead of after a
    /// pause that a waiter slow to reach its server can outlast.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn queued(&self, key: &LockKey) -> Option<Result<usize, LockError>> {
        let _ = key;
        None
    }
}

/// The suite's harness for [`MemoryLock`]: every client shares one in-process lock table.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    lock: MemoryLock,
}

impl MemoryHarness {
    /// A harness over a fresh lock table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A harness over an existing lock (e.g. one with a manual clock).
    pub fn with_lock(lock: MemoryLock) -> Self {
        Self { lock }
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn name(&self) -> String {
        "memory".into()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        Ok(Arc::new(self.lock.clone()))
    }

    async fn queued(&self, key: &LockKey) -> Option<Result<usize, LockError>> {
        Some(Ok(self.lock.queued(key)))
    }
}

impl Link for crate::proxy::FaultProxy {
    fn cut(&self) {
        self.set_mode(crate::proxy::ProxyMode::Blackhole);
    }

    fn heal(&self) {
        self.set_mode(crate::proxy::ProxyMode::Pass);
    }

    fn fired(&self) -> bool {
        self.stats().bytes_blackholed > 0
    }
}

/// Every link of one client at once: one [`FaultProxy`] per server it talks to.
/// [`cut`](Link::cut) black-holes them all; [`proxies`](Self::proxies) gives each for
/// partial partitions and other modes.
#[derive(Debug)]
pub struct Links(Vec<FaultProxy>);

impl Links {
    /// Starts one proxy in front of each target.
    ///
    /// # Cancel safety
    /// Cancel-safe: proxies started so far stop when dropped.
    pub async fn start(targets: &[SocketAddr]) -> Result<Self, LockError> {
        let mut proxies = Vec::with_capacity(targets.len());
        for target in targets {
            proxies.push(
                FaultProxy::start(*target)
                    .await
                    .map_err(|e| LockError::unavailable("starting a fault proxy", e))?,
            );
        }
        Ok(Self(proxies))
    }

    /// No links (a client that talks to its servers directly).
    pub fn empty() -> Self {
        Self(Vec::new())
    }

    /// The proxies, in target order.
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.0
    }

    /// The proxies' listening addresses, in target order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.0.iter().map(FaultProxy::addr).collect()
    }
}

impl Link for Links {
    fn cut(&self) {
        self.0.iter().for_each(Link::cut);
    }

    fn heal(&self) {
        self.0.iter().for_each(Link::heal);
    }

    fn fired(&self) -> bool {
        self.0.iter().any(Link::fired)
    }
}

/// Makes a client from a URL: a backend's `connect`, or `tenure::connect`.
pub type ConnectFn = Arc<
    dyn Fn(String) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>, LockError>> + Send + Sync,
>;

/// A [`Harness`] for any backend reachable by URL, so no backend writes its own: the URL
/// is `template` with `{hosts}` replaced by the comma-joined server addresses, plus
/// query options. Cuttable clients reach every server through their own [`Links`].
///
/// ```no_run
/// # async fn demo(addr: std::net::SocketAddr) {
/// use tenure_conformance::UrlHarness;
/// let harness = UrlHarness::new("memory", "memory://{hosts}", vec![addr], |url| async move {
///     let _ = url;
///     Ok(tenure_api::MemoryLock::new())
/// })
/// .query("pool_size=2")
/// .cut_query("command_timeout_ms=300");
/// # }
/// ```
#[derive(Clone)]
pub struct UrlHarness {
    name: String,
    template: String,
    targets: Vec<SocketAddr>,
    query: String,
    cut_query: Option<String>,
    short_ttl: Duration,
    connect: ConnectFn,
    servers: Option<Arc<dyn std::any::Any + Send + Sync>>,
    follow: Option<TargetsFn>,
    cuts: bool,
    queue: Option<QueueFn>,
}

/// Counts a key's queue; `None` where its backend keeps none (see [`Harness::queued`]).
pub type QueueFn =
    Arc<dyn Fn(LockKey) -> BoxFuture<'static, Result<Option<usize>, LockError>> + Send + Sync>;

/// Gives the servers' current addresses (see [`UrlHarness::follow`]).
pub type TargetsFn = Arc<dyn Fn() -> Vec<SocketAddr> + Send + Sync>;

impl Debug for UrlHarness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlHarness")
            .field("name", &self.name)
            .field("url", &tenure_api::urls::redact_url(&self.url()))
            .finish_non_exhaustive()
    }
}

impl UrlHarness {
    /// A harness named `name` whose clients are `connect(url)`.
    pub fn new<F, Fut, L>(name: &str, template: &str, targets: Vec<SocketAddr>, connect: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<L, LockError>> + Send + 'static,
        L: DistributedLock + 'static,
    {
        let connect = Arc::new(connect);
        Self {
            name: name.to_owned(),
            template: template.to_owned(),
            targets,
            query: String::new(),
            cut_query: None,
            short_ttl: Duration::from_millis(500),
            servers: None,
            follow: None,
            cuts: true,
            queue: None,
            connect: Arc::new(move |url| {
                let connect = connect.clone();
                Box::pin(
                    async move { Ok(Arc::new(connect(url).await?) as Arc<dyn DistributedLock>) },
                )
            }),
        }
    }

    /// Query options (`a=1&b=2`) for every client.
    pub fn query(mut self, query: &str) -> Self {
        self.query = query.to_owned();
        self
    }

    /// Query options for cuttable clients *instead of* [`query`](Self::query) — typically
    /// short timeouts, so a cut is noticed fast.
    pub fn cut_query(mut self, query: &str) -> Self {
        self.cut_query = Some(query.to_owned());
        self
    }

    /// Adds `query` to every client's URL — direct, cuttable and patient ones, whatever
    /// [`query`](Self::query) and [`cut_query`](Self::cut_query) say — as if the
    /// template carried it: a configuration of the backend (`locking=lease`).
    pub fn configured(mut self, query: &str) -> Self {
        let separator = if self.template.contains('?') {
            '&'
        } else {
            '?'
        };
        self.template = format!("{}{separator}{query}", self.template);
        self
    }

    /// Keeps `servers` (a cluster handle) alive as long as the harness or a clone of it:
    /// they stop when the last one is dropped.
    pub fn owning(mut self, servers: impl std::any::Any + Send + Sync) -> Self {
        self.servers = Some(Arc::new(servers));
        self
    }

    /// Passes every client through `wrap` (given the client's URL too), e.g. to test a
    /// deliberately broken wrapper on the same servers.
    pub fn wrapping<F, Fut>(mut self, wrap: F) -> Self
    where
        F: Fn(String, Arc<dyn DistributedLock>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn DistributedLock>, LockError>> + Send + 'static,
    {
        let (connect, wrap) = (self.connect.clone(), Arc::new(wrap));
        self.connect = Arc::new(move |url| {
            let (connect, wrap) = (connect.clone(), wrap.clone());
            Box::pin(async move {
                let lock = connect(url.clone()).await?;
                wrap(url, lock).await
            })
        });
        self
    }

    /// Declares that cutting the links to the URL's hosts does not cut a client off: its
    /// hosts only name the servers it talks to (Redis Sentinel names the primary), so the
    /// link-cut scenarios do not apply.
    pub fn without_link_cuts(mut self) -> Self {
        self.cuts = false;
        self
    }

    /// Reads a key's queue with `count` (see [`Harness::queued`]).
    pub fn with_queue_probe<F, Fut>(mut self, count: F) -> Self
    where
        F: Fn(LockKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<usize, LockError>> + Send + 'static,
    {
        self.queue = Some(Arc::new(move |key| Box::pin(count(key).map_ok(Some))));
        self
    }

    /// Reads a key's queue through `admin`, a client of its own
    /// ([`LockAdmin::queued`]), where its backend keeps one (see [`Harness::queued`]).
    pub fn with_queue_admin(mut self, admin: impl LockAdmin + 'static) -> Self {
        let admin = Arc::new(admin);
        self.queue = Some(Arc::new(move |key| {
            let admin = admin.clone();
            Box::pin(async move { admin.queued(&key).await })
        }));
        self
    }

    /// The TTL for expiry scenarios (default 500 ms).
    pub fn with_short_ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// Takes the servers' addresses from `targets` each time a client is made, instead of
    /// the fixed list: for servers that a restart may move to another port.
    pub fn follow(mut self, targets: impl Fn() -> Vec<SocketAddr> + Send + Sync + 'static) -> Self {
        self.follow = Some(Arc::new(targets));
        self
    }

    /// [`follow`](Self::follow)s `nodes`: clients reach each at its current address.
    pub fn follow_nodes(self, nodes: &[Arc<dyn crate::servers::Node>]) -> Self {
        let nodes = nodes.to_vec();
        self.follow(move || nodes.iter().map(|n| n.addr()).collect())
    }

    /// The servers' addresses (their current ones, with [`follow`](Self::follow)).
    pub fn targets(&self) -> Vec<SocketAddr> {
        match &self.follow {
            Some(current) => current(),
            None => self.targets.clone(),
        }
    }

    /// The URL of a direct client.
    pub fn url(&self) -> String {
        self.url_for(&self.targets(), &self.query)
    }

    /// The URL of a direct client with `query` instead of the harness's query options.
    pub fn url_with(&self, query: &str) -> String {
        self.url_for(&self.targets, query)
    }

    fn url_for(&self, targets: &[SocketAddr], query: &str) -> String {
        let hosts: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let url = self.template.replace("{hosts}", &hosts.join(","));
        match (query.is_empty(), url.contains('?')) {
            (true, _) => url,
            (false, true) => format!("{url}&{query}"),
            (false, false) => format!("{url}?{query}"),
        }
    }

    /// The query options of direct clients (see [`query`](Self::query)).
    pub fn query_options(&self) -> &str {
        &self.query
    }

    /// The query options of cuttable clients (see [`cut_query`](Self::cut_query)).
    pub fn cut_options(&self) -> &str {
        self.cut_query.as_deref().unwrap_or(&self.query)
    }

    /// A client of `url`, made as this harness makes its clients: for servers a fault
    /// brought up elsewhere (a promoted replica).
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-made client is dropped.
    pub async fn client_of(&self, url: String) -> Result<Arc<dyn DistributedLock>, LockError> {
        (self.connect)(url).await
    }

    /// A client with `query` (instead of the harness's) whose every server link passes
    /// through its own proxy.
    ///
    /// # Cancel safety
    /// Cancel-safe: a half-made client and its proxies are dropped.
    pub async fn proxied_client(
        &self,
        query: &str,
    ) -> Result<(Arc<dyn DistributedLock>, Links), LockError> {
        let links = Links::start(&self.targets()).await?;
        let lock = (self.connect)(self.url_for(&links.addrs(), query)).await?;
        Ok((lock, links))
    }
}

#[async_trait]
impl Harness for UrlHarness {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        (self.connect)(self.url()).await
    }

    fn can_cut_links(&self) -> bool {
        self.cuts
    }

    async fn cuttable_client(&self) -> Result<Option<CuttableClient>, LockError> {
        if !self.cuts {
            return Ok(None);
        }
        let (lock, links) = self.proxied_client(self.cut_options()).await?;
        Ok(Some(CuttableClient {
            lock,
            link: Arc::new(links),
        }))
    }

    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }

    async fn queued(&self, key: &LockKey) -> Option<Result<usize, LockError>> {
        self.queue.as_ref()?(key.clone()).await.transpose()
    }
}

/// Runs `op` again on retryable errors ([`LockError::is_retryable`]) for up to `limit`,
/// 50 ms apart; returns the last result and how many tries failed. For fault tests: a
/// consensus cluster that lost its leader is unavailable until it elects another, and
/// tolerating a failure means recovering from it, not never seeing it.
///
/// # Cancel safety
/// As cancel-safe as one `op`.
pub async fn retrying<T, F, Fut>(limit: Duration, mut op: F) -> (Result<T, LockError>, usize)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LockError>>,
{
    let started = std::time::Instant::now();
    let mut failures = 0;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && started.elapsed() < limit => {
                tracing::debug!(error = %e, "retrying");
                failures += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            result => return (result, failures),
        }
    }
}
