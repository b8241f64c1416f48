//! The launcher (`tenure_mysql::lab::MariaDb`) on a live server: it answers sqlx and its
//! own client, a crash restart keeps what was committed, a pause freezes it, a secured
//! server takes only TLS clients with a certificate and their password, and the clock
//! shim moves `NOW()`. Nothing outlives a handle.

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, MySqlConnection};
use tenure_conformance::servers::{pid_alive, Node, ServerError};
use tenure_mysql::lab::{MariaDb, MariaDbOptions};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn select_one(conn: &mut MySqlConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT 1").fetch_one(conn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_server_answers_sqlx_and_its_client() -> TestResult {
    let started = Instant::now();
    let server = MariaDb::start().await?;
    let took = started.elapsed();
    eprintln!("mariadb started in {took:?}");
    assert!(took < Duration::from_secs(10), "start took {took:?}");
    assert!(server.url().starts_with("mysql://root@127.0.0.1:"));
    assert!(server.dir().join("mysqld.sock").exists());

    let mut conn = MySqlConnection::connect(&server.url()).await?;
    assert_eq!(select_one(&mut conn).await?, 1);
    let db: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(db, "tenure");
    conn.close().await?;
    let mut proxied = MySqlConnection::connect(&server.proxied_url()).await?;
    assert_eq!(select_one(&mut proxied).await?, 1);
    proxied.close().await?;

    assert_eq!(server.sql("select 1").await?, "1");
    assert_eq!(server.sql("select database()").await?, "tenure");
    let err = server.sql("select * from no_such_table").await.unwrap_err();
    assert!(
        matches!(&err, ServerError::Protocol { detail, .. } if detail.contains("doesn't exist")),
        "{err}"
    );

    let pid = server.pid().expect("running");
    drop(server);
    assert!(!pid_alive(pid), "mariadbd outlived its handle");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_restart_keeps_commits() -> TestResult {
    let server = MariaDb::start().await?;
    server
        .sql("create table t (v int) engine=InnoDB; insert into t values (42)")
        .await?;
    let (pid, dir) = (server.pid().expect("running"), server.dir().to_owned());
    server.restart().await?;
    assert!(!pid_alive(pid), "the old mariadbd survived");
    assert_ne!(server.pid(), Some(pid));
    assert_eq!(server.sql("select v from t").await?, "42");
    let mut conn = MySqlConnection::connect(&server.proxied_url()).await?;
    let v: i32 = sqlx::query_scalar("SELECT v FROM t")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(v, 42);
    drop(conn);
    drop(server);
    assert!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}

/// Between the kill and the start of a restart any process may bind the server's port: the
/// restart then moves the server to a fresh port (`--port N` rewritten), and its proxy
/// follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_moves_when_its_port_is_taken() -> TestResult {
    let server = MariaDb::start().await?;
    server
        .sql("create table t (v int); insert into t values (7)")
        .await?;
    let old = server.addr();
    server.kill().await?;
    let squatter = std::net::TcpListener::bind(old)?;
    server.restart().await?;
    assert_ne!(server.addr(), old, "moved off the taken port");
    assert_eq!(squatter.local_addr()?, old);
    assert_eq!(server.sql("select v from t").await?, "7", "same data dir");
    assert_eq!(server.proxy().target(), server.addr(), "the proxy follows");
    let mut conn = MySqlConnection::connect(&server.proxied_url()).await?;
    assert_eq!(select_one(&mut conn).await?, 1);
    let log = std::fs::read_to_string(server.log_path())?;
    assert!(
        log.contains("Address already in use"),
        "the fault fired:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_stops_answering() -> TestResult {
    let server = MariaDb::start().await?;
    let mut conn = MySqlConnection::connect(&server.url()).await?;
    Node::pause(&server)?;
    assert_eq!(Node::state(&server), Some('T'));
    assert!(server.is_paused());
    let frozen = tokio::time::timeout(Duration::from_millis(500), select_one(&mut conn)).await;
    assert!(frozen.is_err(), "a paused server answered: {frozen:?}");
    let probe = tokio::time::timeout(Duration::from_millis(300), Node::probe(&server)).await;
    assert!(
        !matches!(probe, Ok(Ok(()))),
        "a paused server passed its probe"
    );
    Node::resume(&server)?;
    assert_ne!(Node::state(&server), Some('T'));
    Node::probe(&server).await?;
    // A fresh connection: the cut-off query left the old one mid-protocol.
    let mut conn = MySqlConnection::connect(&server.url()).await?;
    assert_eq!(select_one(&mut conn).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_server_takes_tls_with_a_certificate_and_a_password() -> TestResult {
    let server = MariaDb::start_secured().await?;
    let secrets = server.secrets().expect("secured").clone();
    let hosts = server.addr().to_string();
    let url = secrets.url(&hosts);
    assert!(url.starts_with(&format!(
        "mysql://tenure:{}@{hosts}/tenure?",
        secrets.password
    )));

    // Without a privilege on database `tenure` (none yet), only the database is refused.
    let denied = MySqlConnection::connect(&url)
        .await
        .unwrap_err()
        .to_string();
    assert!(denied.contains("to database 'tenure'"), "{denied}");
    server.sql("GRANT SELECT ON tenure.* TO tenure").await?;
    let mut conn = MySqlConnection::connect(&url).await?;
    let (user, cipher): (String, String) = sqlx::query_as(
        "SELECT CURRENT_USER(), VARIABLE_VALUE FROM information_schema.SESSION_STATUS \
         WHERE VARIABLE_NAME = 'Ssl_cipher'",
    )
    .fetch_one(&mut conn)
    .await?;
    assert_eq!(user, "tenure@%");
    assert!(!cipher.is_empty(), "not over TLS");
    conn.close().await?;
    // Through the proxy too (the certificate names 127.0.0.1).
    let proxied = secrets.url(&server.proxied_addr().to_string());
    MySqlConnection::connect(&proxied).await?.close().await?;

    let refused = |url: String| async move {
        let options = MySqlConnectOptions::from_str(&url)?;
        match options.connect().await {
            Ok(_) => Err(format!("{url} connected").into()),
            Err(e) => Ok::<String, Box<dyn std::error::Error>>(e.to_string()),
        }
    };
    let base = format!("mysql://tenure:{}@{hosts}/tenure", secrets.password);
    // Refused as its certificate is missing (REQUIRE X509 is checked first).
    let plain = refused(format!("{base}?ssl-mode=DISABLED")).await?;
    assert!(plain.contains("Access denied"), "{plain}");
    // A user who needs no certificate is refused plaintext too, TCP requiring TLS
    // (MariaDB says only "Access denied"), and logs in over TLS.
    server
        .sql("CREATE USER 'plain'@'%' IDENTIFIED BY 'pw'")
        .await?;
    let plain = format!("mysql://plain:pw@{hosts}");
    let refusal = refused(format!("{plain}?ssl-mode=DISABLED")).await?;
    assert!(refusal.contains("Access denied"), "{refusal}");
    MySqlConnection::connect(&format!("{plain}?ssl-mode=REQUIRED"))
        .await?
        .close()
        .await?;
    let ca = secrets.pki.ca();
    let no_cert = refused(format!(
        "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        ca.display()
    ))
    .await?;
    assert!(no_cert.contains("Access denied"), "{no_cert}");
    let stranger = url.replacen(&format!("tenure:{}", secrets.password), "stranger:wrong", 1);
    let wrong = refused(stranger).await?;
    assert!(wrong.contains("Access denied"), "{wrong}");
    let root = refused(format!(
        "mysql://root@{hosts}/tenure?{}",
        secrets.ssl_options()
    ))
    .await?;
    assert!(root.contains("Access denied"), "{root}");
    let (_other, unrelated) = tenure_conformance::servers::tls::TestPki::unrelated()?;
    refused(format!(
        "{base}?{}",
        secrets.ssl_options_trusting(&unrelated.ca())
    ))
    .await?;

    // The stranger logs in with its password, and may do nothing.
    let stranger = url.replacen(
        &format!("tenure:{}", secrets.password),
        &format!("stranger:{}", secrets.stranger_password),
        1,
    );
    let denied = refused(stranger).await?;
    assert!(denied.contains("to database 'tenure'"), "{denied}");
    assert_eq!(server.sql("select 1").await?, "1", "root on the socket");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_shim_moves_now() -> TestResult {
    let plain = MariaDb::start().await?;
    assert!(
        matches!(
            plain.set_clock_offset(1000),
            Err(ServerError::Unsupported { .. })
        ),
        "a server without the shim took an offset"
    );
    drop(plain);
    let server = MariaDb::start_with(MariaDbOptions {
        clock_shim: true,
        ..MariaDbOptions::default()
    })
    .await?;
    let skew = || async {
        let ms: i64 = server
            .sql("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")
            .await?
            .parse()?;
        let here = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        Ok::<i64, Box<dyn std::error::Error>>(ms - i64::try_from(here.as_millis())?)
    };
    let before = skew().await?;
    assert!(before.abs() < 5_000, "unshifted: {before} ms");
    server.set_clock_offset(60_000)?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let shifted = skew().await?;
    assert!(
        (55_000..65_000).contains(&shifted),
        "shifted by {shifted} ms, not a minute"
    );
    assert_eq!(
        server.clock_applied(),
        Some((60_000, server.pid().expect("running")))
    );
    server.set_clock_offset(0)?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let undone = skew().await?;
    assert!(undone.abs() < 5_000, "undone: {undone} ms");
    Ok(())
}
