//! `postgres://` URLs with tenure's own options, validated SQL identifiers, and secret
//! redaction.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
pub use tenure_api::urls::validate_ident;
use tenure_api::urls::{alias_names, check_option, dealias, redact_unparsed};
use tenure_api::LockError;

/// Connection parameters understood by the Postgres client (sqlx); anything else in the
/// query string that is not a tenure option is rejected, so a typo is an error rather than
/// a silently ignored setting.
const CLIENT_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Interval at which the server checks that a client is still connected while it runs a
/// statement (including a lock wait).
const CLIENT_CHECK_INTERVAL_MS: u32 = 1000;
/// The longest identifier Postgres keeps without truncating it (`NAMEDATALEN - 1`).
const MAX_IDENT: usize = 63;
/// Suffixes appended to the table name for the holder table and the fence sequence.
const HOLDERS_SUFFIX: &str = "_holders";
const FENCE_SUFFIX: &str = "_fence";
/// Suffix of the lease table (`locking=lease`).
const LEASES_SUFFIX: &str = "_leases";

/// How a lease is held. `Row` and `Advisory` hold a transaction and keep the holder table
/// and the fence sequence; every grant is recorded there, so clients of one table that
/// disagree between those two still never both hold a key (the second to record fails its
/// attempt) — but they contend without FIFO order, so give every client of a table the same
/// mode. `Lease` keeps its leases in a table of its own: a `Lease` client and a `Row` or
/// `Advisory` client of one table do **not** exclude each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Locking {
    /// `SELECT … FOR UPDATE` on the key's row in the lock table (inserted on first use).
    #[default]
    Row,
    /// `pg_try_advisory_xact_lock` / `pg_advisory_xact_lock` on
    /// `hashtextextended('<schema>.<table>:' || key, 0)`: no row to insert, one statement
    /// less per lock; held and freed exactly like the row lock (with the transaction).
    /// Two keys whose 64-bit hashes collide exclude each other (never the reverse).
    /// Advisory lock ids are shared with any other advisory locks in the database.
    Advisory,
    /// A row per key in the lease table (`<table>_leases`) with its holder, token and an
    /// expiry the server computes (`clock_timestamp() + ttl`), taken, extended and released
    /// by single autocommit statements: no connection or transaction is held between
    /// calls, so one client can hold many thousands of leases (`max_held` and
    /// `max_waiting` do not apply). Expiry is the server's clock: a step of it moves every
    /// deadline. A loss is not pushed (an extension finds it). These locks are not the
    /// `row` and `advisory` modes' locks: clients of one table must not mix the two.
    Lease,
}

/// How to reach one Postgres server and where the lock table lives.
///
/// Parsed from `postgres://[user[:password]@]host[:port][/database][?options]`
/// (`postgresql://` is accepted too). tenure's options, removed before the URL reaches the
/// client:
///
/// | option | default | meaning |
/// |---|---|---|
/// | `schema` | `public` | schema of the lock table, holder table and fence sequence |
/// | `table` | `tenure_locks` | lock table; the holder table is `<table>_holders`, the fence sequence `<table>_fence` |
/// | `prefix` | (empty) | prepended to every lock key |
/// | `locking` | `row` | `row`: a row lock in the lock table; `advisory`: a transaction-level advisory lock on a 64-bit hash of table and key, with no lock table row; `lease`: a row per key with a server-computed expiry, no connection held (see [`Locking`]) |
/// | `max_held` | `64` | locks this client may hold at once (one dedicated connection each); past it an acquire fails at once with a "too many held locks" [`LockError::Backend`] |
/// | `max_waiting` | `64` | blocking acquires this client may have queued in the server at once (one dedicated connection each); past it a blocking acquire fails at once |
/// | `pool_size` | `2` | autocommit connections (fence records, inspect, migration); grants that come while they are busy share one record statement and flushed commit, so more connections mean smaller batches |
/// | `idle_connections` | `64` | clean dedicated connections kept for reuse after a release (as many as were recently held at once, up to this) |
/// | `idle_timeout_ms` | `30000` | a cached dedicated connection unused this long is closed |
/// | `connect_timeout_ms` | `5000` | bound on opening a connection |
/// | `request_timeout_ms` | `5000` | bound on one statement's reply (a blocking acquire adds its wait; also read as `command_timeout_ms`) |
/// | `migrate` | `true` | create the table, holder table and sequence on connect if missing |
///
/// The client's own parameters pass through: `sslmode` (`disable`, `prefer`, `require`,
/// `verify-ca`, `verify-full`; TLS is rustls), `sslrootcert`, `sslcert`, `sslkey`,
/// `application_name`, `options`, `host`, `port`, `user`, `password`, `dbname`, … Unknown
/// parameters are a [`LockError::Config`].
///
/// Schema and table names must be plain identifiers (`[A-Za-z_][A-Za-z0-9_]*`, at most 63
/// bytes for the schema and 55 for the table, so that the derived names fit); they are
/// always double-quoted in SQL, so a bad name is a typed error and never SQL injection.
///
/// Passwords (in the authority or as `password=`) never appear in `Debug`, `Display` or
/// errors.
#[derive(Clone)]
pub struct PgConfig {
    url: url::Url,
    options: PgConnectOptions,
    schema: String,
    table: String,
    /// Prepended to every lock key.
    pub prefix: String,
    /// What the lock transaction locks.
    pub locking: Locking,
    /// Locks this client may hold at once. Reaching it is an error ("too many held
    /// locks"), not a wait; a lease dropped without release gives its slot back at once.
    pub max_held: usize,
    /// Blocking acquires this client may have queued in the server at once. Reaching it is
    /// an error, not a wait.
    pub max_waiting: usize,
    /// Size of the autocommit pool.
    pub pool_size: u32,
    /// Clean dedicated connections kept for reuse.
    pub idle_connections: usize,
    /// How long a cached dedicated connection may go unused before it is closed.
    pub idle_timeout: Duration,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// Bound on one statement's reply.
    pub request_timeout: Duration,
    /// Create the schema objects on connect if they are missing.
    pub migrate: bool,
    /// The `client_connection_check_interval` dedicated connections ask for.
    pub(crate) client_check: String,
}

impl PgConfig {
    /// tenure's query options (the client's, [`CLIENT_OPTIONS`](Self::CLIENT_OPTIONS), are
    /// handed on to it).
    pub const OPTIONS: &[&str] = &[
        "schema",
        "table",
        "prefix",
        "locking",
        "max_held",
        "max_waiting",
        "pool_size",
        "idle_connections",
        "idle_timeout_ms",
        "connect_timeout_ms",
        "request_timeout_ms",
        "migrate",
    ];
    /// Older option names still read: `command_timeout_ms` is `request_timeout_ms`.
    pub const ALIASES: &[(&str, &str)] = &[("command_timeout_ms", "request_timeout_ms")];
    /// The connection parameters of the Postgres client (sqlx) handed on to it.
    pub const CLIENT_OPTIONS: &[&str] = CLIENT_PARAMS;

    /// Parses a URL; a bad URL or option is [`LockError::Config`].
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let mut url = url::Url::parse(text).map_err(|e| {
            LockError::Config(format!("bad Postgres URL {}: {e}", redact_str(text)))
        })?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(LockError::Config(format!(
                "Postgres URL must start with postgres:// or postgresql://, got {}://",
                url.scheme()
            )));
        }
        let mut config = Self {
            url: url.clone(),
            options: PgConnectOptions::new_without_pgpass(),
            schema: "public".into(),
            table: "tenure_locks".into(),
            prefix: String::new(),
            locking: Locking::Row,
            max_held: 64,
            max_waiting: 64,
            pool_size: 2,
            idle_connections: 64,
            idle_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(5000),
            request_timeout: Duration::from_millis(5000),
            migrate: true,
            client_check: CLIENT_CHECK_INTERVAL_MS.to_string(),
        };
        let mut kept = Vec::new();
        let mut has_host_param = false;
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let pairs = pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        // tenure's options once each, under any of their names; the client's as given
        // (sqlx joins a repeated `options`).
        let ours = |name: &str| {
            Self::OPTIONS.contains(&name) || Self::ALIASES.iter().any(|(alias, _)| *alias == name)
        };
        let (own, client): (Vec<_>, Vec<_>) = pairs.partition(|(name, _)| ours(name));
        let own = dealias(own, Self::ALIASES).map_err(|why| {
            LockError::Config(format!("bad Postgres URL {}: {why}", redact(&url)))
        })?;
        for (name, value) in own.into_iter().chain(client) {
            let millis = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| (1..=600_000).contains(ms))
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        LockError::Config(format!(
                            "option {name}={value} must be a number of milliseconds in 1..=600000"
                        ))
                    })
            };
            let count = |max: usize| {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| {
                        LockError::Config(format!("option {name}={value} must be in 1..={max}"))
                    })
            };
            match name {
                "schema" => config.schema = value.to_string(),
                "table" => config.table = value.to_string(),
                "prefix" => config.prefix = value.to_string(),
                "locking" => {
                    config.locking = match value {
                        "row" => Locking::Row,
                        "advisory" => Locking::Advisory,
                        "lease" => Locking::Lease,
                        _ => {
                            return Err(LockError::Config(format!(
                                "option locking={value} must be row, advisory or lease"
                            )))
                        }
                    }
                }
                "max_held" => config.max_held = count(10_000)?,
                "max_waiting" => config.max_waiting = count(10_000)?,
                "pool_size" => config.pool_size = count(1_000)? as u32,
                "idle_connections" => {
                    config.idle_connections = if value == "0" { 0 } else { count(1_000)? }
                }
                "idle_timeout_ms" => config.idle_timeout = millis()?,
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "request_timeout_ms" => config.request_timeout = millis()?,
                "migrate" => {
                    config.migrate = match value {
                        "true" | "1" | "on" => true,
                        "false" | "0" | "off" => false,
                        _ => {
                            return Err(LockError::Config(format!(
                                "option migrate={value} must be true or false"
                            )))
                        }
                    }
                }
                client => {
                    let old_names = alias_names(Self::ALIASES);
                    check_option(
                        "postgres",
                        client,
                        &[Self::OPTIONS, Self::CLIENT_OPTIONS, &old_names],
                    )?;
                    has_host_param |= client == "host" || client == "hostaddr";
                    kept.push((name.to_string(), value.to_string()));
                }
            }
        }
        if url.host_str().is_none_or(str::is_empty) && !has_host_param {
            return Err(LockError::Config(format!(
                "Postgres URL {} has no host",
                redact(&url)
            )));
        }
        validate_ident("schema", &config.schema, MAX_IDENT)?;
        validate_ident(
            "table",
            &config.table,
            MAX_IDENT - HOLDERS_SUFFIX.len().max(LEASES_SUFFIX.len()),
        )?;
        if kept.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(kept);
        }
        config.options = PgConnectOptions::from_str(url.as_str())
            .map_err(|e| LockError::Config(format!("bad Postgres URL {}: {e}", redact(&url))))?;
        config.url = url;
        Ok(config)
    }

    /// Sets the schema; a name that is not a plain identifier is [`LockError::Config`].
    pub fn with_schema(mut self, schema: &str) -> Result<Self, LockError> {
        validate_ident("schema", schema, MAX_IDENT)?;
        self.schema = schema.into();
        Ok(self)
    }

    /// Sets the lock table; a name that is not a plain identifier (or is longer than 55
    /// bytes) is [`LockError::Config`].
    pub fn with_table(mut self, table: &str) -> Result<Self, LockError> {
        validate_ident(
            "table",
            table,
            MAX_IDENT - HOLDERS_SUFFIX.len().max(LEASES_SUFFIX.len()),
        )?;
        self.table = table.into();
        Ok(self)
    }

    /// The schema holding the lock objects.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The quoted, schema-qualified lock table.
    pub(crate) fn lock_table(&self) -> String {
        qualified(&self.schema, &self.table)
    }

    /// The quoted, schema-qualified holder table.
    pub(crate) fn holder_table(&self) -> String {
        qualified(&self.schema, &format!("{}{HOLDERS_SUFFIX}", self.table))
    }

    /// The quoted, schema-qualified lease table (`locking=lease`).
    pub(crate) fn lease_table(&self) -> String {
        qualified(&self.schema, &format!("{}{LEASES_SUFFIX}", self.table))
    }

    /// The quoted, schema-qualified fence sequence.
    pub(crate) fn fence_sequence(&self) -> String {
        qualified(&self.schema, &format!("{}{FENCE_SUFFIX}", self.table))
    }

    /// The DDL [`PgLock::migrate`](crate::PgLock::migrate) runs, for an administrator who
    /// creates the lock objects ahead of the clients: the schema, the lock table, the
    /// holder table and the fence sequence (`locking=lease`: the lease table and the fence
    /// sequence), each only if missing.
    pub fn schema_sql(&self) -> String {
        format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\"; {}",
            self.schema,
            crate::sql::ddl(self)
        )
    }

    /// The least privilege `role` needs to lock with this configuration, as `GRANT`
    /// statements: `USAGE` on the schema; `SELECT`, `INSERT` and `UPDATE` on the holder
    /// table and (row locking: `FOR UPDATE` needs `UPDATE`) on the lock table; `USAGE` on
    /// the fence sequence (`nextval`). The objects must exist (see
    /// [`schema_sql`](Self::schema_sql)); a client that finds them all needs no `CREATE`
    /// privilege even with `migrate=true`. A role name that is not a plain identifier is
    /// [`LockError::Config`].
    pub fn grant_sql(&self, role: &str) -> Result<String, LockError> {
        validate_ident("role", role, MAX_IDENT)?;
        let role = format!("\"{role}\"");
        let tables = match self.locking {
            Locking::Row => vec![self.lock_table(), self.holder_table()],
            Locking::Advisory => vec![self.holder_table()],
            Locking::Lease => vec![self.lease_table()],
        };
        Ok(format!(
            "GRANT USAGE ON SCHEMA \"{}\" TO {role}; \
             GRANT SELECT, INSERT, UPDATE ON {} TO {role}; \
             GRANT USAGE ON SEQUENCE {} TO {role}",
            self.schema,
            tables.join(", "),
            self.fence_sequence()
        ))
    }

    /// The client's connection options (with the password).
    pub fn connect_options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// `host:port` of the server (or the socket directory).
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.options.get_host(), self.options.get_port())
    }
}

impl fmt::Display for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.url))
    }
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &redact(&self.url))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("prefix", &self.prefix)
            .field("locking", &self.locking)
            .field("max_held", &self.max_held)
            .field("max_waiting", &self.max_waiting)
            .field("pool_size", &self.pool_size)
            .field("idle_connections", &self.idle_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("migrate", &self.migrate)
            .finish()
    }
}

/// `"schema"."name"` for names already checked by [`validate_ident`].
pub(crate) fn qualified(schema: &str, name: &str) -> String {
    format!("\"{schema}\".\"{name}\"")
}

/// The URL with any password (in the authority or as `password=`) replaced by `***`.
pub fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    if shown.query_pairs().any(|(k, _)| k == "password") {
        let pairs: Vec<(String, String)> = shown
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "***".to_string()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        shown.query_pairs_mut().clear().extend_pairs(pairs);
    }
    shown.to_string()
}

fn redact_str(text: &str) -> String {
    // An unparseable URL may still carry a password: in its user info (hidden first,
    // wherever a stray `?` or `/` in it puts the last `@`), or in the query
    // (`password=`), which is dropped.
    let hidden = redact_unparsed(text);
    hidden.split('?').next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_and_stripped() {
        let c = PgConfig::from_url(
            "postgres://u:s3cret@h:6000/app?schema=locks&table=leases&prefix=svc/\
             &max_held=8&command_timeout_ms=250&sslmode=disable&application_name=x",
        )
        .unwrap();
        assert_eq!(c.schema(), "locks");
        assert_eq!(c.table(), "leases");
        assert_eq!(c.prefix, "svc/");
        assert_eq!(c.max_held, 8);
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(
            c.url.as_str(),
            "postgres://u:s3cret@h:6000/app?sslmode=disable&application_name=x"
        );
        assert_eq!(c.endpoint(), "h:6000");
        assert_eq!(c.connect_options().get_database(), Some("app"));
        assert_eq!(c.connect_options().get_username(), "u");
        assert_eq!(c.lock_table(), "\"locks\".\"leases\"");
        assert_eq!(c.holder_table(), "\"locks\".\"leases_holders\"");
        assert_eq!(c.fence_sequence(), "\"locks\".\"leases_fence\"");
    }

    /// Issue 18 item 7: an unknown option was an error that did not say which options
    /// exist.
    #[test]
    fn options_are_strict() {
        tenure_conformance::url_options::assert_alias(
            PgConfig::from_url,
            "postgres://u@h/db",
            ("command_timeout_ms", "request_timeout_ms"),
            "250",
        );
        tenure_conformance::url_options::assert_strict_options(
            PgConfig::from_url,
            "postgres://u:pw@h/db",
            &[PgConfig::OPTIONS, PgConfig::CLIENT_OPTIONS],
            &[
                ("schema", "locks"),
                ("table", "leases"),
                ("prefix", "svc/"),
                ("locking", "advisory"),
                ("max_held", "8"),
                ("max_waiting", "8"),
                ("pool_size", "3"),
                ("idle_connections", "0"),
                ("idle_timeout_ms", "500"),
                ("connect_timeout_ms", "250"),
                ("request_timeout_ms", "250"),
                ("migrate", "false"),
                ("sslmode", "disable"),
                ("ssl-mode", "disable"),
                ("sslrootcert", "/ca.pem"),
                ("ssl-root-cert", "/ca.pem"),
                ("ssl-ca", "/ca.pem"),
                ("sslcert", "/c.pem"),
                ("ssl-cert", "/c.pem"),
                ("sslkey", "/k.pem"),
                ("ssl-key", "/k.pem"),
                ("statement-cache-capacity", "10"),
                ("host", "h2"),
                ("hostaddr", "127.0.0.1"),
                ("port", "6000"),
                ("dbname", "app"),
                ("user", "bob"),
                ("password", "pw2"),
                ("application_name", "x"),
                ("options", "-c%20search_path%3Dx"),
            ],
        );
        let err = PgConfig::from_url("postgres://u:hunter2@h/db?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn grants_name_every_object_the_mode_uses_and_nothing_more() {
        let row = PgConfig::from_url("postgres://h?schema=locks&table=jobs").unwrap();
        assert_eq!(
            row.grant_sql("app_worker").unwrap(),
            "GRANT USAGE ON SCHEMA \"locks\" TO \"app_worker\"; \
             GRANT SELECT, INSERT, UPDATE ON \"locks\".\"jobs\", \"locks\".\"jobs_holders\" \
             TO \"app_worker\"; GRANT USAGE ON SEQUENCE \"locks\".\"jobs_fence\" TO \"app_worker\""
        );
        let advisory = PgConfig::from_url("postgres://h?locking=advisory").unwrap();
        let grants = advisory.grant_sql("w").unwrap();
        assert!(
            grants.contains("ON \"public\".\"tenure_locks_holders\" TO"),
            "{grants}"
        );
        assert!(!grants.contains("\"tenure_locks\","), "{grants}");
        for bad in ["", "a b", "x\"; DROP TABLE t; --", "1role"] {
            assert!(
                matches!(row.grant_sql(bad), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
        let ddl = row.schema_sql();
        assert!(
            ddl.starts_with("CREATE SCHEMA IF NOT EXISTS \"locks\"; "),
            "{ddl}"
        );
        assert!(
            ddl.contains("CREATE SEQUENCE IF NOT EXISTS \"locks\".\"jobs_fence\""),
            "{ddl}"
        );
    }

    #[test]
    fn defaults() {
        let c = PgConfig::from_url("postgresql://h").unwrap();
        assert_eq!(c.schema(), "public");
        assert_eq!(c.table(), "tenure_locks");
        assert_eq!(c.prefix, "");
        assert!(c.migrate);
        assert_eq!(c.endpoint(), "h:5432");
    }

    /// sqlx joins a repeated `options`; only tenure's own options must come once.
    #[test]
    fn client_parameters_may_repeat() {
        let c = PgConfig::from_url("postgres://h/db?options=-c%20a%3D1&options=-c%20b%3D2");
        assert!(c.is_ok(), "{c:?}");
        let twice = PgConfig::from_url("postgres://h/db?schema=a&schema=b").unwrap_err();
        assert!(
            twice.to_string().contains("option schema is given twice"),
            "{twice}"
        );
    }

    #[test]
    fn secrets_are_redacted_everywhere() {
        let c = PgConfig::from_url("postgres://user:hunter2@h/db?sslmode=require").unwrap();
        for shown in [format!("{c}"), format!("{c:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        let c = PgConfig::from_url("postgres://user@h/db?password=hunter2").unwrap();
        for shown in [format!("{c}"), format!("{c:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        for bad in [
            "postgres://user:hunter2@h:notaport/db",
            "postgres://user:hunter2@h/db?bogus=1",
            "postgres://user:hunter2@h/db?schema=a;drop",
            "postgres://user@h/db?password=hunter2&bogus=1",
            "postgres://user:hunter2@h/db?sslmode=sometimes",
            "postgres://user:hunter2@[::1/db",
            "postgres://user:hunter2?x@h/db",
            "postgres://user:hunter2/x@h/db",
        ] {
            let err = PgConfig::from_url(bad).unwrap_err();
            assert!(matches!(err, LockError::Config(_)), "{bad}: {err:?}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
            assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "h:5432",
            "http://h",
            "postgres://",
            "postgres:///db",
            "postgres://h?command_timeout_ms=0",
            "postgres://h?connect_timeout_ms=abc",
            "postgres://h?max_held=0",
            "postgres://h?pool_size=-1",
            "postgres://h?migrate=maybe",
            "postgres://h?unknown_option=1",
            "postgres://h?sslmode=bogus",
            "postgres://h?table=",
            "postgres://h?table=1abc",
            "postgres://h?table=a\"b",
            "postgres://h?schema=a.b",
            "postgres://h?table=Robert');DROP TABLE students;--",
        ] {
            assert!(
                matches!(PgConfig::from_url(bad), Err(LockError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn identifiers_are_validated() {
        assert!(validate_ident("t", "tenure_locks", 63).is_ok());
        assert!(validate_ident("t", "_T1", 63).is_ok());
        for bad in ["", "1a", "a-b", "a b", "a\"b", "a;b", "é", "a.b"] {
            assert!(validate_ident("t", bad, 63).is_err(), "{bad:?}");
        }
        assert!(validate_ident("t", &"a".repeat(64), 63).is_err());
        let c = PgConfig::from_url("postgres://h").unwrap();
        assert!(c.clone().with_table(&"a".repeat(56)).is_err());
        assert!(c.clone().with_table(&"a".repeat(55)).is_ok());
        assert!(c.clone().with_schema("x y").is_err());
        assert_eq!(c.with_schema("app").unwrap().schema(), "app");
    }
}
