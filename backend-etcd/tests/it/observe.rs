//! Observing an election follows the key's queue with a watch: every leader and every
//! vacancy is seen, in order, however briefly each lasted.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use tenure_api::{DistributedLock, Election, FencingToken, Leader, LockError, LockKey};
use tenure_etcd::lab::EtcdCluster;
use tenure_etcd::EtcdLock;

type Changes = BoxStream<'static, Result<Option<Leader>, LockError>>;

/// The next change, as (value, term), within 20 s.
async fn next(changes: &mut Changes) -> Option<(String, FencingToken)> {
    let change = tokio::time::timeout(Duration::from_secs(20), changes.next())
        .await
        .expect("a change within 20 s")
        .expect("the observation goes on");
    change.unwrap().map(|leader| (leader.value, leader.term))
}

#[tokio::test]
async fn observers_see_leaders_that_never_waited_to_be_seen() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let url = format!("etcd://{}/observe", cluster.members()[0].addr());
    let (candidates, observer) = (
        EtcdLock::connect(&url).await.unwrap(),
        EtcdLock::connect(&url).await.unwrap(),
    );
    let name = LockKey::new("scheduler").unwrap();
    assert!(
        observer.holder_changes(&name).is_some(),
        "etcd pushes holders"
    );
    let election = Election::new(Arc::new(candidates)).unwrap();
    // An observer that would read only once an hour without the feed.
    let mut changes = Election::new(Arc::new(observer))
        .unwrap()
        .observe(&name, Duration::from_secs(3600));
    assert_eq!(next(&mut changes).await, None, "a fresh name is vacant");
    let mut led = Vec::new();
    for value in ["a", "b", "c"] {
        let leadership = election
            .campaign(&name, value, Duration::from_secs(10))
            .await
            .unwrap();
        led.push((value.to_owned(), leadership.term()));
        leadership.resign().await.unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(next(&mut changes).await);
    }
    let expected: Vec<_> = led.into_iter().flat_map(|l| [Some(l), None]).collect();
    assert_eq!(seen, expected, "each leader, then the vacancy it left");
}
