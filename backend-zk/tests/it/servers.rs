//! The launcher (`tenure_zk::lab::ZkEnsemble`) on live servers: a standalone server and a
//! three-server ensemble answer, know their modes, and elect a new leader after a kill.

use std::time::Instant;

use tenure_conformance::servers::ServerError;
use tenure_zk::lab::{ZkEnsemble, ZkOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_answers_and_leads() -> Result<(), ServerError> {
    let zk = ZkEnsemble::start(ZkOptions::default()).await?;
    let n = &zk.nodes()[0];
    assert_eq!(n.four_letter("ruok").await?, "imok");
    assert_eq!(n.mode().await?.as_deref(), Some("standalone"));
    assert_eq!(zk.leader_index().await?, 0);
    assert_eq!(zk.connect_string(), n.addr().to_string());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_elect_a_new_leader_after_a_kill() -> Result<(), ServerError> {
    let zk = ZkEnsemble::start(ZkOptions::default().nodes(3).tick_time_ms(200)).await?;
    assert_eq!(zk.connect_string().split(',').count(), 3);
    assert_eq!(zk.proxied_connect_string().split(',').count(), 3);
    let mut modes = Vec::new();
    for n in zk.nodes() {
        assert_eq!(n.four_letter("ruok").await?, "imok");
        modes.push(n.mode().await?);
    }
    let old = zk.leader_index().await?;
    assert_eq!(modes[old].as_deref(), Some("leader"));
    assert_eq!(
        modes
            .iter()
            .filter(|m| m.as_deref() == Some("follower"))
            .count(),
        2,
        "{modes:?}"
    );

    zk.nodes()[old].kill().await?;
    let t = Instant::now();
    let new = zk.leader_index().await?;
    eprintln!("zk: new leader after {} ms", t.elapsed().as_millis());
    assert_ne!(new, old);
    Ok(())
}
