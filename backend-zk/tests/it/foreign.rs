//! Another recipe's contenders in a key's directory — a kazoo or Curator client given
//! the lock's path: tenure queues behind them, never beside them.

use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockKey, OwnerId};
use tenure_zk::lab::{ZkEnsemble, ZkOptions};
use tenure_zk::ZkLock;
use zookeeper_client::{Acls, CreateMode, Error as ZkError};

const TTL: Duration = Duration::from_secs(10);

/// A node as kazoo's `Lock` names it (`<uuid hex>__lock__<sequence>`), and as Curator's
/// `InterProcessMutex` does in protected mode (`_c_<uuid>-lock-<sequence>`), holds the
/// key: tenure refuses, shows the foreign holder, and grants a waiter once it is gone.
/// Before, tenure ignored both and granted the lock beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_or_curator_holder_is_waited_for_never_shared() {
    let zk = ZkEnsemble::start(ZkOptions::default()).await.unwrap();
    let hosts = zk.connect_string();
    let lock = ZkLock::connect(&format!("zk://{hosts}/interop"))
        .await
        .unwrap();
    let other = zookeeper_client::Client::connect(&hosts).await.unwrap();
    let uuid = OwnerId::parse("3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
    for (recipe, prefix) in [
        ("kazoo", "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b__lock__"),
        ("curator", "_c_3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b-lock-"),
    ] {
        let k = LockKey::new(format!("job-{recipe}")).unwrap();
        let dir = lock.lock_dir(&k);
        // The key's directory, as the other client makes it (every missing parent).
        let mut path = String::new();
        for component in dir.split('/').skip(1) {
            path = format!("{path}/{component}");
            let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
            match other.create(&path, &[], &persistent).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => panic!("create {path}: {e}"),
            }
        }
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (_, sequence) = other
            .create(&format!("{dir}/{prefix}"), b"worker-7", &options)
            .await
            .unwrap();
        let node = format!("{dir}/{prefix}{sequence}");
        assert!(
            lock.try_acquire(&k, TTL).await.unwrap().is_none(),
            "{recipe} holds {node}: not granted beside it"
        );
        let holder = lock.inspect(&k).await.unwrap().expect("a holder");
        assert_eq!(
            holder.owner, uuid,
            "{recipe}: the UUID its node name carries"
        );
        assert_eq!(holder.label.as_deref(), Some("worker-7"), "{recipe}");
        let waiter = tokio::spawn({
            let (lock, k) = (lock.clone(), k.clone());
            async move {
                let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(30));
                lock.acquire(&k, &opts).await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "{recipe} still holds");
        other.delete(&node, None).await.unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("granted once the foreign holder let go")
            .unwrap()
            .unwrap();
        lock.release(lease).await.unwrap();
    }
}
