//! The statements, each with its table name filled in once.

/// The lock table: per key, the fencing counter and the last grant's holder record.
pub(crate) fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS `{table}` (\
           name VARBINARY(1024) NOT NULL PRIMARY KEY, \
           token BIGINT UNSIGNED NOT NULL, \
           holder TEXT CHARACTER SET utf8mb4 NOT NULL, \
           conn BIGINT UNSIGNED NOT NULL, \
           ttl_ms BIGINT UNSIGNED NOT NULL\
         ) ENGINE=InnoDB"
    )
}

/// `GET_LOCK(name, seconds)`: 1 granted, 0 held by another session (or the wait ran out).
pub(crate) const GET_LOCK: &str = "SELECT GET_LOCK(?, ?)";

/// 1 when this session holds the named lock.
pub(crate) const HOLDS: &str = "SELECT IS_USED_LOCK(?) = CONNECTION_ID()";

/// 1 released, 0 held by another session, `NULL` not held at all.
pub(crate) const RELEASE_LOCK: &str = "SELECT RELEASE_LOCK(?)";

/// The port the server sees this session come from (`host:port`; no port on a Unix socket).
pub(crate) const CLIENT_HOST: &str =
    "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()";

/// What this client's statements need of a server.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Bumps the key's counter and records the holder, in one autocommit statement; the
    /// new token is its `LAST_INSERT_ID`. Binds: name, holder, ttl_ms, holder, ttl_ms.
    pub(crate) grant: String,
    /// Records a new TTL of this session's grant. Binds: ttl_ms, name.
    pub(crate) record_ttl: String,
    /// The lock's holding session, its recorded grant and how long the session has been
    /// idle. Binds: lock name, lock name, name.
    pub(crate) inspect: String,
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            grant: format!(
                "INSERT INTO `{table}` (name, token, holder, conn, ttl_ms) \
                 VALUES (?, LAST_INSERT_ID(1), ?, CONNECTION_ID(), ?) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = ?, \
                 conn = CONNECTION_ID(), ttl_ms = ?"
            ),
            record_ttl: format!(
                "UPDATE `{table}` SET ttl_ms = ? WHERE name = ? AND conn = CONNECTION_ID()"
            ),
            inspect: format!(
                "SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED), t.holder, t.token, t.conn, t.ttl_ms, \
                   (SELECT p.TIME FROM information_schema.PROCESSLIST p \
                    WHERE p.ID = IS_USED_LOCK(?)) \
                 FROM (SELECT 1) AS one LEFT JOIN `{table}` t ON t.name = ?"
            ),
        }
    }
}

/// The session settings of a lock connection: the server ends the session (and frees its
/// locks) after `wait_timeout` seconds without a statement; each statement commits on
/// its own (a server whose default is `autocommit=0` would otherwise leave a grant's
/// counter uncommitted, to be rolled back and handed out again); no statement time limit
/// or idle-transaction timeout a role or server default might impose ends a lock or a
/// wait early.
pub(crate) fn session_settings(mariadb: bool, wait_timeout: u64) -> String {
    let no_limits = match mariadb {
        true => {
            "max_statement_time = 0, idle_transaction_timeout = 0, \
             idle_write_transaction_timeout = 0, idle_readonly_transaction_timeout = 0"
        }
        false => "max_execution_time = 0",
    };
    format!("SET SESSION wait_timeout = {wait_timeout}, autocommit = 1, {no_limits}")
}

/// A shared pool connection's settings: each statement commits on its own (and a read
/// sees the latest commits).
pub(crate) const POOL_SETTINGS: &str = "SET SESSION autocommit = 1";

/// `wait_timeout` for a TTL: whole seconds, rounded up (the server's unit), at least 1.
pub(crate) fn wait_timeout(ttl: std::time::Duration) -> u64 {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    ms.div_ceil(1000).clamp(1, 31_536_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ttl_rounds_up_to_the_servers_seconds() {
        assert_eq!(wait_timeout(Duration::from_millis(1)), 1);
        assert_eq!(wait_timeout(Duration::from_millis(1000)), 1);
        assert_eq!(wait_timeout(Duration::from_millis(1001)), 2);
        assert_eq!(wait_timeout(Duration::from_secs(1 << 40)), 31_536_000);
    }
}
