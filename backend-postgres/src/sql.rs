//! The SQL text: statements built once from the configured names, and the batch that
//! opens a lock transaction.

use std::time::Duration;

use crate::{Locking, PgConfig};

/// Largest value Postgres accepts for a millisecond timeout setting.
const MAX_TIMEOUT_MS: u128 = i32::MAX as u128;

/// SQL text built once from the validated, quoted names.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) locking: Locking,
    /// The lock table's quoted name.
    table: String,
    /// The `NOWAIT` lock; `$1` is the row key. No row: busy (advisory) or no lock row yet.
    pub(crate) lock_nowait: String,
    /// The blocking lock, under `lock_timeout`.
    pub(crate) lock_wait: String,
    /// What a granted lock statement returns: the transaction id and backend pid.
    granted: String,
    /// The advisory lock id of the row key `$1`.
    advisory_id: String,
    pub(crate) ensure_row: String,
    /// Takes each grant's fence and records its holder (see `records`).
    pub(crate) record: String,
    /// The same, replacing a record of the grant's own transaction.
    pub(crate) record_again: String,
    pub(crate) inspect: String,
    /// [`inspect`](Self::inspect) over the row keys `$1` (an array), each row led by its
    /// key.
    pub(crate) inspect_each: String,
    /// Counts the holder and the waiters of the row key `$1` in `pg_locks`.
    pub(crate) queued: String,
    pub(crate) update_ttl: String,
    pub(crate) migrate: String,
    /// `locking=lease`'s statements.
    pub(crate) lease: LeaseStatements,
}

/// The statements of `locking=lease`, each one autocommit statement on the pool.
#[derive(Debug)]
pub(crate) struct LeaseStatements {
    /// Takes the key `$1` for owner `$2` (label `$3`, TTL `$4` ms) if it is free or its
    /// lease ran out, with a new token, durably. Returns the token (`NULL`: busy) and the
    /// milliseconds left of the lease found (`NULL`: none).
    pub(crate) acquire: String,
    /// Pushes the expiry of `$1` held by owner `$2` with token `$3` to now + `$4` ms,
    /// durably; a row if it was still theirs.
    pub(crate) extend: String,
    /// Ends the lease of `$1` held by `$2` with token `$3` and announces it on
    /// [`RELEASED_CHANNEL`]; a row if it was still theirs.
    pub(crate) release: String,
    /// Ends the lease of `$1` held by owner `$2` whatever its token (an attempt's owner
    /// is its own) and announces it: what a dropped attempt gives back.
    pub(crate) abandon: String,
    /// Owner, label, token, milliseconds left and key of each live lease of the keys `$1`.
    pub(crate) inspect_each: String,
    /// The same columns for every live lease whose key starts with `$1`, by key.
    pub(crate) holders: String,
    /// The channel releases are announced on (payload: the row key).
    pub(crate) channel: String,
}

/// The channel lease releases are announced on. One for every table: a waiter woken by
/// another table's release of a key of the same name tries once more.
pub(crate) const RELEASED_CHANNEL: &str = "tenure_lease_released";

impl LeaseStatements {
    fn new(config: &PgConfig) -> Self {
        let (leases, fence) = (config.lease_table(), config.fence_sequence());
        let left =
            "GREATEST(0, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000)::bigint)";
        let expiry = |ttl: &str| format!("clock_timestamp() + {ttl} * interval '1 millisecond'");
        let durable = "(SELECT set_config('synchronous_commit', 'on', true)) AS durable";
        Self {
            acquire: format!(
                "WITH found AS (SELECT {left} AS left_ms FROM {leases} \
                 WHERE key = $1 AND expires_at > clock_timestamp()), \
                 granted AS (INSERT INTO {leases} AS l \
                 (key, owner, label, token, expires_at, ttl_ms) \
                 VALUES ($1, $2, $3, nextval('{fence}'), {}, $4) \
                 ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
                 label = EXCLUDED.label, token = nextval('{fence}'), expires_at = {}, \
                 ttl_ms = EXCLUDED.ttl_ms WHERE l.expires_at <= clock_timestamp() \
                 RETURNING token) \
                 SELECT (SELECT token FROM granted), (SELECT left_ms FROM found) FROM {durable}",
                expiry("$4::bigint"),
                expiry("EXCLUDED.ttl_ms"),
            ),
            // Never shortens a lease: a shorter extension may come from a copy of the lease,
            // or from a caller that went away while the original keeps the longer deadline.
            extend: format!(
                "UPDATE {leases} SET expires_at = GREATEST(expires_at, {}), ttl_ms = $4 \
                 FROM {durable} \
                 WHERE key = $1 AND owner = $2 AND token = $3 \
                 AND expires_at > clock_timestamp() RETURNING 1",
                expiry("$4::bigint"),
            ),
            release: format!(
                "WITH ended AS (UPDATE {leases} SET expires_at = '-infinity' \
                 WHERE key = $1 AND owner = $2 AND token = $3 \
                 AND expires_at > clock_timestamp() RETURNING key) \
                 SELECT pg_notify('{RELEASED_CHANNEL}', key) FROM ended"
            ),
            abandon: format!(
                "WITH ended AS (UPDATE {leases} SET expires_at = '-infinity' \
                 WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp() \
                 RETURNING key) \
                 SELECT pg_notify('{RELEASED_CHANNEL}', key) FROM ended"
            ),
            inspect_each: format!(
                "SELECT owner, label, token, {left}, key FROM {leases} \
                 WHERE key = ANY($1::text[]) AND expires_at > clock_timestamp()"
            ),
            holders: format!(
                "SELECT owner, label, token, {left}, key FROM {leases} \
                 WHERE starts_with(key, $1) AND expires_at > clock_timestamp() ORDER BY key"
            ),
            channel: RELEASED_CHANNEL.to_owned(),
        }
    }
}

/// The lock objects of `config`'s mode, each created only if missing.
pub(crate) fn ddl(config: &PgConfig) -> String {
    match config.locking {
        Locking::Lease => lease_ddl(config),
        Locking::Row | Locking::Advisory => tables_ddl(config),
    }
}

/// The lease table and the fence sequence, each created only if missing. Rows are never
/// deleted (a release sets the expiry to `-infinity`), so a key's tokens keep increasing.
fn lease_ddl(config: &PgConfig) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, owner text NOT NULL, \
         label text, token bigint NOT NULL, expires_at timestamptz NOT NULL, \
         ttl_ms bigint NOT NULL); \
         CREATE SEQUENCE IF NOT EXISTS {} AS bigint MINVALUE 1 NO CYCLE",
        config.lease_table(),
        config.fence_sequence()
    )
}

impl Statements {
    pub(crate) fn new(config: &PgConfig) -> Self {
        let (table, holders, fence) = (
            config.lock_table(),
            config.holder_table(),
            config.fence_sequence(),
        );
        // What a granted lock statement returns: the transaction id and backend pid.
        let granted =
            format!("SELECT pg_current_xact_id()::text AS {LOCKED_XID}, pg_backend_pid()");
        let advisory_id = format!(
            "hashtextextended({} || $1, 0)",
            literal(&format!("{table}:"))
        );
        // `locking=lease` runs none of the transaction modes' statements (see `lease`).
        let (lock_nowait, lock_wait) = match config.locking {
            Locking::Row | Locking::Lease => {
                let lock = format!("{granted} FROM {table} WHERE key = $1 FOR UPDATE");
                (format!("{lock} NOWAIT"), lock)
            }
            Locking::Advisory => (
                format!("{granted} WHERE pg_try_advisory_xact_lock({advisory_id})"),
                format!("{granted} FROM pg_advisory_xact_lock({advisory_id})"),
            ),
        };
        let queued = queued(config, &table, &advisory_id);
        // A live holder's record: owner, token and (where its session shows) time left.
        let holder_columns = "SELECT h.owner, h.token, CASE a.state \
             WHEN 'idle in transaction' THEN GREATEST(h.ttl_ms - \
             (EXTRACT(EPOCH FROM clock_timestamp() - a.state_change) * 1000)::bigint, 0) \
             WHEN 'active' THEN h.ttl_ms END";
        let from = format!("FROM {holders} h LEFT JOIN pg_stat_activity a ON a.pid = h.pid");
        let live = "pg_xact_status(h.xid) = 'in progress'";
        Self {
            locking: config.locking,
            lock_nowait,
            lock_wait,
            granted,
            advisory_id,
            ensure_row: format!(
                "INSERT INTO {table} (key) VALUES ($1) ON CONFLICT (key) DO NOTHING"
            ),
            record: record(&holders, &fence, ""),
            // Sent alone, once, after the record's reply was lost: the first statement
            // may have committed, so a record of the same transaction is replaced (with a
            // newer token; only this one's is handed out). The first statement never
            // replaces one, so arriving late it cannot undo this.
            record_again: record(&holders, &fence, " OR h.xid = EXCLUDED.xid"),
            queued,
            inspect: format!("{holder_columns} {from} WHERE h.key = $1 AND {live}"),
            inspect_each: format!(
                "{holder_columns}, h.key {from} WHERE h.key = ANY($1::text[]) AND {live}"
            ),
            update_ttl: format!(
                "UPDATE {holders} SET ttl_ms = $2 WHERE key = $1 AND xid = $3::text::xid8"
            ),
            migrate: ddl(config),
            lease: LeaseStatements::new(config),
            table,
        }
    }
}

impl Statements {
    /// Inserts the rows of `row_keys` that are missing, in sorted order, so that clients
    /// inserting overlapping sets wait for each other's new rows in one order and never
    /// deadlock.
    pub(crate) fn insert_rows(&self, row_keys: &[String]) -> String {
        let mut sorted: Vec<&String> = row_keys.iter().collect();
        sorted.sort();
        sorted.dedup();
        let rows: Vec<String> = sorted.iter().map(|k| format!("({})", literal(k))).collect();
        format!(
            "INSERT INTO {} (key) VALUES {} ON CONFLICT (key) DO NOTHING",
            self.table,
            rows.join(", ")
        )
    }

    /// One statement that locks the first of `row_keys` (two or more) that is free, in
    /// their order, and nothing else: with its index as [`LOCKED_INDEX`].
    ///
    /// - Row locking: `FOR UPDATE SKIP LOCKED` over their rows, sorted by position,
    ///   `LIMIT 1`: the rows locked by others are skipped, and the first that is not is
    ///   the one locked. No row: every key is held (the batch inserted their rows).
    /// - Advisory locking: a `CASE` of `pg_try_advisory_xact_lock` calls, which stops at
    ///   the first that grants (a `CASE` evaluates no branch past the one it takes),
    ///   evaluated once in a materialized CTE; no key free: no row (and, as with `NOWAIT`,
    ///   no transaction id spent).
    pub(crate) fn lock_any(&self, row_keys: &[String]) -> String {
        let keys: Vec<String> = row_keys.iter().map(|k| literal(k)).collect();
        let granted = &self.granted;
        match self.locking {
            Locking::Row | Locking::Lease => format!(
                "{granted}, array_position(ARRAY[{list}]::text[], key) - 1 AS {LOCKED_INDEX} \
                 FROM {table} WHERE key IN ({list}) ORDER BY 3 LIMIT 1 FOR UPDATE SKIP LOCKED",
                list = keys.join(", "),
                table = self.table,
            ),
            Locking::Advisory => {
                let branches: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, key)| {
                        // A single pass over the template: `$1` inside the key stays.
                        let id = self.advisory_id.replace("$1", key);
                        format!("WHEN pg_try_advisory_xact_lock({id}) THEN {i}")
                    })
                    .collect();
                // The transaction id only once a lock is taken: a busy try assigns none.
                format!(
                    "WITH tried AS MATERIALIZED (SELECT CASE {} END AS i) \
                     {granted}, i AS {LOCKED_INDEX} FROM tried WHERE i IS NOT NULL",
                    branches.join(" ")
                )
            }
        }
    }
}

/// The statement that takes each grant's fence and records its holder: one row per grant,
/// from parallel arrays (see `records`), with distinct keys. Only the live holder of the
/// lock records itself (a late record from a dead holder loses), and never over another
/// holder whose transaction is still running, unless `replace` says so.
///
/// Its own transaction commits with `synchronous_commit = on`, set in the statement
/// (`set_config(…, true)`: for this transaction only), whatever the role's default and
/// whether or not a pooler passed the connection's startup options on: a fence is
/// flushed before it is handed out, or a crash could hand it out again.
fn record(holders: &str, fence: &str, replace: &str) -> String {
    format!(
        "INSERT INTO {holders} AS h (key, owner, token, xid, pid, ttl_ms, granted_at) \
         SELECT r.key, r.owner, nextval('{fence}'), r.xid::xid8, r.pid, r.ttl_ms, \
         clock_timestamp() \
         FROM (SELECT set_config('synchronous_commit', 'on', true)) AS durable, \
         unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[]) \
         AS r(key, owner, xid, pid, ttl_ms) \
         WHERE pg_xact_status(r.xid::xid8) = 'in progress' \
         ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, \
         xid = EXCLUDED.xid, pid = EXCLUDED.pid, ttl_ms = EXCLUDED.ttl_ms, \
         granted_at = EXCLUDED.granted_at \
         WHERE pg_xact_status(h.xid) IS DISTINCT FROM 'in progress'{replace} \
         RETURNING key, token"
    )
}

/// The lock table, holder table and fence sequence, each created only if missing.
fn tables_ddl(config: &PgConfig) -> String {
    let (table, holders, fence) = (
        config.lock_table(),
        config.holder_table(),
        config.fence_sequence(),
    );
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, \
         created_at timestamptz NOT NULL DEFAULT now()); \
         CREATE TABLE IF NOT EXISTS {holders} (key text PRIMARY KEY, owner text NOT NULL, \
         token bigint NOT NULL, xid xid8 NOT NULL, pid integer NOT NULL, \
         ttl_ms bigint NOT NULL, granted_at timestamptz NOT NULL); \
         CREATE SEQUENCE IF NOT EXISTS {fence} AS bigint MINVALUE 1 NO CYCLE"
    )
}

/// The one simple query that starts an attempt on a dedicated connection, in one round
/// trip:
///
/// 1. the key's row (several keys' rows), inserted and committed in a transaction of its
///    own (an explicit `BEGIN … COMMIT`, so the server logs no "no
///    transaction in progress" warning), so that concurrent first acquirers never wait
///    on each other's uncommitted insert and the lock below always finds the row;
/// 2. the lock transaction: the lease as the idle timeout; a server TCP keepalive idle
///    time that cannot give up on a silent client before the lease's TTL has run (a
///    keepalive failure ends the session, which frees the lock; the probes' interval and
///    count are the connection's, [`KEEPALIVE_INTERVAL`] and [`KEEPALIVE_COUNT`]); and
///    the lock wait bound, if any. No statement or transaction timeout can end it sooner:
///    the connection switched them off for its whole session when it opened
///    ([`SESSION_SETTINGS`]);
/// 3. for a single attempt (`lock_timeout` is `None`), the `NOWAIT` lock itself, so a
///    try-acquire takes three round trips in all: this one, the fence, the `COMMIT`;
///    with several keys (a single attempt only), the lock of the first one free
///    ([`Statements::lock_any`]).
///
/// The session `SET`s before `BEGIN` join the lock transaction (a simple query folds
/// them in), so a rollback undoes them too. Keys go in as escape-string literals (see
/// [`literal`]): a simple query has no parameters.
pub(crate) fn begin_batch(
    sql: &Statements,
    ttl: Duration,
    lock_timeout: Option<Duration>,
    row_keys: &[String],
) -> String {
    let idle = keepalive_idle(ttl);
    let mut batch = match sql.locking {
        Locking::Row | Locking::Lease => {
            format!("BEGIN; {}; COMMIT; ", sql.insert_rows(row_keys))
        }
        Locking::Advisory => String::new(),
    };
    batch.push_str(&format!(
        "SET tcp_keepalives_idle = {idle}; \
         BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}",
        timeout_ms(ttl)
    ));
    match (lock_timeout, row_keys) {
        (Some(wait), _) => {
            batch.push_str(&format!("; SET LOCAL lock_timeout = {}", timeout_ms(wait)))
        }
        // A single pass over the template: `$1` inside the key is not replaced again.
        (None, [key]) => batch.push_str(&format!(
            "; {}",
            sql.lock_nowait.replace("$1", &literal(key))
        )),
        (None, keys) => batch.push_str(&format!("; {}", sql.lock_any(keys))),
    }
    batch
}

/// The column naming the lock `SELECT`'s row in a [`begin_batch`] reply.
pub(crate) const LOCKED_XID: &str = "tenure_locked_xid";

/// The column of [`Statements::lock_any`]'s reply naming which key it locked.
pub(crate) const LOCKED_INDEX: &str = "tenure_locked_index";

/// The statement counting a key's holder and waiters, from `pg_locks`.
///
/// - Row locking: the holder is the running transaction whose id is the row's `xmax` (it
///   holds the `ExclusiveLock` on its own id). A waiter holds or awaits the row's tuple
///   lock, which the server takes while a `FOR UPDATE` waits and gives up once granted.
/// - Advisory locking: the holder and its waiters hold or await the key's advisory lock,
///   whose 64-bit id `pg_locks` shows in halves (`classid`, `objid`; `objsubid` 1).
fn queued(config: &PgConfig, table: &str, advisory_id: &str) -> String {
    let database = "(SELECT oid FROM pg_database WHERE datname = current_database())";
    match config.locking {
        // No queue: waiters try again; only the holder is seen.
        Locking::Lease => format!(
            "SELECT count(*) FROM {} WHERE key = $1 AND expires_at > clock_timestamp()",
            config.lease_table()
        ),
        Locking::Row => format!(
            "SELECT count(*) FROM {table} t JOIN pg_locks l ON \
             (l.locktype = 'transactionid' AND l.transactionid = t.xmax \
             AND l.mode = 'ExclusiveLock' AND l.granted) \
             OR (l.locktype = 'tuple' AND l.database = {database} \
             AND l.relation = {}::regclass \
             AND l.page = (t.ctid::text::point)[0] AND l.tuple = (t.ctid::text::point)[1]) \
             WHERE t.key = $1",
            literal(table)
        ),
        Locking::Advisory => format!(
            "SELECT count(*) FROM pg_locks l, (SELECT {advisory_id} AS id) k \
             WHERE l.locktype = 'advisory' AND l.database = {database} AND l.objsubid = 1 \
             AND l.classid = ((k.id >> 32) & 4294967295)::oid \
             AND l.objid = (k.id & 4294967295)::oid"
        ),
    }
}

/// `text` as an escape-string literal, `E'…'`, whose meaning does not depend on
/// `standard_conforming_strings`. Keys and prefixes have no NUL (checked before).
fn literal(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 4);
    quoted.push_str("E'");
    for c in text.chars() {
        if c == '\'' || c == '\\' {
            quoted.push(c);
        }
        quoted.push(c);
    }
    quoted.push('\'');
    quoted
}

/// Seconds between the server's keepalive probes on a lock connection (a startup
/// option of the connection).
pub(crate) const KEEPALIVE_INTERVAL: u64 = 3;

/// Unanswered keepalive probes after which the server gives up on a lock connection (a
/// startup option of the connection).
pub(crate) const KEEPALIVE_COUNT: u64 = 3;

const _: () = assert!(KEEPALIVE_INTERVAL > 0 && KEEPALIVE_COUNT > 0);

/// The server's keepalive idle time (seconds) for a lease of `ttl`: with the
/// connection's [`KEEPALIVE_INTERVAL`] and [`KEEPALIVE_COUNT`], the server gives up on a
/// silent client no sooner than `idle + interval × count`, which is at least `ttl`.
pub(crate) fn keepalive_idle(ttl: Duration) -> u64 {
    // Linux caps TCP_KEEPIDLE at 32767 s; MAX_TTL is far below it.
    ttl.as_secs_f64().ceil().clamp(1.0, 32_767.0) as u64
}

/// What a lock connection sets for its whole session once it opens: no timeout of the
/// role's or database's defaults may end a lock transaction before its lease. The
/// `statement_timeout` (which would cut a lock wait) and `tcp_user_timeout` (which would
/// drop the session once keepalive probes go unanswered that long) are also startup
/// options of the connection, which override those defaults (and are what `RESET`
/// restores), and are set here again for a pooler that drops startup options;
/// `transaction_timeout` exists from
/// Postgres 17 on, so it is switched off here only where it exists, looked up with
/// `current_setting(…, missing_ok)`, not in `pg_settings` (which builds every setting's
/// row: 0.7–1.2 ms of server time).
pub(crate) const SESSION_SETTINGS: &str = "SELECT set_config('statement_timeout', '0', false), \
     set_config('tcp_user_timeout', '0', false), \
     CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL \
     THEN set_config('transaction_timeout', '0', false) END";

/// A duration as whole milliseconds for a Postgres timeout setting: at least 1 (0 would
/// mean "no timeout"), at most `i32::MAX`.
pub(crate) fn timeout_ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, MAX_TIMEOUT_MS) as u64
}

/// The longest `lock_timeout` the server takes (about 24.8 days).
pub(crate) const LOCK_TIMEOUT_CAP: Duration = Duration::from_millis(MAX_TIMEOUT_MS as u64);

/// Whether a lock wait of `wait` is longer than the server's `lock_timeout` can be: the
/// wait then ends at [`LOCK_TIMEOUT_CAP`], before its deadline, and is waited again.
pub(crate) fn lock_timeout_capped(wait: Duration) -> bool {
    wait > LOCK_TIMEOUT_CAP
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defect: `Duration::MAX` (or any wait past 24.8 days) ended in `Timeout` once the
    /// capped `lock_timeout` ran out; such a wait is now waited again.
    #[test]
    fn a_wait_beyond_the_servers_lock_timeout_cap_is_waited_again() {
        let cap = Duration::from_millis(i32::MAX as u64);
        assert_eq!(timeout_ms(cap * 2), i32::MAX as u64, "the server's cap");
        assert!(lock_timeout_capped(cap + Duration::from_millis(1)));
        assert!(lock_timeout_capped(Duration::from_secs(
            100 * 365 * 24 * 3600
        )));
        assert!(!lock_timeout_capped(cap));
        assert!(!lock_timeout_capped(Duration::from_secs(24 * 24 * 3600)));
    }

    #[test]
    fn keepalives_never_give_up_before_the_ttl() {
        for ms in [
            100, 999, 1000, 1001, 10_000, 19_000, 30_000, 30_500, 3_600_000,
        ] {
            let ttl = Duration::from_millis(ms);
            let idle = keepalive_idle(ttl);
            assert!(Duration::from_secs(idle) >= ttl, "{ttl:?}: {idle}");
        }
        let batch = try_batch("postgres://u@h/db", Duration::from_secs(30), "k");
        assert!(batch.contains("tcp_keepalives_idle = 30;"), "{batch}");
    }

    /// The begin batch of a try-acquire of `key` by a client of `url`.
    fn try_batch(url: &str, ttl: Duration, key: &str) -> String {
        let config = PgConfig::from_url(url).unwrap();
        begin_batch(&Statements::new(&config), ttl, None, &[key.to_string()])
    }

    #[test]
    fn advisory_locking_locks_a_hash_of_table_and_key_and_inserts_no_row() {
        let batch = try_batch(
            "postgres://u@h/db?locking=advisory",
            Duration::from_secs(1),
            "k",
        );
        assert!(!batch.contains("INSERT"), "{batch}");
        assert!(
            batch.ends_with(
                "WHERE pg_try_advisory_xact_lock(hashtextextended(\
                 E'\"public\".\"tenure_locks\":' || E'k', 0))"
            ),
            "{batch}"
        );
    }

    #[test]
    fn several_keys_are_inserted_sorted_and_the_first_free_is_locked_alone() {
        let keys = ["b'2".to_string(), "a".to_string()];
        let row = PgConfig::from_url("postgres://u@h/db").unwrap();
        let batch = begin_batch(&Statements::new(&row), Duration::from_secs(1), None, &keys);
        assert!(batch.contains("VALUES (E'a'), (E'b''2')"), "{batch}");
        assert!(
            batch.ends_with(
                "array_position(ARRAY[E'b''2', E'a']::text[], key) - 1 AS tenure_locked_index \
                 FROM \"public\".\"tenure_locks\" WHERE key IN (E'b''2', E'a') \
                 ORDER BY 3 LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            "{batch}"
        );
        let advisory = PgConfig::from_url("postgres://u@h/db?locking=advisory").unwrap();
        let batch = begin_batch(
            &Statements::new(&advisory),
            Duration::from_secs(1),
            None,
            &keys,
        );
        let id = |k: &str| {
            format!("pg_try_advisory_xact_lock(hashtextextended(E'\"public\".\"tenure_locks\":' || {k}, 0))")
        };
        assert!(
            batch.contains(&format!(
                "(SELECT CASE WHEN {} THEN 0 WHEN {} THEN 1 END AS i)",
                id("E'b''2'"),
                id("E'a'")
            )) && batch.ends_with("i AS tenure_locked_index FROM tried WHERE i IS NOT NULL"),
            "{batch}"
        );
    }

    #[test]
    fn keys_are_quoted_whatever_they_contain() {
        assert_eq!(literal("plain/key"), "E'plain/key'");
        assert_eq!(literal(r"it's a \ key"), r"E'it''s a \\ key'");
        assert_eq!(literal("$k$ ends in $"), "E'$k$ ends in $'");
        let batch = try_batch("postgres://u@h/db", Duration::from_secs(1), "x');--");
        assert!(batch.contains("VALUES (E'x'');--')"), "{batch}");
        assert!(
            batch.ends_with("WHERE key = E'x'');--' FOR UPDATE NOWAIT"),
            "{batch}"
        );
    }
}
