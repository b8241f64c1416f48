//! [`Config`]: which backend and the defaults, from TOML, the environment, or code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tenure_api::urls::{redact_unparsed, redact_url};
use tenure_api::{AcquireOptions, DistributedLock, LockError};

use crate::layers::{DriftMarginLayer, LockStack};
use crate::observe::{MeteredLayer, TracedLayer};

/// Which lock service to use and the defaults for acquiring, so that the backend is a
/// configuration choice, not a code change.
///
/// ```toml
/// url = "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379"
/// ttl = "30s"           # default lease TTL
/// wait = "10s"          # default wait for a held lock
/// prefix = "billing/"   # namespace of every lock key (any backend)
/// drift = "50ms"        # extra clock-drift allowance on every lease deadline
/// trace = true          # a tracing span per lock operation
/// metrics = true        # tenure_* metrics through the `metrics` facade
///
/// # Options of one backend, used only when the URL is of that backend; the same
/// # names as the URL's query options.
/// [redlock]
/// node_timeout_ms = 50
/// [etcd]
/// request_timeout_ms = 2000
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The backend URL (see [`crate::connect`]).
    pub url: String,
    /// Default lease TTL.
    #[serde(default = "default_ttl", deserialize_with = "duration")]
    pub ttl: Duration,
    /// Default wait bound for a held lock.
    #[serde(default = "default_wait", deserialize_with = "duration")]
    pub wait: Duration,
    /// Key namespace, passed to the backend as its `prefix` option.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Extra clock-drift allowance subtracted from every lease's local deadline
    /// ([`DriftMargin`](crate::layers::DriftMargin)); must be below a third of `ttl`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub drift: Option<Duration>,
    /// Wrap the lock in [`Traced`](crate::observe::Traced): a `tracing` span per operation.
    #[serde(default)]
    pub trace: bool,
    /// Wrap the lock in [`Metered`](crate::observe::Metered): metrics through the `metrics` facade.
    #[serde(default)]
    pub metrics: bool,
    /// Options for `redis://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub redis: BTreeMap<String, String>,
    /// Options for `redlock://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub redlock: BTreeMap<String, String>,
    /// Options for `etcd://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub etcd: BTreeMap<String, String>,
    /// Options for `zk://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub zk: BTreeMap<String, String>,
    /// Options for `postgres://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub postgres: BTreeMap<String, String>,
    /// Options for `mysql://` URLs.
    #[serde(default, deserialize_with = "scalars")]
    pub mysql: BTreeMap<String, String>,
}

fn default_ttl() -> Duration {
    Duration::from_secs(30)
}

fn default_wait() -> Duration {
    Duration::from_secs(10)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(serde::de::Error::custom)
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// The duration in the environment variable `name`, if it is set; a malformed one is
/// [`LockError::Config`] naming the variable.
fn env_duration(
    var: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<Duration>, LockError> {
    var(name)
        .map(|text| {
            humantime::parse_duration(&text).map_err(|e| {
                LockError::Config(format!(
                    "{name}={text:?} is not a duration like 30s or 500ms: {e}"
                ))
            })
        })
        .transpose()
}

/// A table of strings, integers and booleans, kept as text (URL query values).
fn scalars<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Int(i64),
        Bool(bool),
    }
    let table = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(table
        .into_iter()
        .map(|(name, value)| {
            let text = match value {
                Scalar::Text(t) => t,
                Scalar::Int(i) => i.to_string(),
                Scalar::Bool(b) => b.to_string(),
            };
            (name, text)
        })
        .collect())
}

impl Config {
    /// A configuration for `url` with default TTL (30 s) and wait (10 s).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ttl: default_ttl(),
            wait: default_wait(),
            prefix: None,
            drift: None,
            trace: false,
            metrics: false,
            redis: BTreeMap::new(),
            redlock: BTreeMap::new(),
            etcd: BTreeMap::new(),
            zk: BTreeMap::new(),
            postgres: BTreeMap::new(),
            mysql: BTreeMap::new(),
        }
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, LockError> {
        let config: Self = toml::from_str(text).map_err(|e| {
            LockError::Config(format!("bad tenure config: {}", redact_url(e.message())))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, LockError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LockError::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// From the environment: `TENURE_URL` (required), `TENURE_TTL`, `TENURE_WAIT`,
    /// `TENURE_DRIFT` (durations like `30s`, `500ms`), `TENURE_PREFIX`, and the flags
    /// `TENURE_TRACE`, `TENURE_METRICS` (`true`/`false`/`1`/`0`).
    pub fn from_env() -> Result<Self, LockError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, LockError> {
        let url =
            var("TENURE_URL").ok_or_else(|| LockError::Config("TENURE_URL is not set".into()))?;
        let mut config = Self::new(url);
        config.override_durations(&var)?;
        config.drift = env_duration(&var, "TENURE_DRIFT")?;
        let flag = |name: &str| -> Result<bool, LockError> {
            match var(name).as_deref() {
                None | Some("false" | "0") => Ok(false),
                Some("true" | "1") => Ok(true),
                Some(other) => Err(LockError::Config(format!(
                    "{name}={other:?}: expected true, false, 1 or 0"
                ))),
            }
        };
        config.trace = flag("TENURE_TRACE")?;
        config.metrics = flag("TENURE_METRICS")?;
        config.prefix = var("TENURE_PREFIX");
        config.validate()?;
        Ok(config)
    }

    /// Overrides the TTL and the wait with `TENURE_TTL` and `TENURE_WAIT` where they are
    /// set, keeping what this configuration has (from a file, or the defaults) otherwise.
    /// The `tenure` CLI applies it between the file and its flags: flag > environment >
    /// file > default. A malformed value (not a duration, a TTL outside
    /// [`tenure_api::validate_ttl`]'s range) is [`LockError::Config`] naming the variable.
    pub fn override_from_env(&mut self) -> Result<(), LockError> {
        self.override_durations(&|name: &str| {
            std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
        })
    }

    fn override_durations(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), LockError> {
        if let Some(ttl) = env_duration(var, "TENURE_TTL")? {
            self.ttl = tenure_api::validate_ttl(ttl)
                .map_err(|e| LockError::Config(format!("TENURE_TTL: {e}")))?;
        }
        if let Some(wait) = env_duration(var, "TENURE_WAIT")? {
            self.wait = wait;
        }
        Ok(())
    }

    /// Checks the TTL and the drift allowance.
    pub fn validate(&self) -> Result<(), LockError> {
        tenure_api::validate_ttl(self.ttl).map_err(|e| LockError::Config(e.to_string()))?;
        match self.drift {
            Some(drift) if drift >= self.ttl / 3 => Err(LockError::Config(format!(
                "drift {drift:?} must be below a third of the ttl {:?}, or every lease would \
                 be presumed lost before its first renewal",
                self.ttl
            ))),
            _ => Ok(()),
        }
    }

    /// The acquire options these defaults describe.
    pub fn acquire_options(&self) -> AcquireOptions {
        AcquireOptions::new(self.ttl).wait(self.wait)
    }

    /// The URL with `prefix` and the backend's option table appended as query options.
    /// An option given both in the URL and in the configuration is an error.
    pub fn resolved_url(&self) -> Result<String, LockError> {
        let table = match crate::backend_named(&self.url) {
            Some("redis") => &self.redis,
            Some("redlock") => &self.redlock,
            Some("etcd") => &self.etcd,
            Some("zk") => &self.zk,
            Some("postgres") => &self.postgres,
            Some("mysql") => &self.mysql,
            // No options but the prefix.
            Some("file") => &BTreeMap::new(),
            _ => return Ok(self.url.clone()),
        };
        let mut options: Vec<(&str, &str)> = table
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Some(prefix) = &self.prefix {
            options.push(("prefix", prefix));
        }
        let mut url = self.url.clone();
        for (name, value) in options {
            if self.url_has_option(name) {
                return Err(LockError::Config(format!(
                    "option {name} is set both in the URL {} and in the configuration",
                    redact_unparsed(&self.url)
                )));
            }
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(name);
            url.push('=');
            url.push_str(&tenure_api::urls::percent_encode(value));
        }
        Ok(url)
    }

    /// Whether the URL's query sets option `name`.
    fn url_has_option(&self, name: &str) -> bool {
        let query = self.url.split_once('?').map_or("", |(_, q)| q);
        query
            .split('&')
            .any(|pair| pair.split_once('=').map_or(pair, |(n, _)| n) == name)
    }

    /// Makes the TTL the session timeout of a session backend: for a `zk://` URL that sets
    /// `session_timeout_ms` neither in its query nor in the `[zk]` table, asks for a
    /// session as long as [`ttl`](Self::ttl), so that a holder killed or paused loses the
    /// lock about a TTL later rather than after the default 10 s session. The server
    /// clamps the request to 2–20 × its `tickTime` (4–40 s with the default 2 s), and
    /// leases keep to the negotiated timeout. `tenure run` and `tenure acquire` call it;
    /// other backends are unchanged.
    pub fn session_timeout_from_ttl(&mut self) {
        let name = "session_timeout_ms";
        if crate::backend_named(&self.url) != Some("zk")
            || self.zk.contains_key(name)
            || self.url_has_option(name)
        {
            return;
        }
        let millis = self.ttl.as_millis().clamp(1, 3_600_000);
        self.zk.insert(name.into(), millis.to_string());
    }

    /// The layers this configuration asks for, innermost first: the drift allowance
    /// ([`DriftMarginLayer`]), [`TracedLayer`], [`MeteredLayer`] (so the metrics time what
    /// the caller sees). Add layers of your own around them with [`LockStack::layer`], or
    /// build a stack in another order and [`wrap`](LockStack::wrap) [`crate::connect`]'s
    /// lock yourself.
    pub fn layers(&self) -> LockStack {
        let mut stack = LockStack::new();
        if let Some(margin) = self.drift {
            stack = stack.layer(DriftMarginLayer(margin));
        }
        if self.trace {
            stack = stack.layer(TracedLayer);
        }
        if self.metrics {
            stack = stack.layer(MeteredLayer);
        }
        stack
    }

    /// Connects to the configured backend, wrapped in [`layers`](Self::layers).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn connect(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        self.validate()?;
        Ok(self
            .layers()
            .wrap(crate::connect(&self.resolved_url()?).await?))
    }

    /// Connects to the configured backend (with its prefix and options) for
    /// administration: listing holders, finding leaked locks.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn connect_admin(&self) -> Result<Arc<dyn tenure_api::LockAdmin>, LockError> {
        crate::admin::connect_admin(&self.resolved_url()?).await
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &redact_unparsed(&self.url))
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("prefix", &self.prefix)
            .field("drift", &self.drift)
            .field("trace", &self.trace)
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (ttl {:?}, wait {:?})",
            redact_unparsed(&self.url),
            self.ttl,
            self.wait
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_defaults_and_durations() {
        let c = Config::from_toml("url = \"redis://h\"\nttl = \"2s\"").unwrap();
        assert_eq!(c.ttl, Duration::from_secs(2));
        assert_eq!(c.wait, Duration::from_secs(10));
        assert!(Config::from_toml("url = \"redis://h\"\nttl = \"soon\"").is_err());
        assert!(Config::from_toml("url = \"redis://h\"\nttl_typo = \"2s\"").is_err());
        assert!(Config::from_toml("ttl = \"2s\"").is_err());
        assert!(Config::from_toml("url = \"redis://h\"\nttl = \"0s\"").is_err());
        let drift = Config::from_toml("url = \"redis://h\"\nttl = \"3s\"\ndrift = \"1s\"");
        assert!(matches!(drift, Err(LockError::Config(m)) if m.contains("third")));
        assert!(!c.trace && !c.metrics, "layers are off by default");
        let on = Config::from_toml("url = \"redis://h\"\ntrace = true\nmetrics = true").unwrap();
        assert!(on.trace && on.metrics);
        assert!(Config::from_toml("url = \"redis://h\"\ntrace = \"yes\"").is_err());
    }

    #[test]
    fn backend_tables_and_prefix_become_url_options() {
        let text = r#"
            url = "redlock://a:1,b:2,c:3?fencing=true"
            prefix = "billing/é"
            drift = "20ms"
            [redlock]
            node_timeout_ms = 50
            [etcd]
            request_timeout_ms = 900
        "#;
        let c = Config::from_toml(text).unwrap();
        assert_eq!(c.drift, Some(Duration::from_millis(20)));
        assert_eq!(
            c.resolved_url().unwrap(),
            "redlock://a:1,b:2,c:3?fencing=true&node_timeout_ms=50&prefix=billing%2F%C3%A9"
        );
        // A file URL has no options table, but takes the prefix (it was ignored).
        let mut file = c.clone();
        file.url = "file:///var/lock/tenure".into();
        assert_eq!(
            file.resolved_url().unwrap(),
            "file:///var/lock/tenure?prefix=billing%2F%C3%A9"
        );
        let mut etcd = c.clone();
        etcd.url = "etcd://h/app".into();
        assert_eq!(
            etcd.resolved_url().unwrap(),
            "etcd://h/app?request_timeout_ms=900&prefix=billing%2F%C3%A9"
        );
        // A space is `%20`, not the `+` of HTML forms, which lock URLs read as a plus.
        let mut spaced = c.clone();
        spaced.prefix = Some("my app+1".into());
        let resolved = spaced.resolved_url().unwrap();
        assert!(resolved.ends_with("&prefix=my%20app%2B1"), "{resolved}");
        let mut clash = c;
        clash.url = "redlock://a,b,c?node_timeout_ms=9".into();
        let err = clash.resolved_url().unwrap_err().to_string();
        assert!(err.contains("node_timeout_ms is set both"), "{err}");
        assert_eq!(
            Config::new("memory://").resolved_url().unwrap(),
            "memory://"
        );
    }

    /// Issue 18 item 7: a misspelt key of a backend table became an unknown URL option,
    /// which Redis and Redlock ignored and the others rejected without naming the known
    /// ones.
    #[tokio::test]
    async fn misspelt_backend_table_keys_are_config_errors() {
        for (url, table) in [
            ("redis://127.0.0.1:1", "redis"),
            ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "redlock"),
            ("etcd://127.0.0.1:1", "etcd"),
            ("zk://127.0.0.1:1", "zk"),
            ("postgres://127.0.0.1:1/db", "postgres"),
            ("mysql://127.0.0.1:1/db", "mysql"),
        ] {
            if !crate::DRIVERS.iter().any(|driver| driver.name == table) {
                continue; // a build without this backend's feature cannot parse its URL
            }
            let text = format!("url = \"{url}\"\n[{table}]\nsesion_timeout_ms = 5\n");
            let config = Config::from_toml(&text).unwrap();
            match config.connect().await {
                Err(LockError::Config(msg)) => assert!(
                    msg.contains("\"sesion_timeout_ms\"") && msg.contains("prefix"),
                    "{table}: {msg}"
                ),
                other => panic!("{table}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_ttl_becomes_the_zookeeper_session_timeout_unless_set() {
        let resolved = |url: &str, table: Option<&str>| {
            let mut config = Config::new(url);
            config.ttl = Duration::from_millis(2500);
            if let Some(ms) = table {
                config.zk.insert("session_timeout_ms".into(), ms.into());
            }
            config.session_timeout_from_ttl();
            config.resolved_url().unwrap()
        };
        assert_eq!(
            resolved("zk://h/app", None),
            "zk://h/app?session_timeout_ms=2500"
        );
        assert_eq!(
            resolved("zk://h?session_timeout_ms=9000", None),
            "zk://h?session_timeout_ms=9000"
        );
        assert_eq!(
            resolved("zk://h", Some("9000")),
            "zk://h?session_timeout_ms=9000"
        );
        assert_eq!(resolved("redis://h", None), "redis://h");
        let mut long = Config::new("zk://h");
        long.ttl = Duration::from_secs(86_400);
        long.session_timeout_from_ttl();
        assert_eq!(long.zk["session_timeout_ms"], "3600000");
    }

    #[test]
    fn env_vars() {
        let vars = |name: &str| match name {
            "TENURE_URL" => Some("redlock://a,b,c".to_string()),
            "TENURE_WAIT" => Some("250ms".to_string()),
            "TENURE_PREFIX" => Some("jobs/".to_string()),
            _ => None,
        };
        let c = Config::from_vars(vars).unwrap();
        assert_eq!(c.url, "redlock://a,b,c");
        assert_eq!(c.wait, Duration::from_millis(250));
        assert_eq!(c.prefix.as_deref(), Some("jobs/"));
        assert!(Config::from_vars(|_| None).is_err());
        let bad = |name: &str| {
            (name == "TENURE_URL")
                .then(|| "x".into())
                .or_else(|| (name == "TENURE_TTL").then(|| "x".into()))
        };
        assert!(matches!(Config::from_vars(bad), Err(LockError::Config(_))));
        assert!(!c.trace && !c.metrics);
        for (value, expected) in [("true", true), ("1", true), ("false", false), ("0", false)] {
            let flags = |name: &str| match name {
                "TENURE_URL" => Some("memory://".to_string()),
                "TENURE_TRACE" | "TENURE_METRICS" => Some(value.to_string()),
                _ => None,
            };
            let c = Config::from_vars(flags).unwrap();
            assert_eq!((c.trace, c.metrics), (expected, expected), "{value}");
        }
        let bad_flag = |name: &str| match name {
            "TENURE_URL" => Some("memory://".to_string()),
            "TENURE_METRICS" => Some("yes".to_string()),
            _ => None,
        };
        let err = Config::from_vars(bad_flag).unwrap_err().to_string();
        assert!(err.contains("TENURE_METRICS"), "{err}");
    }

    /// Defect: a huge `TENURE_WAIT` (a natural "wait forever") parsed fine and then
    /// overflowed `started + wait` inside `acquire`: a panic. It now waits without bound.
    #[tokio::test]
    async fn an_enormous_wait_waits_without_bound() {
        let vars = |name: &str| match name {
            "TENURE_URL" => Some("memory://".to_string()),
            "TENURE_WAIT" => Some("300000000000years".to_string()),
            _ => None,
        };
        let config = Config::from_vars(vars).unwrap();
        let lock = config.connect().await.unwrap();
        let key = tenure_api::LockKey::new("forever").unwrap();
        let opts = config.acquire_options();
        let held = lock.acquire(&key, &opts).await.unwrap();
        let second = tokio::time::timeout(Duration::from_millis(100), lock.acquire(&key, &opts));
        assert!(second.await.is_err(), "waits: neither panics nor times out");
        lock.release(held).await.unwrap();
    }

    #[test]
    fn secrets_are_redacted() {
        let mut config = Config::new("redlock://:hunter2@a:1,b:2,c:3");
        config.redlock.insert("node_timeout_ms".into(), "x".into());
        let shown = format!("{config:?} {config}");
        assert!(
            !shown.contains("hunter2") && shown.contains("***"),
            "{shown}"
        );
        let err = Config::from_toml("url = 5").unwrap_err();
        assert!(matches!(err, LockError::Config(_)));
        let mut clash = Config::new("redis://u:hunter2@h?prefix=a");
        clash.prefix = Some("b".into());
        let err = clash.resolved_url().unwrap_err().to_string();
        assert!(!err.contains("hunter2") && err.contains("***"), "{err}");
    }

    #[tokio::test]
    async fn connect_applies_the_drift_layer() {
        let mut config = Config::new("memory://");
        config.drift = Some(Duration::from_millis(500));
        let lock = config.connect().await.unwrap();
        assert!(format!("{lock:?}").contains("DriftMargin"));
        let lease = lock
            .try_acquire(
                &tenure_api::LockKey::new("k").unwrap(),
                Duration::from_secs(3),
            )
            .await
            .unwrap()
            .unwrap();
        assert!(lease.valid_until() - lease.acquired_at() <= Duration::from_millis(2500));
    }

    #[tokio::test]
    async fn connect_applies_the_observability_layers_outermost() {
        let mut config = Config::new("memory://");
        config.drift = Some(Duration::from_millis(500));
        config.trace = true;
        config.metrics = true;
        let shown = format!("{:?}", config.connect().await.unwrap());
        let at = |name: &str| {
            shown
                .find(name)
                .unwrap_or_else(|| panic!("{name}: {shown}"))
        };
        assert!(
            at("Metered") < at("Traced") && at("Traced") < at("DriftMargin"),
            "{shown}"
        );
        let plain = format!("{:?}", Config::new("memory://").connect().await.unwrap());
        assert!(
            !plain.contains("Traced") && !plain.contains("Metered"),
            "{plain}"
        );
    }
}
