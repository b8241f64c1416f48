//! `redis://` / `rediss://` URLs with tenure's own options, and secret redaction.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tenure_api::urls::{alias_names, percent_encode, redact_url, HostPort, LockUrl};
use tenure_api::{LockError, LockKey};

/// How to reach one Redis server and how to name locks there.
///
/// Parsed from `redis://[user[:password]@]host[:port][/db][?options]` or `rediss://…`
/// (TLS), or `redis+sentinel://[user[:password]@]s1[:port],s2…/name[/db][?options]`
/// (`rediss+sentinel://`): the primary that Redis Sentinel names (see [`SentinelConfig`]). tenure's options, removed before the URL reaches the Redis client:
/// `prefix` (default `tenure:`), `connect_timeout_ms` (default 1000),
/// `request_timeout_ms` (default 1000; also read as `command_timeout_ms`), `fence` (`clock`, the default, or `counter`: see
/// [`FenceMode`]), `wait_replicas` and `wait_timeout_ms` (see
/// [`wait_replicas`](Self::wait_replicas)). Over TLS (`rediss://`): `ca_file` (a PEM bundle of the certificate
/// authorities to trust instead of the built-in web roots, for a private CA), and
/// `cert_file` with `key_file` (PEM client certificate and key, for a server that requires
/// client certificates: Redis's `tls-auth-clients yes`); the files are read at connect, and
/// a missing or malformed one is [`LockError::Config`] naming the file, never its content.
/// The server's name is checked against its certificate (the host in the URL must be one
/// of its subject alternative names). The Redis client's own `protocol` (`resp2`, `resp3`) is handed on; any
/// other option is [`LockError::Config`] ([`OPTIONS`](Self::OPTIONS),
/// [`CLIENT_OPTIONS`](Self::CLIENT_OPTIONS)). Passwords never appear in `Debug`,
/// `Display` or errors.
///
/// A wrong or missing password (`WRONGPASS`, `NOAUTH`) or an ACL refusal (`NOPERM`) is
/// [`LockError::Config`], never retried; a server that is loading, read-only (a replica),
/// without its primary, busy with a script or unreachable is [`LockError::Unavailable`].
/// Within an `acquire`, the two timeouts below are further capped by what is left of the
/// caller's wait.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    url: url::Url,
    /// Prepended to every lock key.
    pub prefix: String,
    /// Bound on establishing a connection (within `acquire`, also by the wait left).
    pub connect_timeout: Duration,
    /// Bound on one command's reply (within `acquire`, also by the wait left; a zero
    /// wait gets exactly this for its single attempt).
    pub request_timeout: Duration,
    /// How the per-key fence counter advances.
    pub fence: FenceMode,
    /// Replicas that must confirm each grant, extension and fence raise before it counts
    /// (0, the default: none). tenure sends `WAIT wait_replicas wait_timeout` in one
    /// pipeline with the write, on the same connection; a grant fewer replicas confirmed
    /// is released and reported as [`LockError::Unavailable`], an extension is not
    /// counted (the lease keeps its old deadline). This narrows the window in which a
    /// failover to an asynchronous replica loses a grant; it does not close it (a replica
    /// that did not confirm can still be promoted, and `WAIT` does not make the write
    /// durable on disk).
    pub wait_replicas: u32,
    /// How long `WAIT` waits for the replicas (default 100 ms; 1 ms..=60 s, shorter than
    /// [`request_timeout`](Self::request_timeout)).
    pub wait_timeout: Duration,
    /// TLS only: the certificate authorities (PEM) to trust instead of the web roots.
    pub ca_file: Option<PathBuf>,
    /// TLS only: the client certificate chain (PEM), with [`key_file`](Self::key_file).
    pub cert_file: Option<PathBuf>,
    /// TLS only: the client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
    /// Which server the locks live on: the URL's host, the primary Redis Sentinel names,
    /// or a Redis Cluster.
    pub topology: Topology,
}

/// Which server a [`RedisConfig`]'s locks live on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// The one server the URL names (`redis://`).
    #[default]
    Single,
    /// Whichever node these sentinels name as the primary, asked again whenever it stops
    /// answering or says it is a replica (`redis+sentinel://`).
    Sentinel(SentinelConfig),
    /// A Redis Cluster, found from these seed nodes (`redis+cluster://`): each lock lives
    /// on the primary of its key's hash slot.
    Cluster(Vec<HostPort>),
}

/// Where Redis Sentinel is asked for the primary (`redis+sentinel://s1,s2,s3/name`).
///
/// The sentinels are asked in order (`SENTINEL get-master-addr-by-name`); the node named
/// is checked with `ROLE` before it is used. They are asked without the URL's
/// credentials (those are the data nodes'), over TLS with the same `ca_file`,
/// `cert_file` and `key_file` for `rediss+sentinel://`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The sentinels, asked in this order.
    pub sentinels: Vec<HostPort>,
    /// The name they monitor the primary under.
    pub master: String,
}

/// The port of a sentinel named without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// [`RedisConfig::wait_timeout`] unless the URL says otherwise.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// The most replicas [`RedisConfig::wait_replicas`] may ask for.
pub const MAX_WAIT_REPLICAS: u32 = 1000;

/// How the per-key fence counter advances on each grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FenceMode {
    /// `max(counter + 1, server time in µs)`: tokens keep increasing when the server
    /// forgets the counter (restart without persistence, failover to an asynchronous
    /// replica) as long as the server's clock does not run backwards past the last token.
    /// One `TIME` call per grant; tokens are large numbers (µs since the epoch).
    ///
    /// The fence key `{K}:fence` expires: each grant, extension and fence raise keeps it
    /// alive for at least max(2 × ttl, 24 h) ([`FENCE_EXPIRY_FLOOR`]), so it always
    /// outlives its lock and idle lock names leave nothing behind after a day. Losing it
    /// then is harmless: the next token is floored at the server clock.
    ///
    /// [`FENCE_EXPIRY_FLOOR`]: crate::scripts::FENCE_EXPIRY_FLOOR
    #[default]
    ClockFloored,
    /// A plain `INCR`: small tokens, but they regress whenever the server loses the
    /// counter — the classic single-node fence, kept to show why the default exists.
    ///
    /// The counter key never expires (an expiry would regress tokens exactly like a data
    /// loss), so this mode keeps one small key per lock name ever used: the key space
    /// grows with the number of distinct names. Tokens are exact up to 2^53; a counter
    /// that reaches it is refused ([`LockError::Backend`]).
    Counter,
    /// No fence counter (`fence=none`): a free lock is taken by one `SET NX PX`, with no
    /// script and no second key — the single-node `SET NX` lock, for work that is
    /// idempotent or deduplicated downstream. A token's count is the client's clock in µs
    /// at the grant: grants by one client increase while its clock moves forward, but no
    /// counter backs them, so **tokens are not fences**, and
    /// [`capabilities`](tenure_api::DistributedLock::capabilities) says so
    /// ([`FencingKind::None`](tenure_api::FencingKind::None)); an
    /// [`Election`](tenure_api::Election) refuses it. Not for Redlock's nodes: Redlock
    /// spells it `fencing=false`.
    None,
}

impl FenceMode {
    /// The value of the `fence` URL option.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClockFloored => "clock",
            Self::Counter => "counter",
            Self::None => "none",
        }
    }
}

impl RedisConfig {
    /// tenure's query options.
    pub const OPTIONS: &[&str] = &[
        "prefix",
        "connect_timeout_ms",
        "request_timeout_ms",
        "fence",
        "wait_replicas",
        "wait_timeout_ms",
        "ca_file",
        "cert_file",
        "key_file",
    ];
    /// Older option names still read: `command_timeout_ms` is `request_timeout_ms`.
    pub const ALIASES: &[(&str, &str)] = &[("command_timeout_ms", "request_timeout_ms")];
    /// The query options the Redis client itself reads from a `redis://` URL (its
    /// `url_to_tcp_connection_info`), handed on to it.
    pub const CLIENT_OPTIONS: &[&str] = &["protocol"];

    /// The Redis key holding `key`'s lock: the prefixed name in a hash tag, so the lock
    /// and its fence counter share a Cluster slot.
    pub fn lock_key(&self, key: &LockKey) -> String {
        // Not `format!`: this runs on every request, and the formatter's first guess at
        // the capacity makes it grow the string again.
        let key = key.as_str();
        let mut lock_key = String::with_capacity(self.prefix.len() + key.len() + 2);
        lock_key.extend(["{", &self.prefix, key, "}"]);
        lock_key
    }

    /// `key`'s lock key followed by `suffix` (`""`; [`FENCE`]: its fence key;
    /// [`RELEASED`]: its release channel), to write straight into a command.
    pub(crate) fn key_name<'a>(&'a self, key: &'a LockKey, suffix: &'static str) -> KeyName<'a> {
        KeyName {
            prefix: &self.prefix,
            key: key.as_str(),
            suffix,
        }
    }

    /// Parses a URL; a bad URL or option is [`LockError::Config`].
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let scheme = text
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default();
        if scheme.ends_with("+sentinel") {
            return Self::sentinel(text);
        }
        if scheme.ends_with("+cluster") {
            return Self::cluster(text);
        }
        let url = LockUrl::parse(text, "Redis", &["redis", "rediss"], 6379)?;
        match url.hosts() {
            [host] => Self::node(&url, host, url.scheme() == "rediss", &[]),
            _ => Err(url.error(
                "a redis:// URL names one server (redlock:// takes several independent \
                 ones, redis+sentinel:// the sentinels of one primary, redis+cluster:// \
                 the seed nodes of a Redis Cluster)",
            )),
        }
    }

    /// `redis+sentinel://[user[:password]@]s1[:port],s2…/name[/db][?options]` (or
    /// `rediss+sentinel://`): the same options as `redis://`.
    fn sentinel(text: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(
            text,
            "Redis Sentinel",
            &["redis+sentinel", "rediss+sentinel"],
            DEFAULT_SENTINEL_PORT,
        )?;
        let (master, db) = url.path().split_once('/').unwrap_or((url.path(), ""));
        if master.is_empty() {
            return Err(url.error(
                "name the primary the sentinels monitor in the path: \
                 redis+sentinel://s1,s2,s3/mymaster",
            ));
        }
        let tls = url.scheme() == "rediss+sentinel";
        let mut config = Self::node_with_db(&url, &url.hosts()[0], tls, db, &[])?;
        config.topology = Topology::Sentinel(SentinelConfig {
            sentinels: url.hosts().to_vec(),
            master: master.to_owned(),
        });
        Ok(config)
    }

    /// `redis+cluster://[user[:password]@]h1[:port],h2…[?options]` (or
    /// `rediss+cluster://`): the same options as `redis://`, no database (a cluster has
    /// only database 0). `wait_replicas` counts the replicas of each lock's slot: `WAIT`
    /// follows the script in its pipeline, which goes to the slot's primary.
    fn cluster(text: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(
            text,
            "Redis Cluster",
            &["redis+cluster", "rediss+cluster"],
            6379,
        )?;
        if !url.path().trim_end_matches('/').is_empty() {
            return Err(url.error("a Redis Cluster has no databases but 0: no path"));
        }
        let tls = url.scheme() == "rediss+cluster";
        let mut config = Self::node_with_db(&url, &url.hosts()[0], tls, "", &[])?;
        config.topology = Topology::Cluster(url.hosts().to_vec());
        config.validate_cluster()?;
        Ok(config)
    }

    /// A Redis Cluster keeps a lock's keys in its key's hash slot through the hash tag
    /// `{prefix…}`: an empty prefix, or one starting with `}`, could make the tag empty
    /// and split them (one with a `}` elsewhere would put every lock in one slot).
    fn validate_cluster(&self) -> Result<(), LockError> {
        if !matches!(self.topology, Topology::Cluster(_)) {
            return Ok(());
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(LockError::Config(format!(
                "{self}: on a Redis Cluster the prefix must be non-empty and without braces \
                 (it starts the hash tag that keeps a lock's keys in one slot: empty or \
                 with a brace, the tag could be empty or shared by every lock), got {:?}",
                self.prefix
            )));
        }
        if !self.url.path().trim_matches('/').is_empty() {
            return Err(LockError::Config(format!(
                "{self}: a Redis Cluster has no database but 0"
            )));
        }
        Ok(())
    }

    /// The client for a Redis Cluster: its seed nodes with this configuration's
    /// credentials, TLS files and timeouts. With `pushes`, a client for subscriptions: it
    /// speaks RESP3 (whatever the URL's `protocol`), and sends its pushes there.
    pub(crate) fn cluster_client(
        &self,
        pushes: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
    ) -> Result<redis::cluster::ClusterClient, LockError> {
        let Topology::Cluster(seeds) = &self.topology else {
            return Err(LockError::Config(format!("{self} is not a Redis Cluster")));
        };
        let bad = |e: redis::RedisError| LockError::Config(format!("{self}: {e}"));
        let urls = seeds
            .iter()
            .map(|seed| Ok(self.at(seed)?.url.to_string()))
            .collect::<Result<Vec<_>, LockError>>()?;
        let mut builder = redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.request_timeout)
            // Retries (MOVED, ASK, a failover) stay within the call's own bound.
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(pushes) = pushes {
            builder = builder
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes);
        }
        if self.tls() {
            tenure_api::tls::install_crypto_provider();
            let pem = tenure_api::tls::read_pem_files(
                &self.endpoint(),
                self.ca_file.as_deref(),
                self.cert_file.as_deref(),
                self.key_file.as_deref(),
            )?;
            builder = builder.certs(redis::TlsCertificates {
                client_tls: pem
                    .identity
                    .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                root_cert: pem.ca,
            });
        }
        builder.build().map_err(bad)
    }

    /// This configuration for the node at `addr` (which a sentinel named): the same
    /// credentials, database, options and TLS files, no Sentinel.
    pub(crate) fn at(&self, addr: &HostPort) -> Result<Self, LockError> {
        let mut node = self.clone();
        node.topology = Topology::Single;
        let host = if addr.host.contains(':') {
            format!("[{}]", addr.host)
        } else {
            addr.host.clone()
        };
        let unusable = |why: String| LockError::Unavailable {
            message: format!("{}: node {addr}: {why}", self.endpoint()),
            source: None,
        };
        node.url
            .set_host(Some(&host))
            .map_err(|e| unusable(e.to_string()))?;
        node.url
            .set_port(Some(addr.port))
            .map_err(|()| unusable("no port can be set".into()))?;
        Ok(node)
    }

    /// The configuration a sentinel at `addr` is asked with: TLS as the data nodes, no
    /// credentials, no database.
    pub(crate) fn sentinel_node(&self, addr: &HostPort) -> Result<Self, LockError> {
        let mut node = self.at(addr)?;
        node.url.set_path("");
        node.url.set_query(None);
        let _ = node.url.set_username("");
        let _ = node.url.set_password(None);
        Ok(node)
    }

    /// The server at `host` (over TLS if `tls`) with a decoded URL's credentials, database
    /// (the path) and options, except those in `theirs`, which the caller reads (Redlock's
    /// own). An option neither this type's nor the client's nor in `theirs` is
    /// [`LockError::Config`].
    pub fn node(
        url: &LockUrl,
        host: &HostPort,
        tls: bool,
        theirs: &[&str],
    ) -> Result<Self, LockError> {
        Self::node_with_db(url, host, tls, url.path(), theirs)
    }

    fn node_with_db(
        url: &LockUrl,
        host: &HostPort,
        tls: bool,
        db: &str,
        theirs: &[&str],
    ) -> Result<Self, LockError> {
        let scheme = if tls { "rediss" } else { "redis" };
        let mut config = Self {
            url: client_url(url, scheme, host, db)?,
            prefix: "tenure:".into(),
            connect_timeout: Duration::from_millis(1000),
            request_timeout: Duration::from_millis(1000),
            fence: FenceMode::default(),
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            ca_file: None,
            cert_file: None,
            key_file: None,
            topology: Topology::Single,
        };
        let mut wait_timeout_set = false;
        let mut handed_on = Vec::new();
        for (name, value) in url.options_aliased(Self::ALIASES)? {
            let millis = || url.millis(name, value, 1..=600_000);
            match name {
                "prefix" => config.prefix = value.to_string(),
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "request_timeout_ms" => config.request_timeout = millis()?,
                "wait_replicas" => {
                    config.wait_replicas = value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=MAX_WAIT_REPLICAS).contains(n))
                        .ok_or_else(|| {
                            url.error(format!(
                                "wait_replicas={value:?}: expected a number of replicas in \
                                 1..={MAX_WAIT_REPLICAS}"
                            ))
                        })?
                }
                "wait_timeout_ms" => {
                    config.wait_timeout = url.millis(name, value, 1..=60_000)?;
                    wait_timeout_set = true;
                }
                "ca_file" | "cert_file" | "key_file" => {
                    let path = Some(url.tls_file(name, value, tls, "rediss")?);
                    match name {
                        "ca_file" => config.ca_file = path,
                        "cert_file" => config.cert_file = path,
                        _ => config.key_file = path,
                    }
                }
                "fence" => {
                    config.fence = match value {
                        "clock" => FenceMode::ClockFloored,
                        "counter" => FenceMode::Counter,
                        "none" => FenceMode::None,
                        other => {
                            return Err(url.error(format!(
                                "fence={other:?}: expected clock, counter or none"
                            )))
                        }
                    }
                }
                _ if Self::CLIENT_OPTIONS.contains(&name) => handed_on.push((name, value)),
                _ if theirs.contains(&name) => {}
                other => {
                    return Err(url.unknown_option(
                        other,
                        &[
                            theirs,
                            Self::OPTIONS,
                            Self::CLIENT_OPTIONS,
                            &alias_names(Self::ALIASES),
                        ],
                    ))
                }
            }
        }
        if wait_timeout_set && config.wait_replicas == 0 {
            return Err(url.error("wait_timeout_ms needs wait_replicas"));
        }
        if !handed_on.is_empty() {
            config.url.query_pairs_mut().extend_pairs(handed_on);
        }
        config.validate_wait()?;
        Ok(config)
    }

    /// The URL handed to the Redis client (with its password). A Sentinel configuration
    /// names no one server: [`LockError::Config`] (connect with
    /// [`RedisLock`](crate::RedisLock), which asks the sentinels).
    pub fn client_url(&self) -> Result<&str, LockError> {
        match &self.topology {
            Topology::Single => Ok(self.url.as_str()),
            Topology::Sentinel(_) => Err(LockError::Config(format!(
                "{self} names no one server: the sentinels name the primary"
            ))),
            Topology::Cluster(_) => Err(LockError::Config(format!(
                "{self} names no one server: a Redis Cluster spreads keys over its primaries"
            ))),
        }
    }

    /// Checks the settings a caller may have set directly on the public fields: the
    /// connect and request timeouts within 1 ms..=600 s (as the URL options), the replica
    /// wait as its URL options allow, and TLS files only over TLS. A violation is
    /// [`LockError::Config`]. (That a client certificate
    /// comes with its key is checked when the files are read, at connect.)
    pub fn validate(&self) -> Result<(), LockError> {
        let range = Duration::from_millis(1)..=Duration::from_secs(600);
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if !range.contains(&value) {
                return Err(LockError::Config(format!(
                    "{name} {value:?} for {} must be within 1ms..=600s",
                    self.endpoint()
                )));
            }
        }
        self.validate_wait()?;
        match &self.topology {
            Topology::Sentinel(sentinel)
                if sentinel.sentinels.is_empty() || sentinel.master.is_empty() =>
            {
                return Err(LockError::Config(
                    "a Redis Sentinel configuration needs at least one sentinel and the \
                     primary's name"
                        .into(),
                ))
            }
            Topology::Cluster(seeds) if seeds.is_empty() => {
                return Err(LockError::Config(
                    "a Redis Cluster configuration needs at least one seed node".into(),
                ))
            }
            _ => self.validate_cluster()?,
        }
        self.validate_tls()
    }

    /// `wait_replicas` within 0..=[`MAX_WAIT_REPLICAS`]; when set, `wait_timeout` within
    /// 1 ms..=60 s and shorter than the request timeout, which must also cover the
    /// `WAIT`'s reply.
    fn validate_wait(&self) -> Result<(), LockError> {
        if self.wait_replicas == 0 {
            return Ok(());
        }
        let endpoint = self.endpoint();
        if self.wait_replicas > MAX_WAIT_REPLICAS {
            return Err(LockError::Config(format!(
                "wait_replicas {} for {endpoint} must be at most {MAX_WAIT_REPLICAS}",
                self.wait_replicas
            )));
        }
        let range = Duration::from_millis(1)..=Duration::from_secs(60);
        if !range.contains(&self.wait_timeout) {
            return Err(LockError::Config(format!(
                "wait_timeout {:?} for {endpoint} must be within 1ms..=60s",
                self.wait_timeout
            )));
        }
        if self.wait_timeout >= self.request_timeout {
            return Err(LockError::Config(format!(
                "wait_timeout {:?} for {endpoint} must be shorter than request_timeout {:?} \
                 (the request waits for the replicas)",
                self.wait_timeout, self.request_timeout
            )));
        }
        Ok(())
    }

    /// Whether the connection is TLS (`rediss://`).
    pub fn tls(&self) -> bool {
        self.url.scheme() == "rediss"
    }

    /// TLS files are for TLS connections only (also checked per option when parsing).
    fn validate_tls(&self) -> Result<(), LockError> {
        let named = [&self.ca_file, &self.cert_file, &self.key_file];
        if !self.tls() && named.iter().any(|f| f.is_some()) {
            return Err(LockError::Config(format!(
                "{}: ca_file, cert_file and key_file need TLS (rediss://)",
                self.endpoint()
            )));
        }
        Ok(())
    }

    /// The Redis client for this server: with the configured CA and client certificate
    /// when they are given, which are read from their files now.
    pub(crate) fn client(&self) -> Result<redis::Client, LockError> {
        let bad = |e: redis::RedisError| LockError::Config(format!("{self}: {e}"));
        if self.tls() {
            tenure_api::tls::install_crypto_provider();
        }
        if self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none() {
            return redis::Client::open(self.client_url()?).map_err(bad);
        }
        let pem = tenure_api::tls::read_pem_files(
            &self.endpoint(),
            self.ca_file.as_deref(),
            self.cert_file.as_deref(),
            self.key_file.as_deref(),
        )?;
        let client_tls = pem
            .identity
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            });
        redis::Client::build_with_tls(
            self.client_url()?,
            redis::TlsCertificates {
                client_tls,
                root_cert: pem.ca,
            },
        )
        .map_err(bad)
    }

    /// `host:port` of the server; with Sentinel, `primary NAME via sentinels s1:p,…`.
    pub fn endpoint(&self) -> String {
        match &self.topology {
            Topology::Single => {}
            Topology::Sentinel(sentinel) => {
                return format!(
                    "primary {:?} via sentinels {}",
                    sentinel.master,
                    host_list(&sentinel.sentinels)
                )
            }
            Topology::Cluster(seeds) => return format!("cluster {}", host_list(seeds)),
        }
        format!(
            "{}:{}",
            self.url.host_str().unwrap_or_default(),
            self.url.port().unwrap_or(6379)
        )
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, hosts, name) = match &self.topology {
            Topology::Single => return f.write_str(&redact(&self.url)),
            Topology::Sentinel(s) => ("sentinel", &s.sentinels, Some(&s.master)),
            Topology::Cluster(seeds) => ("cluster", seeds, None),
        };
        // The data nodes' URL with the sentinels or seeds in place of its host, and the
        // primary's name before its database.
        let node = redact(&self.url);
        let (scheme, rest) = node.split_once("://").unwrap_or(("redis", &node));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let userinfo = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
        let db = path.split(['?']).next().unwrap_or_default();
        let query = path.split_once('?').map(|(_, q)| format!("?{q}"));
        let path: Vec<&str> = name
            .map(String::as_str)
            .into_iter()
            .chain(Some(db).filter(|db| !db.is_empty()))
            .collect();
        write!(
            f,
            "{scheme}+{kind}://{}{}{}{}{}",
            userinfo.unwrap_or_default(),
            host_list(hosts),
            if path.is_empty() { "" } else { "/" },
            path.join("/"),
            query.unwrap_or_default()
        )
    }
}

fn host_list(hosts: &[HostPort]) -> String {
    hosts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("fence", &self.fence)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("topology", &self.topology)
            .finish()
    }
}

/// The URL the Redis client gets for the node at `host`: the decoded credentials and the
/// database number (the path: empty or a number), encoded again by `url::Url`.
fn client_url(
    url: &LockUrl,
    scheme: &str,
    host: &HostPort,
    db: &str,
) -> Result<url::Url, LockError> {
    let db = db.trim_end_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(url.error(format!("the database {db:?} is not a number")));
    }
    let text = format!("{scheme}://{host}/{db}");
    let mut client = url::Url::parse(&text).map_err(|e| url.error(e))?;
    // Encoded again in full: `url::Url` leaves a `%` as it is, and the client decodes.
    let credentials = match (url.user(), url.password()) {
        (Some(user), password) => client
            .set_username(&percent_encode(user))
            .and_then(|()| client.set_password(password.map(percent_encode).as_deref())),
        (None, _) => Ok(()),
    };
    credentials.map_err(|()| url.error("the credentials cannot be handed to the client"))?;
    Ok(client)
}

/// The URL with any password replaced by `***`.
pub fn redact(url: &url::Url) -> String {
    redact_url(url.as_str())
}

/// The suffix of a lock key's fence key.
pub(crate) const FENCE: &str = ":fence";
/// The suffix of a lock key's release channel.
pub(crate) const RELEASED: &str = ":released";
/// The suffix of a lock key's readers' records (a hash, see
/// [`ACQUIRE_SHARED`](crate::scripts::ACQUIRE_SHARED)).
pub(crate) const READERS: &str = ":readers";
/// The suffix of a lock key's waiting writer's mark.
pub(crate) const WRITER: &str = ":writer";

/// A lock key (as [`RedisConfig::lock_key`]) with a suffix, written where it is needed:
/// a request names two or three of them, and a string for each was a tenth of a Redlock
/// cycle's allocations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyName<'a> {
    prefix: &'a str,
    key: &'a str,
    suffix: &'static str,
}

impl std::fmt::Display for KeyName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in ["{", self.prefix, self.key, "}", self.suffix] {
            f.write_str(part)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_is_the_prefixed_key_in_one_hash_tag() {
        let c = RedisConfig::from_url("redis://h?prefix=app:").unwrap();
        let key = LockKey::new("jobs/nightly-report").unwrap();
        assert_eq!(c.lock_key(&key), "{app:jobs/nightly-report}");
        assert_eq!(c.key_name(&key, "").to_string(), c.lock_key(&key));
        assert_eq!(
            c.key_name(&key, FENCE).to_string(),
            "{app:jobs/nightly-report}:fence"
        );
        assert_eq!(
            c.key_name(&key, RELEASED).to_string(),
            "{app:jobs/nightly-report}:released"
        );
        let bare = RedisConfig::from_url("redis://h?prefix=").unwrap();
        assert_eq!(bare.lock_key(&key), "{jobs/nightly-report}");
    }

    #[test]
    fn options_are_parsed_and_stripped() {
        let c = RedisConfig::from_url(
            "redis://u:s3cret@h:7000/2?prefix=app:&command_timeout_ms=250&protocol=resp3&fence=counter",
        )
        .unwrap();
        assert_eq!(c.prefix, "app:");
        assert_eq!(c.fence, FenceMode::Counter);
        assert_eq!(
            RedisConfig::from_url("redis://h").unwrap().fence,
            FenceMode::ClockFloored
        );
        for mode in [FenceMode::ClockFloored, FenceMode::Counter, FenceMode::None] {
            let url = format!("redis://h?fence={}", mode.as_str());
            assert_eq!(RedisConfig::from_url(&url).unwrap().fence, mode);
        }
        let refused = RedisConfig::from_url("redis://h?fence=off").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("expected clock, counter or none"),
            "{refused}"
        );
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(
            c.client_url().unwrap(),
            "redis://u:s3cret@h:7000/2?protocol=resp3"
        );
        assert_eq!(c.endpoint(), "h:7000");
    }

    /// Issue 18 item 7: an unknown option (`?bogus=1`, a misspelt `comand_timeout_ms`)
    /// was handed on to the Redis client, which ignored it.
    #[test]
    fn options_are_strict() {
        tenure_conformance::url_options::assert_alias(
            RedisConfig::from_url,
            "redis://h",
            ("command_timeout_ms", "request_timeout_ms"),
            "250",
        );
        tenure_conformance::url_options::assert_strict_options(
            RedisConfig::from_url,
            "rediss://u:pw@h:7000/2",
            &[RedisConfig::OPTIONS, RedisConfig::CLIENT_OPTIONS],
            &[
                ("prefix", "app:"),
                ("connect_timeout_ms", "250"),
                ("request_timeout_ms", "250"),
                ("fence", "counter"),
                ("wait_replicas", "1"),
                // Only with wait_replicas (its own effect: replica_waits_are_parsed…).
                ("wait_timeout_ms", "50&wait_replicas=1"),
                ("ca_file", "/ca.pem"),
                ("cert_file", "/client.pem"),
                ("key_file", "/client.key"),
                ("protocol", "resp3"),
            ],
        );
        let err = RedisConfig::from_url("redis://u:hunter2@h/0?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    /// A review found the credentials decoded twice: once by `LockUrl`, once more by the
    /// Redis client, after `url::Url` had put them back without encoding `%`.
    #[test]
    fn credentials_reach_the_client_decoded_once() {
        for (text, user, password) in [
            ("redis://:ab%2541@h", "", "ab%41"),
            ("redis://u%40x:p%3Aw%20d%2F@h", "u@x", "p:w d/"),
            ("redis://:x%25E9@h/1", "", "x%E9"),
            ("rediss://%C3%A9:%25@h", "\u{e9}", "%"),
        ] {
            let client =
                url::Url::parse(RedisConfig::from_url(text).unwrap().client_url().unwrap())
                    .unwrap();
            let decoded = |part: &str| tenure_api::admin::percent_decode(part).unwrap();
            assert_eq!(decoded(client.username()), user, "{text}");
            assert_eq!(
                client.password().map(decoded).as_deref(),
                Some(password),
                "{text}"
            );
        }
    }

    #[test]
    fn secrets_are_redacted_everywhere() {
        let c = RedisConfig::from_url("rediss://user:hunter2@h/0").unwrap();
        for shown in [format!("{c}"), format!("{c:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        let err = RedisConfig::from_url("redis://user:hunter2@h:notaport").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = RedisConfig::from_url("redis://user:hunter2@h/x").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    /// Issue 15, defect 7: a timeout set directly on the public fields reached
    /// `connect_timeout * 2` in `RedisLock::with_config` and overflowed (a panic).
    #[test]
    fn timeouts_set_on_the_fields_are_validated() {
        let good = RedisConfig::from_url("redis://h").unwrap();
        assert!(good.validate().is_ok());
        for (connect, command) in [
            (Duration::MAX, Duration::from_secs(1)),
            (Duration::from_secs(1), Duration::ZERO),
            (Duration::from_secs(601), Duration::from_secs(1)),
        ] {
            let mut bad = good.clone();
            bad.connect_timeout = connect;
            bad.request_timeout = command;
            assert!(
                matches!(bad.validate(), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn replica_waits_are_parsed_and_validated() {
        let off = RedisConfig::from_url("redis://h").unwrap();
        assert_eq!(off.wait_replicas, 0);
        let on = RedisConfig::from_url(
            "redis://h?wait_replicas=2&wait_timeout_ms=250&request_timeout_ms=2000",
        )
        .unwrap();
        assert_eq!(on.wait_replicas, 2);
        assert_eq!(on.wait_timeout, Duration::from_millis(250));
        let defaulted = RedisConfig::from_url("redis://h?wait_replicas=1").unwrap();
        assert_eq!(defaulted.wait_timeout, crate::DEFAULT_WAIT_TIMEOUT);
        // WAIT's reply must come within the request timeout.
        let err = RedisConfig::from_url("redis://h?wait_replicas=1&wait_timeout_ms=1000")
            .unwrap_err()
            .to_string();
        assert!(err.contains("shorter than request_timeout"), "{err}");
        let err = RedisConfig::from_url("redis://h?wait_timeout_ms=50")
            .unwrap_err()
            .to_string();
        assert!(err.contains("wait_timeout_ms needs wait_replicas"), "{err}");
        for (replicas, wait) in [
            (1, Duration::ZERO),
            (1, Duration::from_secs(61)),
            (1, on.request_timeout),
            (crate::MAX_WAIT_REPLICAS + 1, Duration::from_millis(10)),
        ] {
            let mut bad = on.clone();
            bad.wait_replicas = replicas;
            bad.wait_timeout = wait;
            assert!(
                matches!(bad.validate(), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "http://h",
            "redis://",
            "redis://h?command_timeout_ms=0",
            "redis://h?connect_timeout_ms=abc",
            "redis://h/notadb",
            "redis://h?fence=",
            "redis://h?fence=lamport",
            "redis://h?wait_replicas=0",
            "redis://h?wait_replicas=-1",
            "redis://h?wait_replicas=two",
            "redis://h?wait_replicas=1001",
            "redis://h?wait_timeout_ms=50",
            "redis://h?wait_replicas=1&wait_timeout_ms=0",
            "redis://h?wait_replicas=1&wait_timeout_ms=1000",
            "redis://h?wait_replicas=1&wait_timeout_ms=300&request_timeout_ms=300",
            "redis+sentinel://s1,s2",
            "redis+sentinel://s1/",
            "redis+sentinel://s1//0",
            "redis+sentinel://s1/m/notadb",
            "redis+sentinel://s1/m?unknown=1",
            "redis+sentinel://s1/m?ca_file=/x.pem",
            "redis://h1,h2",
        ] {
            assert!(
                matches!(RedisConfig::from_url(bad), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_primary_and_the_data_nodes_settings() {
        let c = RedisConfig::from_url(
            "redis+sentinel://app:s3cret@s1,s2:26380,[::1]:7/mymaster/3?prefix=x:&fence=counter&protocol=resp3",
        )
        .unwrap();
        let Topology::Sentinel(sentinel) = &c.topology else {
            panic!("{:?}", c.topology)
        };
        assert_eq!(sentinel.master, "mymaster");
        let hosts: Vec<String> = sentinel.sentinels.iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["s1:26379", "s2:26380", "[::1]:7"]);
        assert_eq!((c.prefix.as_str(), c.fence), ("x:", FenceMode::Counter));
        // A node the sentinels name gets the credentials, database and client options.
        let node = c
            .at(&HostPort {
                host: "10.0.0.9".into(),
                port: 6390,
            })
            .unwrap();
        assert_eq!(node.topology, Topology::Single);
        assert_eq!(
            node.client_url().unwrap(),
            "redis://app:s3cret@10.0.0.9:6390/3?protocol=resp3"
        );
        // A sentinel is asked without them.
        let asked = c.sentinel_node(&sentinel.sentinels[2]).unwrap();
        assert_eq!(asked.client_url().unwrap(), "redis://[::1]:7");
        assert!(matches!(c.client_url(), Err(LockError::Config(_))));
        for shown in [c.to_string(), format!("{c:?}"), c.endpoint()] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert_eq!(
            c.to_string(),
            "redis+sentinel://app:***@s1:26379,s2:26380,[::1]:7/mymaster/3?protocol=resp3"
        );
        assert_eq!(
            c.endpoint(),
            "primary \"mymaster\" via sentinels s1:26379,s2:26380,[::1]:7"
        );
        let tls = RedisConfig::from_url("REDISS+SENTINEL://s1/m?ca_file=/ca.pem").unwrap();
        assert!(tls.tls());
        assert_eq!(
            tls.sentinel_node(&HostPort {
                host: "s1".into(),
                port: DEFAULT_SENTINEL_PORT
            })
            .unwrap()
            .client_url()
            .unwrap(),
            "rediss://s1:26379"
        );
    }

    #[test]
    fn cluster_urls_name_the_seeds_and_keep_the_data_nodes_settings() {
        let c = RedisConfig::from_url(
            "redis+cluster://app:s3cret@h1:7000,h2:7001?prefix=x:&request_timeout_ms=300",
        )
        .unwrap();
        let Topology::Cluster(seeds) = &c.topology else {
            panic!("{:?}", c.topology)
        };
        let seeds: Vec<String> = seeds.iter().map(ToString::to_string).collect();
        assert_eq!(seeds, ["h1:7000", "h2:7001"]);
        assert_eq!(c.request_timeout, Duration::from_millis(300));
        assert_eq!(c.to_string(), "redis+cluster://app:***@h1:7000,h2:7001");
        assert_eq!(c.endpoint(), "cluster h1:7000,h2:7001");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(matches!(c.client_url(), Err(LockError::Config(_))));
        c.cluster_client(None).unwrap();
        // WAIT rides in the script's pipeline, to the slot's primary.
        let confirmed = RedisConfig::from_url("redis+cluster://h1?wait_replicas=2").unwrap();
        assert_eq!(confirmed.wait_replicas, 2);
        for bad in [
            "redis+cluster://h1?prefix=",
            "redis+cluster://h1?prefix=%7Dx",
            "redis+cluster://h1?prefix=app%7D",
            "redis+cluster://h1/0",
            "redis+cluster://h1?wait_timeout_ms=100",
            "redis+cluster://h1?unknown=1",
        ] {
            assert!(
                matches!(RedisConfig::from_url(bad), Err(LockError::Config(_))),
                "{bad}"
            );
        }
    }
}
