//! `zk://` URLs: what their path (the chroot), options and credentials mean (the URL
//! itself is decoded by [`LockUrl`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tenure_api::urls::{alias_names, percent_encode, HostPort, LockUrl};
use tenure_api::LockError;

use crate::names::{validate_znode_path, NodeNames};

/// The ZooKeeper client port used when a host names none.
pub const DEFAULT_PORT: u16 = 2181;

/// How to reach a ZooKeeper ensemble and where to keep locks in it.
///
/// Parsed from
/// `zk://[user:password@]host[:port][,host[:port]…][/chroot][?option=value&…]`, where a
/// host is a name, an IPv4 address or a bracketed IPv6 address (`[::1]:2181`), and the
/// port defaults to 2181. Locks live under `<chroot>/<prefix>/<encoded key>/`. `zks://`
/// connects with TLS to the servers' `secureClientPort`: it needs `ca_file` (the
/// ZooKeeper client has no built-in roots), and `cert_file` + `key_file` for servers that
/// require client certificates (`ssl.clientAuth=need`, their default).
///
/// Options (all optional):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `tenure` | path under the chroot holding every lock (`a/b` allowed); empty (`prefix=`) for none, so a key's directory is `<chroot>/<key>`, the path another recipe is given (a chroot is then required) |
/// | `node_names` | `curator` | how tenure names its lock nodes, as the recipe sharing its locks does: `curator` (Curator, go-zookeeper, kazoo with `extra_lock_patterns=["-lock-"]`), `kazoo` (kazoo as it comes), `legacy` (tenure before 2026-12-07); see [`NodeNames`] |
/// | `session_timeout_ms` | 10000 (`tenure run`: the TTL) | session timeout to negotiate; the server clamps it to 2–20 × its `tickTime` |
/// | `connect_timeout_ms` | 5000 | bound on establishing a session |
/// | `request_timeout_ms` | 2000 | bound on one request's reply (also read as `op_timeout_ms`) |
/// | `tick_ms` | 2000 | the servers' `tickTime` (ZooKeeper's default is 2000): the margin kept between a lease's deadline and the earliest moment the leader may expire the session |
/// | `ca_file` | — | `zks://` only, required: PEM CA certificates to verify the servers with |
/// | `cert_file`, `key_file` | — | `zks://` only: a PEM client certificate and its key |
///
/// `user:password` enables ZooKeeper's `digest` authentication; the nodes tenure creates
/// then carry the `auth` ACL (full rights for that identity only, `Acls::creator_all`), so
/// every client sharing a lock must use the same credentials. User and password may be
/// percent-encoded. The password never appears in `Debug`, `Display` or errors.
///
/// Unknown options, empty hosts, bad ports, and chroots or prefixes that are not valid
/// ZooKeeper paths are [`LockError::Config`] errors, never panics.
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<HostPort>,
    chroot: String,
    auth: Option<Credentials>,
    /// True for `zks://`.
    pub tls: bool,
    /// PEM CA certificates to verify the servers with (`zks://`).
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate, presented with [`key_file`](Self::key_file).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    pub key_file: Option<PathBuf>,
    /// Path under the chroot holding every lock, without leading or trailing `/`; empty
    /// for none (keys directly under the chroot).
    pub prefix: String,
    /// How tenure names its lock nodes.
    pub node_names: NodeNames,
    /// The lab's broken variant `zk-foreign-nodes-ignored` (feature `testbed`): the
    /// queue holds only nodes named `lock-<owner>-<sequence>`, as tenure's before
    /// 2026-12-07 did, blind to every other recipe's.
    #[cfg(feature = "testbed")]
    pub(crate) blind_to_other_recipes: bool,
    /// Session timeout asked of the server (it may negotiate another one).
    pub session_timeout: Duration,
    /// Bound on establishing a session.
    pub connect_timeout: Duration,
    /// Bound on one request's reply.
    pub request_timeout: Duration,
    /// The servers' `tickTime`: how far the leader's record of a session's activity may
    /// trail what a follower saw, and so the margin a lease keeps (see the crate docs).
    pub server_tick: Duration,
}

#[derive(Clone, PartialEq, Eq)]
struct Credentials {
    user: String,
    password: String,
}

impl ZkConfig {
    /// The query options.
    pub const OPTIONS: &[&str] = &[
        "prefix",
        "node_names",
        "session_timeout_ms",
        "connect_timeout_ms",
        "request_timeout_ms",
        "tick_ms",
        "ca_file",
        "cert_file",
        "key_file",
    ];
    /// Older option names still read: `op_timeout_ms` is `request_timeout_ms`.
    pub const ALIASES: &[(&str, &str)] = &[("op_timeout_ms", "request_timeout_ms")];

    /// Parses a `zk://` URL; anything malformed is [`LockError::Config`].
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(text, "ZooKeeper", &["zk", "zks"], DEFAULT_PORT)?;
        let tls = url.scheme() == "zks";
        let auth = match (url.user(), url.password()) {
            (None, _) => None,
            (Some(_), None) => return Err(url.error("credentials must be user:password")),
            (Some(""), Some(_)) => return Err(url.error("the user name is empty")),
            (Some(user), Some(_)) if user.contains(':') => {
                return Err(url.error("the user name must not contain ':'"))
            }
            (Some(user), Some(password)) => Some(Credentials {
                user: user.to_string(),
                password: password.to_string(),
            }),
        };
        let chroot = match format!("/{}", url.path()).trim_end_matches('/') {
            "" => String::new(),
            chroot => {
                validate_znode_path(chroot)
                    .map_err(|why| url.error(format!("chroot {chroot:?}: {why}")))?;
                chroot.to_string()
            }
        };
        let mut config = Self {
            hosts: url.hosts().to_vec(),
            chroot,
            auth,
            tls,
            ca_file: None,
            cert_file: None,
            key_file: None,
            prefix: "tenure".into(),
            node_names: NodeNames::default(),
            #[cfg(feature = "testbed")]
            blind_to_other_recipes: false,
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            server_tick: Duration::from_secs(2),
        };
        for (name, value) in url.options_aliased(Self::ALIASES)? {
            let millis = |max: u64| url.millis(name, value, 1..=max);
            match name {
                "prefix" => config.prefix = value.to_string(),
                "node_names" => {
                    config.node_names = NodeNames::VALUES
                        .iter()
                        .find(|(text, _)| *text == value)
                        .map(|(_, names)| *names)
                        .ok_or_else(|| {
                            let known = NodeNames::VALUES.map(|(text, _)| text).join(", ");
                            url.error(format!("node_names={value:?}: expected one of {known}"))
                        })?;
                }
                "session_timeout_ms" => config.session_timeout = millis(3_600_000)?,
                "connect_timeout_ms" => config.connect_timeout = millis(600_000)?,
                "request_timeout_ms" => config.request_timeout = millis(600_000)?,
                "tick_ms" => config.server_tick = millis(600_000)?,
                "ca_file" | "cert_file" | "key_file" => {
                    let path = Some(url.tls_file(name, value, tls, "zks")?);
                    match name {
                        "ca_file" => config.ca_file = path,
                        "cert_file" => config.cert_file = path,
                        _ => config.key_file = path,
                    }
                }
                other => {
                    let known = [Self::OPTIONS, &alias_names(Self::ALIASES)];
                    return Err(url.unknown_option(other, &known));
                }
            }
        }
        config.prefix = normalise_prefix(&config.prefix).map_err(|why| url.error(why))?;
        if config.lock_root().is_empty() {
            return Err(url.error(
                "an empty prefix needs a chroot: keys would sit at the root, beside /zookeeper",
            ));
        }
        if config.lock_root().split('/').nth(1) == Some("zookeeper") {
            return Err(url.error("/zookeeper is reserved for the server"));
        }
        Ok(config)
    }

    /// The servers, as `host:port` (IPv6 bracketed), in URL order.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.iter().map(HostPort::to_string).collect()
    }

    /// The chroot: `""` for none, else an absolute path such as `/app`.
    pub fn chroot(&self) -> &str {
        &self.chroot
    }

    /// The digest user, if credentials were given.
    pub fn user(&self) -> Option<&str> {
        self.auth.as_ref().map(|c| c.user.as_str())
    }

    /// The absolute znode path under which every lock's directory lives:
    /// `<chroot>/<prefix>`, or the chroot when the prefix is empty.
    pub fn lock_root(&self) -> String {
        match self.prefix.as_str() {
            "" => self.chroot.clone(),
            prefix => format!("{}/{prefix}", self.chroot),
        }
    }

    /// The connect string handed to the client: `h1:p1,h2:p2` (no chroot: tenure prefixes
    /// paths itself, so a missing chroot node is created rather than failing).
    pub fn connect_string(&self) -> String {
        self.hosts().join(",")
    }

    /// `user:password` for the `digest` scheme.
    pub fn digest(&self) -> Option<Vec<u8>> {
        self.auth
            .as_ref()
            .map(|c| format!("{}:{}", c.user, c.password).into_bytes())
    }
}

impl fmt::Display for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "zks://" } else { "zk://" })?;
        if let Some(auth) = &self.auth {
            write!(f, "{}:***@", percent_encode(&auth.user))?;
        }
        write!(f, "{}{}", self.connect_string(), self.chroot)?;
        write!(
            f,
            "?prefix={}&node_names={}&session_timeout_ms={}&connect_timeout_ms={}&request_timeout_ms={}&tick_ms={}",
            percent_encode(&self.prefix),
            self.node_names.as_str(),
            self.session_timeout.as_millis(),
            self.connect_timeout.as_millis(),
            self.request_timeout.as_millis(),
            self.server_tick.as_millis()
        )?;
        for (name, path) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(path) = path {
                let path = path.display().to_string();
                write!(f, "&{name}={}", percent_encode(&path))?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts())
            .field("chroot", &self.chroot)
            .field("user", &self.user())
            .field("password", &self.auth.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("node_names", &self.node_names)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("server_tick", &self.server_tick)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

fn normalise_prefix(prefix: &str) -> Result<String, String> {
    let trimmed = prefix.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    validate_znode_path(&format!("/{trimmed}"))
        .map_err(|why| format!("prefix {prefix:?}: {why}"))?;
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ZkConfig {
        ZkConfig::from_url(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn host_lists_chroot_and_options() {
        let c = parse(
            "zk://h1:2181,10.0.0.2,[::1]:2182/app/locks?prefix=svc/a&session_timeout_ms=4000\
             &connect_timeout_ms=900&op_timeout_ms=250&tick_ms=150",
        );
        assert_eq!(c.hosts(), ["h1:2181", "10.0.0.2:2181", "[::1]:2182"]);
        assert_eq!(c.connect_string(), "h1:2181,10.0.0.2:2181,[::1]:2182");
        assert_eq!(c.chroot(), "/app/locks");
        assert_eq!(c.prefix, "svc/a");
        assert_eq!(c.lock_root(), "/app/locks/svc/a");
        assert_eq!(c.session_timeout, Duration::from_millis(4000));
        assert_eq!(c.connect_timeout, Duration::from_millis(900));
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(c.server_tick, Duration::from_millis(150));
        assert_eq!(c.user(), None);
    }

    /// Issue 18 item 7: every query option is a known one, and the error says which.
    #[test]
    fn options_are_strict() {
        tenure_conformance::url_options::assert_alias(
            ZkConfig::from_url,
            "zk://h",
            ("op_timeout_ms", "request_timeout_ms"),
            "250",
        );
        tenure_conformance::url_options::assert_strict_options(
            ZkConfig::from_url,
            "zks://u:pw@h1,h2/app",
            &[ZkConfig::OPTIONS],
            &[
                ("prefix", "other"),
                ("node_names", "kazoo"),
                ("session_timeout_ms", "4000"),
                ("connect_timeout_ms", "250"),
                ("request_timeout_ms", "250"),
                ("tick_ms", "500"),
                ("ca_file", "/ca.pem"),
                ("cert_file", "/client.pem"),
                ("key_file", "/client.key"),
            ],
        );
    }

    #[test]
    fn defaults() {
        let c = parse("zk://localhost");
        assert_eq!(c.hosts(), ["localhost:2181"]);
        assert_eq!(c.chroot(), "");
        assert_eq!(c.lock_root(), "/tenure");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(parse("ZK://h/").chroot(), "");
        assert_eq!(parse("zk://h/app/").chroot(), "/app");
        assert_eq!(parse("zk://h?prefix=/x/").prefix, "x");
        assert_eq!(parse("zk://h").node_names, NodeNames::Curator);
        // No prefix: a key's directory is the path another recipe is given.
        for url in ["zk://h/lock/order?prefix=", "zk://h/lock/order?prefix=/"] {
            assert_eq!(parse(url).lock_root(), "/lock/order", "{url}");
        }
        for (value, names) in NodeNames::VALUES {
            assert_eq!(
                parse(&format!("zk://h?node_names={value}")).node_names,
                names
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "zk://u:p@h1,h2:2/r?prefix=a/b&op_timeout_ms=7",
            "zk://h/r?prefix=&node_names=legacy",
            "zks://h/r?ca_file=/etc/zk%20ca.pem&cert_file=/c.pem&key_file=/k.pem",
        ] {
            let c = parse(url);
            let again = parse(&c.to_string().replace("***", "p"));
            assert_eq!(c, again);
        }
        for bad in ["zk://h?ca_file=/ca.pem", "zks://h?cert_file="] {
            assert!(ZkConfig::from_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn digest_credentials_are_decoded_and_redacted_everywhere() {
        let c = parse("zk://alice:hunter%402@h1:2181,h2:2181/app");
        assert_eq!(c.user(), Some("alice"));
        assert_eq!(c.digest().unwrap(), b"alice:hunter@2");
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("hunter"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        for bad in [
            "zk://alice:hunter2@h1:notaport",
            "zk://alice:hunter2@h1,,h2",
            "zk://alice:hunter2@h1/a//b",
            "zk://alice:hunter2@h1?bogus=1",
            "zk://alice:hunter2@h1?session_timeout_ms=0",
            "zk://alice:hunter2@",
            "http://alice:hunter2@h1",
        ] {
            let err = ZkConfig::from_url(bad).unwrap_err();
            assert!(matches!(err, LockError::Config(_)), "{bad}: {err:?}");
            let shown = err.to_string();
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[test]
    fn bad_urls_are_config_errors_never_panics() {
        for bad in [
            "",
            "zk",
            "zk:/h",
            "redis://h",
            "zk://",
            "zk://,",
            "zk://h1,",
            "zk://:2181",
            "zk://h:0",
            "zk://h:65536",
            "zk://h:-1",
            "zk://h:2181:3",
            "zk://[::1",
            "zk://[::1]x",
            "zk://[]:2181",
            "zk://h h",
            "zk://h/./x",
            "zk://h/../x",
            "zk://h/a\u{1}b",
            "zk://h/zookeeper",
            "zk://h?prefix=",
            "zk://h/?prefix=/",
            "zk://h?node_names=",
            "zk://h?node_names=Curator",
            "zk://h?prefix=a//b",
            "zk://h?session_timeout_ms=abc",
            "zk://h?op_timeout_ms=99999999999999999999",
            "zk://h?unknown=1",
            "zk://h#frag",
            "zk://h/%zz",
            "zk://h/%ff",
            "zk://:pw@h",
            "zk://user@h",
        ] {
            assert!(
                matches!(ZkConfig::from_url(bad), Err(LockError::Config(_))),
                "{bad:?} should be a Config error"
            );
        }
    }
}
