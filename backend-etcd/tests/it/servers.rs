//! The launcher (`tenure_etcd::lab::EtcdCluster`) on live members: a leader is found,
//! fails over and a restarted member rejoins, plain and secured.

use std::time::{Duration, Instant};

use tenure_conformance::servers::{poll_until, ServerError};
use tenure_etcd::lab::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_leads_itself() -> Result<(), ServerError> {
    let c = EtcdCluster::start(1).await?;
    assert_eq!(c.endpoints().len(), 1);
    assert!(c.endpoints()[0].starts_with("http://127.0.0.1:"));
    assert_eq!(c.leader_index().await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_fail_over_and_a_restarted_member_rejoins() -> Result<(), ServerError> {
    let c = EtcdCluster::start(3).await?;
    assert_eq!(c.proxied_endpoints().len(), 3);
    let old = c.leader_index().await?;
    let killed = &c.members()[old];
    killed.kill().await?;

    let t = Instant::now();
    let new = c.leader_index().await?;
    eprintln!("etcd: new leader after {} ms", t.elapsed().as_millis());
    assert_ne!(new, old);

    // The killed member rejoins: healthy (restart waits for /health) and follows the
    // new leader.
    killed.restart().await?;
    let leader_id = c.members()[new].status().await?.0;
    poll_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            match killed.status().await {
                Ok((_, leader)) if leader == leader_id => Ok(()),
                other => Err(other),
            }
        },
        |status| format!("the restarted member to follow {leader_id} (status: {status:?})"),
    )
    .await
}

/// A secured cluster's client ports need a client certificate: the leader is found by
/// what each member's plain metrics port says, and follows a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_clusters_leader_is_found_through_metrics() -> Result<(), ServerError> {
    let c = EtcdCluster::start_secured(3).await?;
    assert!(
        c.members()[0].status().await.is_err(),
        "no plain client port"
    );
    let old = c.leader_index().await?;
    let says: Vec<bool> =
        futures::future::try_join_all(c.members().iter().map(|m| m.says_leader())).await?;
    assert_eq!(says.iter().filter(|&&l| l).count(), 1, "{says:?}");
    assert!(says[old], "{says:?}");
    c.members()[old].kill().await?;
    let new = c.leader_index().await?;
    assert_ne!(new, old);
    assert!(c.members()[new].says_leader().await?);
    Ok(())
}
