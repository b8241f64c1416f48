//! Observing an election follows the key's directory with a persistent recursive watch:
//! each leader and vacancy is pushed in order, across a new incarnation of the directory
//! and across a disconnection of the observer.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use tenure_api::{DistributedLock, Election, FencingToken, Leader, LockError, LockKey};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};
use tenure_zk::ZkLock;

type Changes = BoxStream<'static, Result<Option<Leader>, LockError>>;

/// An observer that would read only once an hour without a feed.
const NEVER: Duration = Duration::from_secs(3600);
const WAIT: Duration = Duration::from_secs(10);

async fn standalone() -> ZkEnsemble {
    ZkEnsemble::start(ZkOptions::default().tick_time_ms(200))
        .await
        .unwrap()
}

async fn connect(hosts: &str) -> ZkLock {
    ZkLock::connect(&format!(
        "zk://{hosts}/observe?session_timeout_ms=4000&op_timeout_ms=1000&tick_ms=200"
    ))
    .await
    .unwrap()
}

/// The next change, as (value, term), within 20 s; the feed's own errors (a broken watch,
/// reported before it lists afresh) are skipped.
async fn next(changes: &mut Changes) -> Option<(String, FencingToken)> {
    loop {
        let change = tokio::time::timeout(Duration::from_secs(20), changes.next())
            .await
            .expect("a change within 20 s")
            .expect("the observation goes on");
        match change {
            Ok(leader) => return leader.map(|l| (l.value, l.term)),
            Err(e) => eprintln!("observer: {e}"),
        }
    }
}

#[tokio::test]
async fn observers_are_pushed_each_leader_in_order() {
    let zk = standalone().await;
    let hosts = zk.connect_string();
    let (candidates, observer) = (connect(&hosts).await, connect(&hosts).await);
    let name = LockKey::new("scheduler").unwrap();
    assert!(
        observer.holder_changes(&name).is_some(),
        "ZooKeeper pushes holders"
    );
    let dir = candidates.lock_dir(&name);
    let election = Election::new(Arc::new(candidates)).unwrap();
    let mut changes = Election::new(Arc::new(observer))
        .unwrap()
        .observe(&name, NEVER);
    assert_eq!(next(&mut changes).await, None, "a fresh name is vacant");
    let operator = zookeeper_client::Client::connect(&hosts).await.unwrap();
    let mut terms = Vec::new();
    for value in ["a", "b", "c", "d"] {
        if value == "d" {
            // The (empty) directory deleted, as the server's container reaper does: the
            // next one numbers its nodes from 0 again, below the last listing's horizon.
            operator.delete(&dir, None).await.unwrap();
            assert_eq!(operator.check_stat(&dir).await.unwrap(), None);
        }
        let leadership = election.campaign(&name, value, WAIT).await.unwrap();
        let term = leadership.term();
        assert_eq!(
            next(&mut changes).await,
            Some((value.to_owned(), term)),
            "leader {value} pushed"
        );
        leadership.resign().await.unwrap();
        assert_eq!(next(&mut changes).await, None, "{value}'s vacancy pushed");
        terms.push(term);
    }
    assert!(terms.windows(2).all(|t| t[0] < t[1]), "terms {terms:?}");
}

/// A persistent watch's events from a disconnection are not replayed by the server: the
/// feed lists the directory afresh when its session reconnects.
#[tokio::test]
async fn an_observer_disconnected_during_a_change_sees_the_new_leader() {
    let zk = standalone().await;
    let hosts = zk.connect_string();
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let observer = connect(&proxy.addr().to_string()).await;
    let session = observer.session_id();
    let name = LockKey::new("scheduler").unwrap();
    let election = Election::new(Arc::new(connect(&hosts).await)).unwrap();
    let mut changes = Election::new(Arc::new(observer.clone()))
        .unwrap()
        .observe(&name, NEVER);
    let first = election.campaign(&name, "a", WAIT).await.unwrap();
    let mut seen = next(&mut changes).await;
    if seen.is_none() {
        seen = next(&mut changes).await; // the listing came before the campaign
    }
    assert_eq!(seen, Some(("a".to_owned(), first.term())));
    proxy.set_mode(ProxyMode::Reset);
    first.resign().await.unwrap();
    let second = election.campaign(&name, "b", WAIT).await.unwrap();
    // Within the session timeout (4 s): the session survives the cut.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::Pass);
    assert!(
        proxy.stats().resets > 0,
        "the cut did not touch the observer's connection"
    );
    assert_eq!(
        next(&mut changes).await,
        Some(("b".to_owned(), second.term())),
        "the leader chosen while the observer was cut off"
    );
    assert_eq!(
        observer.session_id(),
        session,
        "the session did not survive the cut: this tests a reconnection within it"
    );
    second.resign().await.unwrap();
    assert_eq!(next(&mut changes).await, None, "b's vacancy pushed");
}
