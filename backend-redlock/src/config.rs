//! `redlock://` URLs: one set of credentials and options, a comma-separated host list.

use std::fmt;
use std::time::Duration;

use tenure_api::urls::{parse_host_list, parse_millis, redact_url};
use tenure_api::LockError;
use tenure_redis::RedisConfig;

/// Redlock over N independent Redis masters.
///
/// Parsed from `redlock://[user[:password]@]h1:p1,h2:p2,…[/db][?options]` (or
/// `redlocks://` for TLS to every node). Options: `prefix`, `connect_timeout_ms`
/// (per node, passed to each node's client); `node_timeout_ms` (the per-node bound on one
/// request; default ttl/100, at least 50 ms); `fencing=false` (one round trip per acquire,
/// no fencing token guarantee); `fence=counter` (each node's counter is a plain `INCR`
/// instead of clock-floored, see [`tenure_redis::FenceMode`]); any other option is passed
/// to every node's [`RedisConfig`].
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

impl RedlockConfig {
    /// Builds a configuration from node configurations (at least one).
    pub fn new(nodes: Vec<RedisConfig>) -> Result<Self, LockError> {
        if nodes.is_empty() {
            return Err(LockError::Config("Redlock needs at least one node".into()));
        }
        Ok(Self {
            nodes,
            node_timeout: None,
            fencing: true,
        })
    }

    /// Parses a `redlock://` or `redlocks://` URL.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let bad =
            |why: &str| LockError::Config(format!("bad Redlock URL {}: {why}", redact_url(text)));
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let node_scheme = match scheme {
            "redlock" => "redis",
            "redlocks" => "rediss",
            _ => return Err(bad("the scheme must be redlock:// or redlocks://")),
        };
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let mut node_query = Vec::new();
        let mut node_timeout = None;
        let mut fencing = true;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "node_timeout_ms" => {
                    node_timeout = Some(parse_millis(name, value, 1..=60_000)?);
                }
                "fencing" => {
                    fencing = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(bad("fencing must be true or false")),
                    }
                }
                _ => node_query.push(pair),
            }
        }
        let query = if node_query.is_empty() {
            String::new()
        } else {
            format!("?{}", node_query.join("&"))
        };
        let nodes = parse_host_list(hosts, 6379)
            .map_err(|e| bad(&e.to_string()))?
            .into_iter()
            .map(|host| {
                RedisConfig::from_url(&format!("{node_scheme}://{userinfo}{host}{path}{query}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut config = Self::new(nodes)?;
        config.node_timeout = node_timeout;
        config.fencing = fencing;
        Ok(config)
    }

    /// Nodes that must agree: ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The per-node bound for a lease of `ttl`.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 100).max(MIN_NODE_TIMEOUT))
    }
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
