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

/// The row mode's table: one row per key, locked `FOR UPDATE` while held.
pub(crate) fn create_rows_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS `{table}` (name VARBINARY(1024) NOT NULL PRIMARY KEY) \
         ENGINE=InnoDB"
    )
}

/// `name` as a hex literal (`X'…'`): any bytes, safe to write into a statement.
fn hex_literal(name: &[u8]) -> String {
    let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
    format!("X'{hex}'")
}

/// The row mode's lock, in one round trip: a transaction opened, the key's row locked
/// (`NOWAIT`; or waiting up to `wait_secs` whole seconds in the row's queue), and the
/// [`SAVEPOINT`] the held lock's check rolls back to. No row: the key's row does not
/// exist yet.
pub(crate) fn lock_row(rows_table: &str, name: &[u8], wait_secs: Option<u64>) -> String {
    let row = hex_literal(name);
    let (set, nowait) = match wait_secs {
        None => (String::new(), " NOWAIT"),
        Some(secs) => (
            format!("SET SESSION innodb_lock_wait_timeout = {secs}; "),
            "",
        ),
    };
    format!(
        "{set}START TRANSACTION; \
         SELECT 1 FROM `{rows_table}` WHERE name = {row} FOR UPDATE{nowait}; {SAVEPOINT}"
    )
}

/// Locks a key's row just inserted, in the open transaction (a key's first use), and
/// marks the [`SAVEPOINT`] again.
pub(crate) fn relock_row(rows_table: &str, name: &[u8]) -> String {
    let row = hex_literal(name);
    format!("SELECT 1 FROM `{rows_table}` WHERE name = {row} FOR UPDATE NOWAIT; {SAVEPOINT}")
}

/// Marks the lock's transaction once its row is locked: rolling back to it (the held
/// lock's check) keeps the row's lock, and fails (1305) once the transaction has ended.
pub(crate) const SAVEPOINT: &str = "SAVEPOINT tenure_lock";

/// The held row lock's check: its transaction still runs (and the session's idle timer
/// restarts).
pub(crate) const CHECK_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT tenure_lock";

/// Which of `names`' rows are locked now, run in a transaction rolled back at once: the
/// rows a shared `SKIP LOCKED` read leaves out (column `free` names the others) among
/// those that exist (column `present`). The free rows are share-locked for that instant:
/// probes do not block each other, but a `NOWAIT` acquire of one then finds it busy.
pub(crate) fn probe_rows(rows_table: &str, names: &[&[u8]], mariadb: bool) -> String {
    let share = match mariadb {
        true => "LOCK IN SHARE MODE",
        false => "FOR SHARE",
    };
    let list = names
        .iter()
        .map(|name| hex_literal(name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT name AS free FROM `{rows_table}` WHERE name IN ({list}) {share} SKIP LOCKED; \
         SELECT name AS present FROM `{rows_table}` WHERE name IN ({list})"
    )
}

/// MySQL's "NOWAIT found the row locked"; MariaDB answers `NOWAIT` with a lock wait
/// timeout (1205), as a wait that ran out.
pub(crate) const LOCK_NOWAIT: u16 = 3572;
/// A row lock's wait ran out (`innodb_lock_wait_timeout`), or MariaDB's `NOWAIT`.
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// `GET_LOCK(name, seconds)`: 1 granted, 0 held by another session (or the wait ran out).
pub(crate) const GET_LOCK: &str = "SELECT GET_LOCK(?, ?)";

/// 1 when this session holds the named lock.
pub(crate) const HOLDS: &str = "SELECT IS_USED_LOCK(?) = CONNECTION_ID()";

/// 1 released, 0 held by another session, `NULL` not held at all.
pub(crate) const RELEASE_LOCK: &str = "SELECT RELEASE_LOCK(?)";

/// This session's id, and where the server sees it come from (`host:port`; no port on a
/// Unix socket).
pub(crate) const CLIENT_HOST: &str =
    "SELECT CONNECTION_ID(), HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()";

/// What this client's statements need of a server.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Bumps the key's counter and records the holder (its session's id), in one
    /// autocommit statement; the new token is its `LAST_INSERT_ID`. Binds: name, holder,
    /// session, ttl_ms, holder, session, ttl_ms.
    pub(crate) grant: String,
    /// Records a new TTL of a session's grant. Binds: ttl_ms, name, session.
    pub(crate) record_ttl: String,
    /// The lock's holding session, its recorded grant and how long the session has been
    /// idle (`GET_LOCK`). Binds: lock name, lock name, name.
    pub(crate) inspect: String,
    /// The key's recorded grant and how long its session has been idle (row locks).
    /// Binds: name.
    pub(crate) record: String,
    /// Creates a key's row (row locks). Binds: name.
    pub(crate) insert_row: String,
}

impl Statements {
    pub(crate) fn new(table: &str, rows_table: &str) -> Self {
        Self {
            grant: format!(
                "INSERT INTO `{table}` (name, token, holder, conn, ttl_ms) \
                 VALUES (?, LAST_INSERT_ID(1), ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = ?, \
                 conn = ?, ttl_ms = ?"
            ),
            record_ttl: format!("UPDATE `{table}` SET ttl_ms = ? WHERE name = ? AND conn = ?"),
            inspect: format!(
                "SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED), t.holder, t.token, t.conn, t.ttl_ms, \
                   (SELECT p.TIME FROM information_schema.PROCESSLIST p \
                    WHERE p.ID = IS_USED_LOCK(?)) \
                 FROM (SELECT 1) AS one LEFT JOIN `{table}` t ON t.name = ?"
            ),
            record: format!(
                "SELECT holder, token, conn, ttl_ms, \
                   (SELECT p.TIME FROM information_schema.PROCESSLIST p WHERE p.ID = t.conn) \
                 FROM `{table}` t WHERE name = ?"
            ),
            insert_row: format!("INSERT IGNORE INTO `{rows_table}` (name) VALUES (?)"),
        }
    }
}

/// The session settings of a lock connection: the server ends the session (and frees its
/// locks) after `wait_timeout` seconds without a statement; each statement commits on
/// its own (a server whose default is `autocommit=0` would otherwise leave a grant's
/// counter uncommitted, to be rolled back and handed out again); no statement time limit
/// or idle-transaction timeout a role or server default might impose ends a lock or a
/// wait early; row locks take no gap locks.
pub(crate) fn session_settings(mariadb: bool, wait_timeout: u64) -> String {
    let no_limits = match mariadb {
        true => {
            "max_statement_time = 0, idle_transaction_timeout = 0, \
             idle_write_transaction_timeout = 0, idle_readonly_transaction_timeout = 0"
        }
        false => "max_execution_time = 0",
    };
    format!("SET SESSION wait_timeout = {wait_timeout}, {no_limits}; {LOCK_SESSION}")
}

/// What the shared pool's sessions set: as [`LOCK_SESSION`], and a row lock waited for at
/// most a second.
pub(crate) const SHARED_SESSION: &str = "SET SESSION autocommit = 1; \
     SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     SET SESSION innodb_lock_wait_timeout = 1";

/// What every session of tenure's (and the bench floors') sets: each statement commits
/// on its own; READ COMMITTED, so that a row lock's `FOR UPDATE` of a key's missing row
/// takes no gap lock, which would block the row's insert on another connection.
pub(crate) const LOCK_SESSION: &str =
    "SET SESSION autocommit = 1; SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

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
    fn names_are_written_as_hex_literals() {
        let sql = lock_row("t_rows", b"a'; DROP TABLE t; --", None);
        assert!(
            sql.contains("X'61273b2044524f50205441424c4520743b202d2d'"),
            "{sql}"
        );
        assert!(!sql.contains("DROP"), "{sql}");
        let sql = probe_rows("t_rows", &[b"a", b"b"], true);
        assert!(sql.contains("IN (X'61', X'62')"), "{sql}");
    }

    #[test]
    fn a_ttl_rounds_up_to_the_servers_seconds() {
        assert_eq!(wait_timeout(Duration::from_millis(1)), 1);
        assert_eq!(wait_timeout(Duration::from_millis(1000)), 1);
        assert_eq!(wait_timeout(Duration::from_millis(1001)), 2);
        assert_eq!(wait_timeout(Duration::from_secs(1 << 40)), 31_536_000);
    }
}
