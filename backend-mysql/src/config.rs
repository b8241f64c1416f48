//! `mysql://` URLs: tenure's options, the client's own, validated identifiers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
pub use tenure_api::urls::validate_ident;
use tenure_api::urls::{check_option, dealias, parse_millis, redact_unparsed};
use tenure_api::{LockError, LockKey};

/// Connection parameters understood by the MySQL client (sqlx), passed on to it.
const CLIENT_PARAMS: &[&str] = &[
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "statement-cache-capacity",
    "charset",
    "collation",
    "socket",
];

/// Other names of options (the client's spellings without a dash, tenure's older name):
/// an option given twice under any of its names is an error.
const ALIASES: &[(&str, &str)] = &[
    ("sslmode", "ssl-mode"),
    ("sslca", "ssl-ca"),
    ("sslcert", "ssl-cert"),
    ("sslkey", "ssl-key"),
    ("command_timeout_ms", "request_timeout_ms"),
];

/// tenure's own options, removed before the URL reaches the client.
const TENURE_OPTIONS: &[&str] = &[
    "locking",
    "table",
    "prefix",
    "max_held",
    "max_waiting",
    "pool_size",
    "idle_connections",
    "connect_timeout_ms",
    "request_timeout_ms",
    "migrate",
];

/// The longest identifier MySQL and MariaDB accept.
const MAX_IDENT: usize = 64;
/// The row mode's lock table is the table's name with this suffix.
const ROWS_SUFFIX: &str = "_rows";

/// How a lock is held. Clients of one table must agree: a `GetLock` client and a `Row`
/// client do **not** exclude each other (their grants share only the fencing counter,
/// so tokens still rise across both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Locking {
    /// `GET_LOCK(name)`: a named lock of the session, no row locked.
    #[default]
    GetLock,
    /// `SELECT … FOR UPDATE NOWAIT` on the key's row of `<table>_rows` (inserted on first
    /// use), in a transaction the session keeps open while it holds the lock: the seed's
    /// row lock, which other programs share by locking the same row. Needs MySQL 8 or
    /// MariaDB 10.6 (`SKIP LOCKED`, for `inspect`).
    Row,
}
/// The longest prefix: with the longest key, a name still fits the table's key column.
const MAX_PREFIX: usize = 512;

/// How to reach one MySQL or MariaDB server and where the lock table lives.
///
/// Parsed from `mysql://[user[:password]@]host[:port]/database[?options]` (`mariadb://`
/// is accepted too; the database is required). tenure's options, removed before the URL
/// reaches the client:
///
/// | option | default | meaning |
/// |---|---|---|
/// | `locking` | `get_lock` | `get_lock`: a `GET_LOCK` named lock; `row`: `SELECT … FOR UPDATE NOWAIT` on the key's row of `<table>_rows` in an open transaction (see [`Locking`]) |
/// | `table` | `tenure_locks` | the table of fencing counters and holder records (one row per key ever locked); `locking=row` locks rows of `<table>_rows` |
/// | `prefix` | (empty) | prepended to every lock key |
/// | `max_held` | `64` | locks this client may hold at once (one connection each); past it an acquire fails at once with a "too many held locks" [`LockError::Backend`] |
/// | `max_waiting` | `64` | blocking acquires this client may have waiting in the server at once (one connection each) |
/// | `pool_size` | `2` | shared connections for `inspect` and the migration |
/// | `idle_connections` | `64` | clean lock connections kept for reuse after a release |
/// | `connect_timeout_ms` | `5000` | bound on opening a connection |
/// | `request_timeout_ms` | `5000` | bound on one statement's reply (a blocking acquire adds its wait; also read as `command_timeout_ms`) |
/// | `migrate` | `true` | create the table on connect if it is missing |
///
/// The client's own parameters pass through: `ssl-mode` (`DISABLED`, `PREFERRED`,
/// `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`; TLS is rustls), `ssl-ca`, `ssl-cert`,
/// `ssl-key`, `charset`, `collation`, `socket`, `statement-cache-capacity`. Anything else
/// is a [`LockError::Config`]. The password never appears in `Debug` or in errors.
#[derive(Clone)]
pub struct MySqlConfig {
    options: MySqlConnectOptions,
    endpoint: String,
    table: String,
    /// How a lock is held.
    pub locking: Locking,
    /// Prepended to every lock key.
    pub prefix: String,
    /// Locks this client may hold at once (a connection each). Reaching it is an error,
    /// not a wait.
    pub max_held: usize,
    /// Blocking acquires this client may have waiting in the server at once.
    pub max_waiting: usize,
    /// Size of the shared pool.
    pub pool_size: u32,
    /// Clean lock connections kept for reuse.
    pub idle_connections: usize,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// Bound on one statement's reply.
    pub request_timeout: Duration,
    /// Create the table on connect if it is missing.
    pub migrate: bool,
}

impl MySqlConfig {
    /// Parses a `mysql://` or `mariadb://` URL (see the type's docs).
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let redacted = redact_unparsed(text);
        let bad = |why: &str| LockError::Config(format!("bad MySQL URL {redacted}: {why}"));
        let mut url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "mysql" | "mariadb") {
            return Err(bad("it must start with mysql:// or mariadb://"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("it names no host"));
        }
        let database = url.path().trim_start_matches('/').to_owned();
        if database.is_empty() {
            return Err(bad("it names no database (mysql://host/database)"));
        }
        validate_ident("database", &database, MAX_IDENT)?;
        let mut config = Self {
            options: MySqlConnectOptions::new(),
            endpoint: format!(
                "{}:{}/{database}",
                url.host_str().unwrap_or_default(),
                url.port().unwrap_or(3306)
            ),
            table: "tenure_locks".into(),
            locking: Locking::default(),
            prefix: String::new(),
            max_held: 64,
            max_waiting: 64,
            pool_size: 2,
            idle_connections: 64,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            migrate: true,
        };
        if url.fragment().is_some() {
            return Err(bad("fragments (#…) are not allowed"));
        }
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let pairs = dealias(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())), ALIASES)
            .map_err(|e| bad(&e))?;
        let mut client: Vec<(String, String)> = Vec::new();
        for (name, value) in pairs {
            let name = name.to_owned();
            check_option("mysql", &name, &[TENURE_OPTIONS, CLIENT_PARAMS])?;
            let count = |range: std::ops::RangeInclusive<usize>| {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| range.contains(n))
                    .ok_or_else(|| {
                        LockError::Config(format!(
                            "option {name}={value} must be a number in {}..={}",
                            range.start(),
                            range.end()
                        ))
                    })
            };
            match name.as_str() {
                "table" => config = config.with_table(value)?,
                "locking" => {
                    config.locking = match value {
                        "get_lock" => Locking::GetLock,
                        "row" => Locking::Row,
                        _ => {
                            return Err(LockError::Config(format!(
                                "option locking={value} must be get_lock or row"
                            )))
                        }
                    }
                }
                "prefix" => config.prefix = value.to_owned(),
                "max_held" => config.max_held = count(1..=100_000)?,
                "max_waiting" => config.max_waiting = count(1..=100_000)?,
                "pool_size" => config.pool_size = count(1..=1_000)? as u32,
                "idle_connections" => config.idle_connections = count(0..=100_000)?,
                "connect_timeout_ms" => {
                    config.connect_timeout = parse_millis(&name, value, 1..=3_600_000)?
                }
                "request_timeout_ms" => {
                    config.request_timeout = parse_millis(&name, value, 1..=3_600_000)?
                }
                "migrate" => {
                    config.migrate = match value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(LockError::Config(format!(
                                "option migrate={value} must be true or false"
                            )))
                        }
                    }
                }
                _ => client.push((name, value.to_owned())),
            }
        }
        config.validate()?;
        url.set_query(None);
        if !client.is_empty() {
            url.query_pairs_mut().extend_pairs(client);
        }
        let client_url = url.as_str().replacen("mariadb://", "mysql://", 1);
        config.options = MySqlConnectOptions::from_str(&client_url).map_err(|e| {
            LockError::Config(format!(
                "bad MySQL URL {redacted}: {}",
                redact_unparsed(&e.to_string())
            ))
        })?;
        Ok(config)
    }

    /// The same with another table (a plain identifier of at most 64 bytes; 59 with
    /// `locking=row`, so that `<table>_rows` fits).
    pub fn with_table(mut self, table: &str) -> Result<Self, LockError> {
        validate_ident("table", table, MAX_IDENT)?;
        self.table = table.to_owned();
        Ok(self)
    }

    /// Checks the settings that can be changed in code.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        if self.prefix.len() > MAX_PREFIX || self.prefix.contains('\0') {
            return Err(LockError::Config(format!(
                "option prefix must be at most {MAX_PREFIX} bytes with no NUL character"
            )));
        }
        if self.max_held == 0 || self.max_waiting == 0 || self.pool_size == 0 {
            return Err(LockError::Config(
                "options max_held, max_waiting and pool_size must be positive".into(),
            ));
        }
        if self.locking == Locking::Row {
            validate_ident("table", &self.table, MAX_IDENT - ROWS_SUFFIX.len())?;
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(LockError::Config(
                "options connect_timeout_ms and request_timeout_ms must be positive".into(),
            ));
        }
        Ok(())
    }

    /// The lock table's name (fencing counters and holder records).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The row mode's table of lock rows.
    pub fn rows_table(&self) -> String {
        format!("{}{ROWS_SUFFIX}", self.table)
    }

    /// What `key` is called in the server: the prefix, then the key.
    pub(crate) fn name(&self, key: &LockKey) -> String {
        format!("{}{}", self.prefix, key.as_str())
    }

    /// The client's connection options.
    pub fn connect_options(&self) -> &MySqlConnectOptions {
        &self.options
    }

    /// `host:port/database`, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The tables this configuration uses: the lock table, and `<table>_rows` with
    /// `locking=row`.
    pub(crate) fn tables(&self) -> Vec<String> {
        match self.locking {
            Locking::GetLock => vec![self.table.clone()],
            Locking::Row => vec![self.table.clone(), self.rows_table()],
        }
    }

    /// `CREATE TABLE IF NOT EXISTS` for the tables this configuration uses: what `migrate`
    /// runs, for a DBA to run instead.
    pub fn schema_sql(&self) -> String {
        let mut sql = crate::sql::create_table(&self.table);
        if self.locking == Locking::Row {
            sql = format!(
                "{sql}; {}",
                crate::sql::create_rows_table(&self.rows_table())
            );
        }
        sql
    }

    /// The `GRANT` statements (`;`-separated) that give `user` (`'name'@'host'`, quoted as given) exactly
    /// what a client with `migrate=false` needs: `SELECT, INSERT, UPDATE` on the tables it
    /// uses (`FOR UPDATE` needs `UPDATE`). `GET_LOCK` and a session's own row of
    /// `information_schema.PROCESSLIST` need no privilege.
    pub fn grant_sql(&self, database: &str, user: &str) -> Result<String, LockError> {
        validate_ident("database", database, MAX_IDENT)?;
        Ok(self
            .tables()
            .iter()
            .map(|table| {
                format!("GRANT SELECT, INSERT, UPDATE ON `{database}`.`{table}` TO {user}")
            })
            .collect::<Vec<_>>()
            .join("; "))
    }
}

impl fmt::Debug for MySqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlConfig")
            .field("endpoint", &self.endpoint)
            .field("table", &self.table)
            .field("locking", &self.locking)
            .field("prefix", &self.prefix)
            .field("max_held", &self.max_held)
            .field("max_waiting", &self.max_waiting)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_and_the_rest_goes_to_the_client() {
        let config = MySqlConfig::from_url(
            "mariadb://u:s3cret@db.example:3307/app?table=locks&prefix=p:&max_held=3\
             &request_timeout_ms=250&migrate=false&ssl-mode=REQUIRED",
        )
        .unwrap();
        assert_eq!(config.table(), "locks");
        assert_eq!(config.prefix, "p:");
        assert_eq!(config.max_held, 3);
        assert_eq!(config.request_timeout, Duration::from_millis(250));
        assert!(!config.migrate);
        assert_eq!(config.endpoint(), "db.example:3307/app");
        assert_eq!(config.connect_options().get_port(), 3307);
        assert_eq!(config.connect_options().get_database(), Some("app"));
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn bad_urls_and_options_are_config_errors_without_the_password() {
        for (url, says) in [
            ("postgres://h/db", "mysql://"),
            ("mysql://u:s3cret@h", "no database"),
            ("mysql://u:s3cret@h/db?bogus=1", "bogus"),
            ("mysql://u:s3cret@h/db?table=a-b", "plain identifier"),
            ("mysql://u:s3cret@h/db?max_held=0", "max_held"),
            ("mysql://u:s3cret@h/db?migrate=yes", "migrate"),
            (
                "mysql://u:s3cret@h/db?request_timeout_ms=5&command_timeout_ms=5",
                "twice",
            ),
            ("mysql://u:s3cret@h/db?ssl-mode=sometimes", "ssl"),
            ("mysql://u:s3cret@h/d-b", "database"),
            (
                "mysql://u:s3cret@h/db?ssl-mode=REQUIRED&sslmode=DISABLED",
                "twice",
            ),
            ("mysql://u:s3cret@h/db#frag", "fragment"),
        ] {
            let err = MySqlConfig::from_url(url).unwrap_err();
            assert!(matches!(err, LockError::Config(_)), "{url}: {err:?}");
            let text = err.to_string();
            assert!(text.to_lowercase().contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }
}
