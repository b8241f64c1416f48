//! `PgLock::transaction`: the lock and the work in one transaction — the seed's "database
//! row lock as the ground truth" — committed together, rolled back together, and lost
//! together.

use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockError, LockKey};
use tenure_postgres::lab::Postgres;
use tenure_postgres::PgLock;

const TTL: Duration = Duration::from_secs(30);

/// A server with the seed's tables, order 1001 `new`, and a client on each of `locking`.
async fn orders() -> Postgres {
    let server = Postgres::start().await.unwrap();
    server
        .psql(
            "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL); \
             CREATE TABLE order_events (order_id int NOT NULL, event text NOT NULL); \
             INSERT INTO orders VALUES (1001, 'new')",
        )
        .await
        .unwrap();
    server
}

/// The order's status and its events, as committed.
async fn committed(server: &Postgres) -> String {
    let sql = "SELECT status || ':' || (SELECT count(*) FROM order_events) FROM orders \
               WHERE id = 1001";
    server.psql(sql).await.unwrap().trim().to_owned()
}

/// The seed's work: pay order 1001 and record the event.
async fn pay(conn: &mut sqlx::PgConnection) {
    sqlx::query("UPDATE orders SET status = 'paid' WHERE id = 1001")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO order_events (order_id, event) VALUES (1001, 'paid')")
        .execute(&mut *conn)
        .await
        .unwrap();
}

fn opts() -> AcquireOptions {
    AcquireOptions::new(TTL).wait(Duration::from_secs(5))
}

#[tokio::test]
async fn the_work_commits_with_the_lock() {
    let server = orders().await;
    for locking in ["row", "advisory"] {
        server
            .psql("UPDATE orders SET status = 'new'; DELETE FROM order_events")
            .await
            .unwrap();
        let url = format!("{}?locking={locking}", server.url());
        let (lock, other) = (
            PgLock::connect(&url).await.unwrap(),
            PgLock::connect(&url).await.unwrap(),
        );
        let key = LockKey::new("orders/1001").unwrap();
        let mut tx = lock.transaction(&key, &opts()).await.unwrap();
        assert_eq!(tx.key(), &key);
        let holder = other.inspect(&key).await.unwrap().expect("held");
        assert_eq!(
            (holder.owner, holder.token),
            (tx.owner(), Some(tx.fencing_token()))
        );
        assert!(
            other.try_acquire(&key, TTL).await.unwrap().is_none(),
            "{locking}: one holder"
        );
        pay(tx.connection().unwrap()).await;
        assert_eq!(
            committed(&server).await,
            "new:0",
            "{locking}: visible before the commit"
        );
        let token = tx.fencing_token();
        tx.commit().await.unwrap();
        assert_eq!(
            committed(&server).await,
            "paid:1",
            "{locking}: the work committed"
        );
        let next = other.try_acquire(&key, TTL).await.unwrap();
        let next = next.unwrap_or_else(|| panic!("{locking}: the commit ended the lease"));
        assert!(next.token() > token, "{locking}: tokens go on increasing");
        other.release(next).await.unwrap();
    }
}

#[tokio::test]
async fn a_lease_mode_client_has_no_transaction_to_hand_over() {
    let server = Postgres::start().await.unwrap();
    let url = format!("{}?locking=lease", server.url());
    let lock = PgLock::connect(&url).await.unwrap();
    let key = LockKey::new("orders/1001").unwrap();
    let refused = lock.transaction(&key, &opts()).await.unwrap_err();
    assert!(
        matches!(&refused, LockError::Config(m) if m.contains("locking=lease")),
        "{refused:?}"
    );
    assert!(
        lock.inspect(&key).await.unwrap().is_none(),
        "nothing granted"
    );
}

#[tokio::test]
async fn the_work_rolls_back_with_the_lock() {
    let server = orders().await;
    let lock = PgLock::connect(&server.url()).await.unwrap();
    let key = LockKey::new("orders/1001").unwrap();
    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    pay(tx.connection().unwrap()).await;
    tx.rollback().await.unwrap();
    assert_eq!(committed(&server).await, "new:0");
    assert!(
        lock.inspect(&key).await.unwrap().is_none(),
        "the rollback ended the lease"
    );
    // Dropped without either: rolled back too, and the lock freed at once.
    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    pay(tx.connection().unwrap()).await;
    drop(tx);
    let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(5));
    let next = lock.acquire(&key, &opts).await.expect("freed by the drop");
    assert_eq!(committed(&server).await, "new:0");
    lock.release(next).await.unwrap();
}

/// Nothing is committed when the transaction is no longer the lock's: its backend
/// terminated, idle past its TTL, failed by an earlier statement, or ended by a `COMMIT`
/// of the caller's own.
#[tokio::test]
async fn a_lost_lock_commits_nothing() {
    let server = orders().await;
    let lock = PgLock::connect(&server.url()).await.unwrap();
    let key = LockKey::new("orders/1001").unwrap();
    let lost = |result: Result<(), LockError>, how: &str| match result {
        Err(LockError::LeaseLost { reason }) => reason,
        other => panic!("{how}: the commit answered {other:?}"),
    };

    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let conn = tx.connection().unwrap();
    pay(conn).await;
    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap();
    let killed = server
        .psql(&format!("SELECT pg_terminate_backend({pid})"))
        .await
        .unwrap();
    assert_eq!(killed.trim(), "t", "the holder's backend was terminated");
    let reason = lost(tx.commit().await, "terminated");
    assert!(!reason.is_empty());
    assert_eq!(committed(&server).await, "new:0", "terminated");

    let short = AcquireOptions::new(Duration::from_secs(1)).wait(Duration::from_secs(5));
    let mut tx = lock.transaction(&key, &short).await.unwrap();
    pay(tx.connection().unwrap()).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // idle past the 1 s TTL
    lost(tx.commit().await, "idle past its TTL");
    assert_eq!(committed(&server).await, "new:0", "idle past its TTL");

    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let conn = tx.connection().unwrap();
    pay(conn).await;
    let failed = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
    assert!(failed.is_err(), "the statement fails");
    let reason = lost(tx.commit().await, "failed");
    assert!(reason.contains("aborted"), "{reason}");
    assert_eq!(committed(&server).await, "new:0", "failed");

    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let conn = tx.connection().unwrap();
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    let reason = lost(tx.commit().await, "committed by the caller");
    assert!(reason.contains("not the lock transaction"), "{reason}");

    // Every one of them freed the lock.
    let free = lock.try_acquire(&key, TTL).await.unwrap().expect("free");
    lock.release(free).await.unwrap();
}

/// sqlx's own transactions on the connection nest as savepoints: their commit keeps the
/// lock's transaction (and the lock) open, their drop rolls back to the savepoint.
#[tokio::test]
async fn a_nested_sqlx_transaction_is_a_savepoint() {
    use sqlx::Connection;
    let server = orders().await;
    let (lock, other) = (
        PgLock::connect(&server.url()).await.unwrap(),
        PgLock::connect(&server.url()).await.unwrap(),
    );
    let key = LockKey::new("orders/1001").unwrap();
    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let mut nested = tx.connection().unwrap().begin().await.unwrap();
    pay(&mut nested).await;
    nested.commit().await.unwrap();
    assert_eq!(
        committed(&server).await,
        "new:0",
        "the nested commit ended nothing"
    );
    assert!(
        other.try_acquire(&key, TTL).await.unwrap().is_none(),
        "still held"
    );
    let mut undone = tx.connection().unwrap().begin().await.unwrap();
    sqlx::query("DELETE FROM order_events")
        .execute(&mut *undone)
        .await
        .unwrap();
    drop(undone); // rolls back to its savepoint
    tx.commit().await.unwrap();
    assert_eq!(
        committed(&server).await,
        "paid:1",
        "the work, less the rolled-back part"
    );
}

/// A longer extension is what `inspect` reports; a failure of the work itself at commit
/// (a deferred constraint) is the work's error, not a lost lock; a transaction dropped while
/// a statement of its runs frees the lock at once.
#[tokio::test]
async fn extend_commit_failure_and_drop_mid_statement() {
    let server = orders().await;
    server
        .psql(
            "CREATE TABLE invoices (n int, CONSTRAINT one UNIQUE (n) DEFERRABLE INITIALLY \
             DEFERRED)",
        )
        .await
        .unwrap();
    let (lock, other) = (
        PgLock::connect(&server.url()).await.unwrap(),
        PgLock::connect(&server.url()).await.unwrap(),
    );
    let key = LockKey::new("invoices").unwrap();
    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    tx.extend(Duration::from_secs(600)).await.unwrap();
    let left = other.inspect(&key).await.unwrap().and_then(|h| h.remaining);
    assert!(
        left.is_some_and(|l| l > TTL),
        "inspect after a 600 s extend: {left:?}"
    );
    let conn = tx.connection().unwrap();
    sqlx::query("INSERT INTO invoices VALUES (1), (1)")
        .execute(&mut *conn)
        .await
        .unwrap();
    match tx.commit().await {
        Err(LockError::Backend { message, .. }) => {
            assert!(message.contains("not committed"), "{message}")
        }
        other => panic!("a deferred constraint at commit: {other:?}"),
    }
    assert_eq!(
        server
            .psql("SELECT count(*) FROM invoices")
            .await
            .unwrap()
            .trim(),
        "0"
    );
    // A deferred trigger of the caller's that raises (SQLSTATE P0001) is the work's error
    // too, not taken for the commit's own check.
    server
        .psql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$; \
             CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON invoices \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()",
        )
        .await
        .unwrap();
    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let conn = tx.connection().unwrap();
    sqlx::query("INSERT INTO invoices VALUES (2)")
        .execute(&mut *conn)
        .await
        .unwrap();
    match tx.commit().await {
        Err(LockError::Backend { .. }) => {}
        other => panic!("a deferred trigger's RAISE at commit: {other:?}"),
    }
    server
        .psql("DROP TRIGGER refuse ON invoices")
        .await
        .unwrap();

    let mut tx = lock.transaction(&key, &opts()).await.unwrap();
    let sleep = sqlx::query("SELECT pg_sleep(60)").execute(tx.connection().unwrap());
    assert!(tokio::time::timeout(Duration::from_millis(300), sleep)
        .await
        .is_err());
    drop(tx);
    let wait = AcquireOptions::new(TTL).wait(Duration::from_secs(10));
    let next = other
        .acquire(&key, &wait)
        .await
        .expect("freed once its statement is cancelled");
    other.release(next).await.unwrap();
}

/// The caller's own row, locked in the transaction (the seed's `SELECT … FROM orders WHERE
/// id = 1001 FOR UPDATE NOWAIT`): held until the commit; a second try on it is "held" and
/// leaves that transaction usable; a missing row is `false`; names are checked.
#[tokio::test]
async fn the_callers_own_row_is_locked_in_the_transaction() {
    let server = orders().await;
    let lock = PgLock::connect(&server.url()).await.unwrap();
    let (first, second) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
    let mut tx = lock.transaction(&first, &opts()).await.unwrap();
    assert!(tx.lock_row("public.orders", "id", 1001_i32).await.unwrap());
    assert!(
        !tx.lock_row("orders", "id", 4242_i32).await.unwrap(),
        "no such row"
    );
    let mut other = lock.transaction(&second, &opts()).await.unwrap();
    match other.lock_row("orders", "id", 1001_i32).await {
        Err(LockError::Timeout { .. }) => {}
        held => panic!("a row locked by the first transaction: {held:?}"),
    }
    sqlx::query("INSERT INTO order_events VALUES (1001, 'noted')")
        .execute(other.connection().unwrap())
        .await
        .unwrap();
    other
        .commit()
        .await
        .expect("the refused row lock left the transaction usable");
    for (table, column) in [
        ("orders; DROP TABLE orders", "id"),
        ("orders", "id = id OR 1"),
    ] {
        let refused = tx.lock_row(table, column, 1001_i32).await.unwrap_err();
        assert!(matches!(refused, LockError::InvalidInput(_)), "{refused:?}");
    }
    pay(tx.connection().unwrap()).await;
    tx.commit().await.unwrap();
    assert_eq!(committed(&server).await, "paid:2");
}
