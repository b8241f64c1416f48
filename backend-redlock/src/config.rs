//! `redlock://` URLs: one set of credentials and options, a comma-separated host list.

use std::fmt;
use std::time::Duration;

use tenure_api::urls::LockUrl;
use tenure_api::LockError;
use tenure_redis::RedisConfig;

/// Redlock over N independent Redis masters.
///
/// Parsed from `redlock://[user[:password]@]h1:p1,h2:p2,…[/db][?options]` (or
/// `redlocks://` for TLS to every node). Options: `prefix`, `connect_timeout_ms`,
/// `request_timeout_ms` (per node, passed to each node's client); `node_timeout_ms` (each
/// node's share of one round, the bound the round waits for it; default ttl/100, at least
/// 50 ms); `fencing=false` (one round trip per acquire,
/// no fencing token guarantee); `fence=counter` (each node's counter is a plain `INCR`
/// instead of clock-floored, see [`tenure_redis::FenceMode`]); the other options of
/// [`RedisConfig`] ([`RedisConfig::OPTIONS`], [`RedisConfig::CLIENT_OPTIONS`]) are passed
/// to every node. Any other option is [`LockError::Config`].
/// Passwords never appear in `Debug`, `Display` or errors.
#[derive(Clone, PartialEq, Eq)]
pub struct RedlockConfig {
    /// One configuration per node.
    pub nodes: Vec<RedisConfig>,
    /// Per-node request bound; `None`: ttl/100, at least [`MIN_NODE_TIMEOUT`].
    pub node_timeout: Option<Duration>,
    /// Whether acquires run the second (fence) round.
    pub fencing: bool,
}

/// The smallest default per-node timeout. The bound only decides how long a slow or dead
/// node may hold up a round (safety comes from the validity check), so it errs on the
/// side of not failing healthy nodes: with 10 ms, a loaded two-core host running five
/// redis-servers timed healthy nodes out and acquires failed with `NoQuorum`.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The largest per-node timeout: the default (ttl/100) is capped here, and an explicit
/// `node_timeout` above it is a configuration error.
pub const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(60);

impl RedlockConfig {
    /// Redlock's own query options (the nodes' come on top).
    pub const OPTIONS: &[&str] = &["node_timeout_ms", "fencing"];

    /// Builds a configuration from node configurations: at least one, each a different
    /// server (see [`validate`](Self::validate)).
    pub fn new(nodes: Vec<RedisConfig>) -> Result<Self, LockError> {
        let config = Self {
            nodes,
            node_timeout: None,
            fencing: true,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what [`new`](Self::new), [`from_url`](Self::from_url) and
    /// [`Redlock::with_config`](crate::Redlock::with_config) require (the fields are
    /// public, so a configuration can be built without them):
    ///
    /// - at least one node;
    /// - no node listed twice. Two entries are the same node when host and port are equal
    ///   after normalisation: the host compared case-insensitively, without IPv6
    ///   brackets, IP addresses in canonical form (`[0:0::1]` = `[::1]`), the default
    ///   port 6379 filled in. Database number, prefix and credentials do not make a
    ///   different node. Names are not resolved: `localhost` and `127.0.0.1` count as
    ///   different nodes, as do two DNS names of one server — a quorum counted over such
    ///   a list is only as real as the list;
    /// - `node_timeout`, if set, within 1 ms..=60 s (as the URL option), and longer than
    ///   the nodes' `wait_timeout` when they ask replicas to confirm (`wait_replicas`);
    /// - each node's `connect_timeout` and `request_timeout` within 1 ms..=600 s (as the
    ///   Redis URL options).
    ///
    /// Any violation is [`LockError::Config`]; passwords never appear in it.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.nodes.is_empty() {
            return Err(LockError::Config("Redlock needs at least one node".into()));
        }
        let mut seen: Vec<(String, u16)> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            if node.topology != tenure_redis::Topology::Single {
                return Err(LockError::Config(format!(
                    "Redlock node {node} is not one server: a quorum counts independent \
                     Redis servers, not Sentinel groups or clusters"
                )));
            }
            if node.fence == tenure_redis::FenceMode::None {
                return Err(LockError::Config(
                    "fence=none is single Redis's; Redlock without fence rounds is \
                     fencing=false"
                        .into(),
                ));
            }
            let id = node_identity(node);
            if seen.contains(&id) {
                return Err(LockError::Config(format!(
                    "Redlock node {} is listed more than once in {self}: a quorum must count \
                     independent servers",
                    node.endpoint()
                )));
            }
            seen.push(id);
        }
        if let Some(bound) = self.node_timeout {
            if !(Duration::from_millis(1)..=MAX_NODE_TIMEOUT).contains(&bound) {
                return Err(LockError::Config(format!(
                    "node_timeout {bound:?} must be within 1ms..={MAX_NODE_TIMEOUT:?}"
                )));
            }
            if let Some(wait) = self.replica_wait() {
                if bound <= wait {
                    return Err(LockError::Config(format!(
                        "node_timeout {bound:?} must be longer than wait_timeout {wait:?} \
                         (each node's request waits for its replicas)"
                    )));
                }
            }
        }
        for node in &self.nodes {
            node.validate()?;
        }
        Ok(())
    }

    /// Parses a `redlock://` or `redlocks://` URL.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(text, "Redlock", &["redlock", "redlocks"], 6379)?;
        let mut node_timeout = None;
        let mut fencing = true;
        for (name, value) in url.options() {
            match name {
                "node_timeout_ms" => node_timeout = Some(url.millis(name, value, 1..=60_000)?),
                "fencing" => {
                    fencing = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(url.error("fencing must be true or false")),
                    }
                }
                _ => {} // the nodes' options, read (and checked) by `RedisConfig::node`
            }
        }
        let tls = url.scheme() == "redlocks";
        let nodes = url
            .hosts()
            .iter()
            .map(|host| RedisConfig::node(&url, host, tls, Self::OPTIONS))
            .collect::<Result<Vec<_>, _>>()?;
        let mut config = Self::new(nodes)?;
        config.node_timeout = node_timeout;
        config.fencing = fencing;
        config.validate()?;
        Ok(config)
    }

    /// Nodes that must agree: ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The per-node bound for a lease of `ttl`: `node_timeout` if set, else ttl/100
    /// within [`MIN_NODE_TIMEOUT`]..=[`MAX_NODE_TIMEOUT`], plus the longest
    /// `wait_timeout` of nodes that ask replicas to confirm (their `WAIT` is part of the
    /// request). Never overflows.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout.unwrap_or_else(|| {
            (ttl / 100).clamp(MIN_NODE_TIMEOUT, MAX_NODE_TIMEOUT)
                + self.replica_wait().unwrap_or_default()
        })
    }

    /// The longest `wait_timeout` among nodes with `wait_replicas`, if any has it.
    fn replica_wait(&self) -> Option<Duration> {
        self.nodes
            .iter()
            .filter(|node| node.wait_replicas > 0)
            .map(|node| node.wait_timeout)
            .max()
    }
}

/// A node's identity for duplicate detection: normalised host and port.
fn node_identity(node: &RedisConfig) -> (String, u16) {
    // `endpoint()` is `host:port` with the port filled in (IPv6 hosts in brackets).
    let endpoint = node.endpoint();
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().unwrap_or(6379)),
        None => (endpoint.as_str(), 6379),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.trim_end_matches('.').to_ascii_lowercase(),
    };
    (host, port)
}

impl fmt::Display for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(ToString::to_string).collect();
        write!(f, "redlock[{}]", nodes.join(", "))
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("nodes", &self.nodes)
            .field("node_timeout", &self.node_timeout)
            .field("fencing", &self.fencing)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_and_options() {
        let c = RedlockConfig::from_url(
            "redlock://:pw@a:7000,b:7001,[::1]:7002/3?prefix=x:&node_timeout_ms=20&fencing=false",
        )
        .unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.node_timeout, Some(Duration::from_millis(20)));
        assert!(!c.fencing);
        assert_eq!(c.nodes[1].endpoint(), "b:7001");
        assert_eq!(c.nodes[0].prefix, "x:");
        assert!(!format!("{c} {c:?}").contains("pw"));
    }

    /// Single Redis's `fence=none` would leave Redlock's fence round a counter to raise
    /// that its grants never count: Redlock's unfenced mode is `fencing=false`.
    #[test]
    fn fence_none_is_refused_for_fencing_false() {
        let refused = RedlockConfig::from_url("redlock://a:1,b:2,c:3?fence=none").unwrap_err();
        assert!(
            matches!(&refused, LockError::Config(m) if m.contains("fencing=false")),
            "{refused}"
        );
        assert!(RedlockConfig::from_url("redlock://a:1,b:2,c:3?fencing=false").is_ok());
    }

    /// Issue 18 item 7: an unknown option was handed on to every node's Redis client,
    /// which ignored it.
    #[test]
    fn options_are_strict() {
        tenure_conformance::url_options::assert_alias(
            RedlockConfig::from_url,
            "redlock://a,b,c",
            ("command_timeout_ms", "request_timeout_ms"),
            "250",
        );
        tenure_conformance::url_options::assert_strict_options(
            RedlockConfig::from_url,
            "redlocks://u:pw@a:1,b:2,c:3/1",
            &[
                RedlockConfig::OPTIONS,
                RedisConfig::OPTIONS,
                RedisConfig::CLIENT_OPTIONS,
            ],
            &[
                ("node_timeout_ms", "20"),
                ("fencing", "false"),
                ("prefix", "app:"),
                ("connect_timeout_ms", "250"),
                ("request_timeout_ms", "250"),
                ("fence", "counter"),
                ("wait_replicas", "1"),
                // Only with wait_replicas (see tenure-redis's replica_waits_are_parsed…).
                ("wait_timeout_ms", "50&wait_replicas=1"),
                ("ca_file", "/ca.pem"),
                ("cert_file", "/client.pem"),
                ("key_file", "/client.key"),
                ("protocol", "resp3"),
            ],
        );
        let err = RedlockConfig::from_url("redlock://:hunter2@a,b,c?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn node_timeouts_cover_the_replica_wait() {
        let c =
            RedlockConfig::from_url("redlock://a,b,c?wait_replicas=1&wait_timeout_ms=300").unwrap();
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(30)),
            Duration::from_millis(300 + 300)
        );
        let err = RedlockConfig::from_url(
            "redlock://a,b,c?wait_replicas=1&wait_timeout_ms=300&node_timeout_ms=300",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("longer than wait_timeout"), "{err}");
        assert!(RedlockConfig::from_url(
            "redlock://a,b,c?wait_replicas=1&wait_timeout_ms=300&node_timeout_ms=301"
        )
        .is_ok());
    }

    #[test]
    fn default_node_timeout_scales_with_ttl() {
        let c = RedlockConfig::from_url("redlock://a,b,c").unwrap();
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(30)),
            Duration::from_millis(300)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_millis(100)),
            MIN_NODE_TIMEOUT
        );
    }

    #[test]
    fn duplicate_nodes_are_config_errors() {
        for dup in [
            "redlock://a:6379,a:6379,b:6379",
            "redlock://a,a:6379,b",
            "redlock://Host-A:7000,b,host-a:7000",
            "redlock://[::1]:7000,[0:0::1]:7000,b",
            "redlock://[::1],b,[::1]:6379",
            "redlock://127.0.0.1,b,127.0.0.1:6379/1",
            "redlock://:secret@a,b,A",
        ] {
            match RedlockConfig::from_url(dup) {
                Err(LockError::Config(msg)) => {
                    assert!(msg.contains("more than once"), "{dup}: {msg}");
                    assert!(!msg.contains("secret"), "{msg}");
                }
                other => panic!("{dup:?}: {other:?}"),
            }
        }
        // Different ports, or names that are only equal after a DNS lookup, stay distinct.
        for distinct in [
            "redlock://a:7000,a:7001,b",
            "redlock://localhost:7000,127.0.0.1:7000,b",
        ] {
            assert_eq!(RedlockConfig::from_url(distinct).unwrap().nodes.len(), 3);
        }
        let node = |url: &str| RedisConfig::from_url(url).unwrap();
        let nodes = vec![
            node("redis://a:1"),
            node("redis://b:1"),
            node("redis://A:1/2"),
        ];
        assert!(matches!(
            RedlockConfig::new(nodes),
            Err(LockError::Config(msg)) if msg.contains("more than once")
        ));
    }

    #[test]
    fn node_timeout_is_bounded_for_any_ttl() {
        let c = RedlockConfig::from_url("redlock://a,b,c").unwrap();
        for ttl in [
            Duration::ZERO,
            Duration::from_nanos(1),
            tenure_api::MAX_TTL,
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            let bound = c.node_timeout_for(ttl);
            assert!(
                (MIN_NODE_TIMEOUT..=MAX_NODE_TIMEOUT).contains(&bound),
                "{ttl:?}: {bound:?}"
            );
        }
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        for bad in [
            "",
            "redis://a",
            "redlock://",
            "redlock://a,,b",
            "redlock://a:0",
            "redlock://a:99999",
            "redlock://[::1",
            "redlock://a?fencing=maybe",
            "redlock://u:secret@a,b:x",
            "redlock://a?node_timeout_ms=0",
        ] {
            match RedlockConfig::from_url(bad) {
                Err(LockError::Config(msg)) => assert!(!msg.contains("secret"), "{msg}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let alphabet = [
            "redlock://",
            "redlocks://",
            "@",
            ":",
            ",",
            "[",
            "]",
            "/",
            "?",
            "=",
            "&",
            "a",
            "1",
            "é",
            "%",
        ];
        let mut seed = 0x2545F4914F6CDD1Du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(seed % 12) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                text.push_str(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let _ = RedlockConfig::from_url(&text);
        }
    }
}
