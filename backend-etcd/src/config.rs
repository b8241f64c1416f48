//! `etcd://` / `etcds://` URLs: what their path and options mean (the URL itself is
//! decoded by [`LockUrl`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tenure_api::urls::LockUrl;
use tenure_api::LockError;

/// The default client port.
pub const DEFAULT_PORT: u16 = 2379;

/// How to reach an etcd cluster and how to name locks there.
///
/// Parsed from `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix][?options]`
/// or `etcds://…` (TLS, verified against the system's CA store, or `ca_file`). Hosts may
/// be names, IPv4 addresses or bracketed IPv6 addresses; the port defaults to 2379.
/// The path is the key prefix (default `tenure`); the `prefix` option, if given,
/// overrides it. User, password and prefix may be percent-encoded. A prefix has no
/// leading `/` unless written with two: `etcd://h//lock/order` (or `?prefix=//lock/order`)
/// is `/lock/order`, so key `1001` is the lock `etcdctl lock /lock/order/1001` and Go's
/// `concurrency.NewMutex(session, "/lock/order/1001")` take. (Before 2026-12-07 the
/// slashes were dropped: `etcd://h//x` meant `x`; write `etcd://h/x` for that.)
///
/// Options: `connect_timeout_ms` (default 2000), `request_timeout_ms` (default 2000,
/// the bound on every request), `ca_file` (a PEM CA bundle, `etcds://` only),
/// `cert_file` + `key_file` (a PEM client certificate and its key, for a cluster run with
/// `--client-cert-auth`; `etcds://` only),
/// `tls_domain` (the name to verify the server certificate against), `lease` (`session`,
/// the default: one etcd lease per client and TTL, shared by its locks; or `per-lock`:
/// a lease granted and revoked for each lock — see [`LeaseMode`]). Any other option
/// is [`LockError::Config`] ([`OPTIONS`](Self::OPTIONS)).
/// Passwords never appear in `Debug`, `Display` or errors.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// True for `etcds://`.
    pub tls: bool,
    /// `host:port` of each endpoint, as given.
    pub hosts: Vec<String>,
    /// User name for etcd authentication.
    pub user: Option<String>,
    password: Option<String>,
    /// Prefix of every lock key: no trailing `/`, and a leading one only when absolute.
    pub prefix: String,
    /// Bound on establishing the client (authentication, member list).
    pub connect_timeout: Duration,
    /// Bound on every request.
    pub request_timeout: Duration,
    /// A PEM CA bundle to trust instead of the system's store.
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate, presented with [`key_file`](Self::key_file).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    pub key_file: Option<PathBuf>,
    /// The server name TLS verifies, if not the host's.
    pub tls_domain: Option<String>,
    /// Which etcd leases lock keys live on.
    pub lease: LeaseMode,
}

/// Which etcd leases a client's lock keys live on. Either way, a lock not renewed ends
/// on the server one TTL after its last renewal (or its grant), and no later than one
/// lease TTL after its client stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseMode {
    /// One lease per client and TTL in whole seconds, kept alive in the background and
    /// shared by the client's keys (etcd's `concurrency.Session`): a cycle is one
    /// transaction to acquire and one delete to release. The client deletes a key its
    /// holder stopped renewing once its TTL has passed.
    #[default]
    Session,
    /// A lease granted for each lock and revoked at its release by the client that
    /// granted it (a lease from elsewhere runs out its TTL): two more Raft writes per
    /// cycle, and no background task.
    PerLock,
}

impl EtcdConfig {
    /// `<prefix>/<text>` with `%` written `%25` and `/` written `%2F`: the start of every
    /// queue of a key beginning with `text`.
    pub(crate) fn escaped_prefix(&self, text: &str) -> String {
        let escaped = text.replace('%', "%25").replace('/', "%2F");
        format!("{}/{escaped}", self.prefix)
    }

    /// The query options.
    pub const OPTIONS: &[&str] = &[
        "prefix",
        "connect_timeout_ms",
        "request_timeout_ms",
        "ca_file",
        "cert_file",
        "key_file",
        "tls_domain",
        "lease",
    ];

    /// Parses a URL; a bad URL or option is [`LockError::Config`], never a panic.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(text, "etcd", &["etcd", "etcds"], DEFAULT_PORT)?;
        let tls = url.scheme() == "etcds";
        if url.user() == Some("") {
            return Err(url.error("the user name is empty"));
        }
        // The path after the hosts' `/`: one more `/` makes it absolute.
        let prefix = normalise_prefix(&format!("/{}", url.path()))
            .map_err(|why| url.error(format!("bad prefix in the path: {why}")))?;
        let mut config = Self {
            tls,
            hosts: url.hosts().iter().map(ToString::to_string).collect(),
            user: url.user().map(str::to_string),
            password: url.password().map(str::to_string),
            prefix: prefix.unwrap_or_else(|| "tenure".to_string()),
            connect_timeout: Duration::from_millis(2000),
            request_timeout: Duration::from_millis(2000),
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_domain: None,
            lease: LeaseMode::Session,
        };
        for (name, value) in url.options() {
            let millis = || url.millis(name, value, 1..=600_000);
            match name {
                "prefix" => {
                    config.prefix = normalise_prefix(value)
                        .map_err(|why| url.error(format!("bad prefix {value:?}: {why}")))?
                        .ok_or_else(|| url.error(format!("bad prefix {value:?}: empty")))?;
                }
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "request_timeout_ms" => config.request_timeout = millis()?,
                "ca_file" | "cert_file" | "key_file" => {
                    let path = Some(url.tls_file(name, value, tls, "etcds")?);
                    match name {
                        "ca_file" => config.ca_file = path,
                        "cert_file" => config.cert_file = path,
                        _ => config.key_file = path,
                    }
                }
                "tls_domain" if tls && !value.is_empty() => {
                    config.tls_domain = Some(value.to_string())
                }
                "lease" => {
                    config.lease = match value {
                        "session" => LeaseMode::Session,
                        "per-lock" => LeaseMode::PerLock,
                        _ => {
                            return Err(url.error(format!(
                                "option lease={value} must be session or per-lock"
                            )))
                        }
                    }
                }
                "tls_domain" => {
                    return Err(url.error(format!("option {name} needs etcds:// and a value")))
                }
                other => return Err(url.unknown_option(other, &[Self::OPTIONS])),
            }
        }
        Ok(config)
    }

    /// `<prefix>/`: every key this client reads, writes or watches starts with it. On a
    /// cluster with authentication, the user needs a role granting `readwrite` on this
    /// prefix (`etcdctl role grant-permission <role> --prefix=true readwrite <prefix>/`),
    /// and nothing more.
    pub fn key_prefix(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// The endpoint URLs handed to the etcd client (`http://h:p` or `https://h:p`).
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }

    /// User and password, if authentication is configured.
    pub fn credentials(&self) -> Option<(String, String)> {
        self.user
            .clone()
            .map(|u| (u, self.password.clone().unwrap_or_default()))
    }

    /// Sets user and password for etcd authentication.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", if self.tls { "etcds" } else { "etcd" })?;
        if let Some(user) = &self.user {
            write!(f, "{user}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        write!(f, "{}/{}", self.hosts.join(","), self.prefix)
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("tls", &self.tls)
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("tls_domain", &self.tls_domain)
            .field("lease", &self.lease)
            .finish()
    }
}

/// A prefix as written: without its trailing `/`s, and without its leading ones unless
/// it starts with `//` (absolute: one `/` kept). `None` when nothing else is left.
fn normalise_prefix(written: &str) -> Result<Option<String>, &'static str> {
    if written.chars().any(char::is_control) {
        return Err("a control character");
    }
    let bare = written.trim_matches('/');
    Ok(match (bare.is_empty(), written.starts_with("//")) {
        (true, true) => return Err("an absolute prefix with no name"),
        (true, false) => None,
        (false, true) => Some(format!("/{bare}")),
        (false, false) => Some(bare.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_prefix_and_options_are_parsed() {
        let c = EtcdConfig::from_url(
            "etcd://u:p%40ss@h1:2379,10.0.0.2,[::1]:23790/app/locks/?request_timeout_ms=250",
        )
        .unwrap();
        assert!(!c.tls);
        assert_eq!(c.hosts, ["h1:2379", "10.0.0.2:2379", "[::1]:23790"]);
        assert_eq!(
            c.endpoints(),
            [
                "http://h1:2379",
                "http://10.0.0.2:2379",
                "http://[::1]:23790"
            ]
        );
        assert_eq!(c.credentials(), Some(("u".into(), "p@ss".into())));
        assert_eq!(c.prefix, "app/locks");
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(c.connect_timeout, Duration::from_millis(2000));

        let c =
            EtcdConfig::from_url("etcds://h?ca_file=/etc/ca.pem&tls_domain=etcd.local").unwrap();
        assert!(c.tls);
        assert_eq!(c.endpoints(), ["https://h:2379"]);
        assert_eq!(c.prefix, "tenure");
        assert_eq!(
            c.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert_eq!(c.tls_domain.as_deref(), Some("etcd.local"));
        assert_eq!(c.to_string(), "etcds://h:2379/tenure");
    }

    /// Issue 18 item 7: an unknown option was an error that did not say which options
    /// exist.
    #[test]
    fn options_are_strict() {
        tenure_conformance::url_options::assert_strict_options(
            EtcdConfig::from_url,
            "etcds://u:pw@h1,h2/app",
            &[EtcdConfig::OPTIONS],
            &[
                ("prefix", "other"),
                ("connect_timeout_ms", "250"),
                ("request_timeout_ms", "250"),
                ("ca_file", "/etc/ca.pem"),
                ("cert_file", "/etc/client.pem"),
                ("key_file", "/etc/client.key"),
                ("tls_domain", "etcd.local"),
                ("lease", "per-lock"),
            ],
        );
    }

    #[test]
    fn the_lease_mode_is_session_unless_asked() {
        let lease = |url: &str| EtcdConfig::from_url(url).map(|c| c.lease);
        assert_eq!(lease("etcd://h").unwrap(), LeaseMode::Session);
        assert_eq!(lease("etcd://h?lease=session").unwrap(), LeaseMode::Session);
        assert_eq!(
            lease("etcd://h?lease=per-lock").unwrap(),
            LeaseMode::PerLock
        );
        for bad in [
            "etcd://h?lease=",
            "etcd://h?lease=Session",
            "etcd://h?lease=none",
        ] {
            let error = lease(bad).unwrap_err();
            assert!(error.to_string().contains("session or per-lock"), "{error}");
        }
    }

    #[test]
    fn secrets_are_redacted_everywhere() {
        let c = EtcdConfig::from_url("etcds://root:hunter2@h1,h2/p").unwrap();
        for shown in [format!("{c}"), format!("{c:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        for bad in [
            "etcd://root:hunter2@h:notaport",
            "etcd://root:hunter2@h,,h2",
            "etcd://root:hunter2@h?nope=1",
            "etcd://root:hunter2@h?request_timeout_ms=0",
            "etcd://root:hunter2%zz@h",
            "http://root:hunter2@h",
            "root:hunter2@h",
            "etcd://root:hunter2@[::1/p",
        ] {
            let err = EtcdConfig::from_url(bad).unwrap_err();
            assert!(matches!(err, LockError::Config(_)), "{bad}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    /// Issue 61: Go's `concurrency.NewMutex(s, "/lock/order/1001")` and `etcdctl lock
    /// /lock/order/1001` use an absolute prefix, which no URL could give before.
    #[test]
    fn a_prefix_written_with_two_slashes_is_absolute() {
        let prefix = |url: &str| EtcdConfig::from_url(url).unwrap().prefix;
        for (url, expected) in [
            ("etcd://h", "tenure"),
            ("etcd://h/", "tenure"),
            ("etcd://h/app/locks/", "app/locks"),
            ("etcd://h//lock/order", "/lock/order"),
            ("etcd://h///lock/order/", "/lock/order"),
            ("etcd://h/%2Flock", "/lock"),
            ("etcd://h?prefix=/app/", "app"),
            ("etcd://h?prefix=//lock/order", "/lock/order"),
            ("etcd://h//x?prefix=app", "app"),
        ] {
            assert_eq!(prefix(url), expected, "{url}");
        }
        let c = EtcdConfig::from_url("etcd://h//lock/order").unwrap();
        assert_eq!(c.key_prefix(), "/lock/order/");
        assert_eq!(c.escaped_prefix("1001"), "/lock/order/1001");
        assert_eq!(EtcdConfig::from_url(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn bad_urls_are_config_errors_never_panics() {
        for bad in [
            "",
            "etcd://",
            "etcd:///prefix",
            "etcd://h:0",
            "etcd://h:65536",
            "etcd://h:",
            "etcd://h:1:2",
            "etcd://[zz]:1",
            "etcd://[::1]x",
            "etcd://h/%",
            "etcd://h/%ff",
            "etcd://h/a%00b",
            "etcd://@h",
            "etcd://:pw@h",
            "etcd://h?connect_timeout_ms=abc",
            "etcd://h?ca_file=/x",
            "etcds://h?ca_file=",
            "etcd://h?cert_file=/c.pem&key_file=/k.pem",
            "etcds://h?key_file=",
            "etcd://h w",
            "etcd://h\u{e9}",
            "etcd://%%@h",
            "etcd://h?prefix=/",
            "etcd://h?prefix=//",
            "etcd://h?prefix=a%01b",
            "etcd://h//a%01b",
            "etcd://h//",
            "etcd://h///",
        ] {
            assert!(
                matches!(EtcdConfig::from_url(bad), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }
}
