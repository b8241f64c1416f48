//! `tenure doctor` and `tenure inspect --prefix` against live servers: each backend gets a
//! healthy held lock (which must not be reported) and a planted leak of the kind its
//! doctor looks for — made the way a faulty client would make it — which must be.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tenure::{DistributedLock, LockKey, OwnerId};
use tenure_etcd::lab::EtcdCluster;
use tenure_postgres::lab::Postgres;
use tenure_redis::lab::{RedisCluster, RedisOptions};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};

const TTL: Duration = Duration::from_secs(30);

/// Runs `tenure --url URL ARGS…`: its exit code and its stdout's JSON lines.
fn tenure(url: &str, args: &[&str]) -> (Option<i32>, Vec<Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect();
    if !matches!(out.status.code(), Some(0 | 1)) {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.code(), lines)
}

/// `tenure doctor` exits 0 and prints nothing.
fn assert_clean(url: &str) {
    let (code, findings) = tenure(url, &["doctor"]);
    assert_eq!((code, findings), (Some(0), vec![]), "{url}");
}

/// `tenure doctor` exits 1 with exactly one finding, for `key`, of kind `problem`.
fn assert_one_finding(url: &str, key: &str, problem: &str) -> Value {
    let (code, findings) = tenure(url, &["doctor"]);
    assert_eq!(code, Some(1), "{url}: {findings:?}");
    assert_eq!(findings.len(), 1, "{url}: {findings:?}");
    assert_eq!(findings[0]["key"], key, "{findings:?}");
    assert_eq!(findings[0]["problem"], problem, "{findings:?}");
    findings[0].clone()
}

/// `tenure inspect --prefix PREFIX`: the keys listed, in order, with their lines.
fn listed(url: &str, prefix: &str) -> (Vec<String>, Vec<Value>) {
    let (code, lines) = tenure(url, &["inspect", "--prefix", prefix]);
    assert_eq!(code, Some(0), "{url}");
    let keys = lines
        .iter()
        .map(|l| l["key"].as_str().unwrap_or_default().to_string())
        .collect();
    (keys, lines)
}

async fn hold(lock: &dyn DistributedLock, key: &str) -> tenure::Lease {
    lock.try_acquire(&LockKey::new(key).unwrap(), TTL)
        .await
        .unwrap()
        .expect("free")
}

async fn is_blocked(lock: &dyn DistributedLock, key: &str) -> bool {
    let key = LockKey::new(key).unwrap();
    lock.try_acquire(&key, TTL).await.unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_redlock_find_a_lock_key_without_ttl() {
    let cluster = RedisCluster::start(RedisOptions::default().nodes(3))
        .await
        .unwrap();
    let redis = cluster.urls()[0].clone();
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    let redlock = format!("redlock://{}", hosts.join(","));
    assert_clean(&redis);
    assert_clean(&redlock);

    // Healthy locks (each with its TTL-less fence counter) are not findings.
    let single = tenure::connect(&redis).await.unwrap();
    let quorum = tenure::connect(&redlock).await.unwrap();
    let healthy = hold(single.as_ref(), "jobs/healthy").await;
    hold(quorum.as_ref(), "jobs/quorum").await;
    assert_clean(&redis);
    assert_clean(&redlock);

    // What a `SETNX` without `EXPIRE` leaves behind on node 0: it blocks the key for good.
    let stuck = format!("{}:7", OwnerId::random());
    cluster.nodes()[0]
        .command(&["SET", "{tenure:jobs/stuck}", &stuck])
        .await
        .unwrap();
    assert!(is_blocked(single.as_ref(), "jobs/stuck").await);
    let finding = assert_one_finding(&redis, "jobs/stuck", "no_expiry");
    assert!(
        finding["location"].as_str().unwrap().contains(&hosts[0]),
        "{finding}"
    );
    let finding = assert_one_finding(&redlock, "jobs/stuck", "no_expiry");
    assert!(
        finding["location"].as_str().unwrap().contains(&hosts[0]),
        "the node is named: {finding}"
    );

    // Node 0 alone holds all three; Redlock reports only what a majority agrees on.
    let (keys, lines) = listed(&redis, "jobs/");
    assert_eq!(keys, ["jobs/healthy", "jobs/quorum", "jobs/stuck"]);
    assert_eq!(lines[0]["owner"], healthy.owner().to_string());
    assert_eq!(lines[0]["token"], healthy.token().get());
    assert!(
        lines[0]["remaining_ms"].as_u64().unwrap() > 20_000,
        "{lines:?}"
    );
    assert!(lines[2]["remaining_ms"].is_null(), "no TTL: {lines:?}");
    assert_eq!(listed(&redlock, "jobs/").0, ["jobs/quorum"]);
    assert_eq!(listed(&redis, "jobs/q").0, ["jobs/quorum"]);
    assert!(listed(&redis, "nothing/").0.is_empty());

    cluster.nodes()[0]
        .command(&["DEL", "{tenure:jobs/stuck}"])
        .await
        .unwrap();
    assert_clean(&redis);
    assert_clean(&redlock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_finds_a_holder_idle_in_transaction_past_its_ttl() {
    use sqlx::{Connection, Executor, PgConnection};
    let server = Postgres::start().await.unwrap();
    let url = server.url();
    let lock = tenure::connect(&url).await.unwrap(); // creates the tables
    assert_clean(&url);
    let healthy = hold(lock.as_ref(), "jobs/healthy").await;

    // A holder that took the row lock the way tenure does and recorded a 5 s ttl, but
    // whose session has no idle-in-transaction timeout (a pooler dropped the setting, a
    // hand-written client): the server will never free it.
    let mut stale = PgConnection::connect(&url).await.unwrap();
    stale
        .execute(
            "SET idle_in_transaction_session_timeout = 0; \
             INSERT INTO tenure_locks (key) VALUES ('jobs/stuck') ON CONFLICT DO NOTHING",
        )
        .await
        .unwrap();
    stale.execute("BEGIN").await.unwrap();
    let (xid, pid): (String, i32) = sqlx::query_as(
        "SELECT pg_current_xact_id()::text, pg_backend_pid() FROM tenure_locks \
         WHERE key = 'jobs/stuck' FOR UPDATE NOWAIT",
    )
    .fetch_one(&mut stale)
    .await
    .unwrap();
    // Idle in its transaction from (at the latest) here.
    let idle_since = Instant::now();
    let mut recorder = PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO tenure_locks_holders (key, owner, token, xid, pid, ttl_ms, granted_at) \
         VALUES ('jobs/stuck', $1, nextval('tenure_locks_fence'), $2::text::xid8, $3, 5000, \
         clock_timestamp())",
    )
    .bind(OwnerId::random().to_string())
    .bind(&xid)
    .bind(pid)
    .execute(&mut recorder)
    .await
    .unwrap();
    assert!(is_blocked(lock.as_ref(), "jobs/stuck").await);

    // Within its ttl plus the 1 s grace it is not stale yet (the ttl leaves the checks
    // before this one ample time on a loaded machine); after, it is. The healthy holder
    // is idle in its transaction just as long, well within its 30 s ttl.
    assert_clean(&url);
    tokio::time::sleep_until((idle_since + Duration::from_millis(6_500)).into()).await;
    let finding = assert_one_finding(&url, "jobs/stuck", "stale");
    assert!(
        finding["location"]
            .as_str()
            .unwrap()
            .contains(&pid.to_string()),
        "{finding}"
    );

    let (keys, lines) = listed(&url, "jobs/");
    assert_eq!(keys, ["jobs/healthy", "jobs/stuck"]);
    assert_eq!(lines[0]["owner"], healthy.owner().to_string());
    assert_eq!(lines[0]["token"], healthy.token().get());
    assert_eq!(lines[1]["remaining_ms"], 0, "past its ttl: {lines:?}");

    // Ending the session frees the lock and clears the finding.
    stale.close().await.unwrap();
    assert_clean(&url);
    assert_eq!(listed(&url, "jobs/").0, ["jobs/healthy"]);
    lock.release(healthy).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_finds_a_lock_key_without_a_lease() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let addr = cluster.members()[0].addr().to_string();
    let url = format!("etcd://{addr}");
    let lock = tenure::connect(&url).await.unwrap();
    let healthy = hold(lock.as_ref(), "jobs/healthy").await;
    assert_clean(&url);

    // A queue key put without a lease: first in its queue, and nothing will delete it.
    let mut client = etcd_client::Client::connect([addr.as_str()], None)
        .await
        .unwrap();
    client
        .put(
            "tenure/jobs%2Fstuck/00000000000000ff",
            OwnerId::random().to_string(),
            None,
        )
        .await
        .unwrap();
    assert!(is_blocked(lock.as_ref(), "jobs/stuck").await);
    assert_one_finding(&url, "jobs/stuck", "no_expiry");

    let (keys, lines) = listed(&url, "jobs/");
    assert_eq!(keys, ["jobs/healthy", "jobs/stuck"]);
    assert_eq!(lines[0]["token"], healthy.token().get());
    assert!(
        lines[0]["remaining_ms"].as_u64().unwrap() > 20_000,
        "{lines:?}"
    );
    assert!(lines[1]["remaining_ms"].is_null(), "no lease: {lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_finds_a_lock_node_that_is_not_ephemeral() {
    use zookeeper_client::{Acls, Client, CreateMode};
    let ensemble = ZkEnsemble::start(ZkOptions::default()).await.unwrap();
    let url = format!("zk://{}", ensemble.connect_string());
    let lock = tenure::connect(&url).await.unwrap(); // its session holds the healthy lock
    let healthy = hold(lock.as_ref(), "jobs/healthy").await;
    assert_clean(&url);

    let client = Client::connect(&ensemble.connect_string()).await.unwrap();
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client
        .create("/tenure/jobs%2Fstuck", &[], &persistent)
        .await
        .unwrap();
    let node = format!("/tenure/jobs%2Fstuck/lock-{}-0000000000", OwnerId::random());
    client.create(&node, &[], &persistent).await.unwrap();
    drop(client); // its session ends; the persistent node stays
    assert!(is_blocked(lock.as_ref(), "jobs/stuck").await);
    let finding = assert_one_finding(&url, "jobs/stuck", "no_expiry");
    assert!(
        finding["location"].as_str().unwrap().ends_with(&node),
        "{finding}"
    );

    let (keys, lines) = listed(&url, "jobs/");
    assert_eq!(keys, ["jobs/healthy", "jobs/stuck"]);
    assert_eq!(lines[0]["owner"], healthy.owner().to_string());
    assert_eq!(lines[0]["token"], healthy.token().get());
}
