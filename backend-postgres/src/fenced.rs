//! The seed's "fenced write" in the same database: a resource row that accepts a write
//! only with a fencing token at least as new as the last one it accepted.

use sqlx::{AssertSqlSafe, Executor};
use tenure_api::{FencingToken, LockError};

use crate::config::{qualified, validate_ident};
use crate::PgLock;

/// What [`FencedTable::write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedWrite {
    /// The write was applied; the row now carries this token.
    Accepted,
    /// A newer holder has written already: the stale write was refused.
    Rejected {
        /// The token of the last accepted write.
        last_fence: FencingToken,
    },
}

/// A table of resources guarded by fencing tokens:
/// `(id text PRIMARY KEY, last_fence bigint, value text, updated_at timestamptz)`.
///
/// A write carrying token `t` is applied only `WHERE last_fence <= t`, atomically with
/// the update: a holder may write several times with its own token, and once a newer
/// holder (whose token is strictly larger) has written, every write of an older holder —
/// one paused past its lease, say — is refused by the database itself. Use
/// [`write_sql`](Self::write_sql) to run the same guarded statement inside your own
/// transaction, next to the business update it protects.
///
/// ```no_run
/// # async fn demo(lock: &tenure_postgres::PgLock, lease: &tenure_api::Lease) -> Result<(), tenure_api::LockError> {
/// use tenure_postgres::{FencedTable, FencedWrite};
/// let orders = FencedTable::new("public", "order_state")?;
/// orders.create(lock).await?;
/// match orders.write(lock, "order-1001", lease.token(), "processing").await? {
///     FencedWrite::Accepted => {}
///     FencedWrite::Rejected { last_fence } => eprintln!("stale holder; {last_fence} wrote since"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedTable {
    schema: String,
    table: String,
}

impl FencedTable {
    /// A fenced table `schema.table`; names that are not plain identifiers are
    /// [`LockError::Config`].
    pub fn new(schema: &str, table: &str) -> Result<Self, LockError> {
        validate_ident("schema", schema, 63)?;
        validate_ident("table", table, 63)?;
        Ok(Self {
            schema: schema.into(),
            table: table.into(),
        })
    }

    fn name(&self) -> String {
        qualified(&self.schema, &self.table)
    }

    /// `CREATE TABLE IF NOT EXISTS` for the table.
    pub fn create_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, last_fence bigint NOT NULL, \
             value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())",
            self.name()
        )
    }

    /// The guarded upsert: `$1` id, `$2` token (bigint), `$3` value. Returns one row
    /// (`last_fence`) if the write was applied, none if it was refused.
    pub fn write_sql(&self) -> String {
        format!(
            "INSERT INTO {} AS r (id, last_fence, value, updated_at) \
             VALUES ($1, $2, $3, clock_timestamp()) \
             ON CONFLICT (id) DO UPDATE SET last_fence = EXCLUDED.last_fence, \
             value = EXCLUDED.value, updated_at = EXCLUDED.updated_at \
             WHERE r.last_fence <= EXCLUDED.last_fence \
             RETURNING last_fence",
            self.name()
        )
    }

    /// Creates the table if it is missing.
    ///
    /// # Cancel safety
    /// Cancel-safe: DDL in autocommit either happened or not.
    pub async fn create(&self, lock: &PgLock) -> Result<(), LockError> {
        let mut conn = lock.pooled().await?;
        let create = conn.execute(sqlx::raw_sql(AssertSqlSafe(self.create_sql())));
        lock.bounded("create fenced table", create)
            .await
            .map(|_| ())
    }

    /// Writes `value` to resource `id` with `token`, unless a newer token has written.
    ///
    /// # Cancel safety
    /// Cancel-safe: one autocommit statement, applied or not.
    pub async fn write(
        &self,
        lock: &PgLock,
        id: &str,
        token: FencingToken,
        value: &str,
    ) -> Result<FencedWrite, LockError> {
        let token = to_i64(token)?;
        let mut conn = lock.pooled().await?;
        let applied: Option<i64> = lock
            .bounded(
                "fenced write",
                sqlx::query_scalar(AssertSqlSafe(self.write_sql()))
                    .bind(id)
                    .bind(token)
                    .bind(value)
                    .fetch_optional(&mut *conn),
            )
            .await?;
        drop(conn);
        if applied.is_some() {
            return Ok(FencedWrite::Accepted);
        }
        let last_fence = self
            .read(lock, id)
            .await?
            .map(|(fence, _)| fence)
            .ok_or_else(|| LockError::backend(format!("fenced row {id:?} vanished")))?;
        Ok(FencedWrite::Rejected { last_fence })
    }

    /// The last accepted token and value of resource `id`.
    ///
    /// # Cancel safety
    /// Read-only: cancel-safe.
    pub async fn read(
        &self,
        lock: &PgLock,
        id: &str,
    ) -> Result<Option<(FencingToken, String)>, LockError> {
        let sql = format!(
            "SELECT last_fence, value FROM {} WHERE id = $1",
            self.name()
        );
        let mut conn = lock.pooled().await?;
        let row: Option<(i64, String)> = lock
            .bounded(
                "fenced read",
                sqlx::query_as(AssertSqlSafe(sql))
                    .bind(id)
                    .fetch_optional(&mut *conn),
            )
            .await?;
        row.map(|(fence, value)| {
            u64::try_from(fence)
                .map(|f| (FencingToken(f), value))
                .map_err(|_| LockError::backend(format!("fenced row {id:?} has fence {fence}")))
        })
        .transpose()
    }
}

fn to_i64(token: FencingToken) -> Result<i64, LockError> {
    i64::try_from(token.get())
        .map_err(|_| LockError::InvalidInput(format!("token {token} does not fit a bigint")))
}
