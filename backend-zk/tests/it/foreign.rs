//! Another recipe's contenders in a key's directory — a kazoo or Curator client given
//! the lock's path: tenure queues behind them, never beside them.

use std::time::Duration;

use tenure_api::{AcquireOptions, DistributedLock, LockKey, OwnerId, ReleaseOutcome};
use tenure_conformance::foreign::ForeignClient;
use tenure_zk::lab::{ZkEnsemble, ZkOptions};
use tenure_zk::ZkLock;
use zookeeper_client::{Acls, CreateMode, Error as ZkError};

const TTL: Duration = Duration::from_secs(10);

/// A node as kazoo's `Lock` names it (`<uuid hex>__lock__<sequence>`), and as Curator's
/// `InterProcessMutex` does in protected mode (`_c_<uuid>-lock-<sequence>`), holds the
/// key: tenure refuses, shows the foreign holder, and grants a waiter once it is gone.
/// Before, tenure ignored both and granted the lock beside them. So does a node of a
/// recipe whose names carry no UUID (ZooKeeper's own `lock-<sequence>`), shown as a
/// foreign holder with an owner derived from its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_or_curator_holder_is_waited_for_never_shared() {
    let (_zk, lock, other) = hand_made_lab().await;
    let uuid = OwnerId::parse("3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b").unwrap();
    for (recipe, prefix) in [
        ("kazoo", "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b__lock__"),
        ("curator", "_c_3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b-lock-"),
        ("unnamed", "lock-"),
    ] {
        let k = LockKey::new(format!("job-{recipe}")).unwrap();
        let dir = lock.lock_dir(&k);
        let (node, name) = contender(&other, &dir, prefix).await;
        assert!(
            lock.try_acquire(&k, TTL).await.unwrap().is_none(),
            "{recipe} holds {node}: not granted beside it"
        );
        let holder = lock.inspect(&k).await.unwrap().expect("a holder");
        let (owner, foreign) = match recipe {
            // Named in a layout tenure uses too: told from tenure's by its owner only.
            "kazoo" | "curator" => (uuid, false),
            _ => (OwnerId::derived(name.as_bytes()), true),
        };
        assert_eq!(holder.owner, owner, "{recipe}: the UUID its name carries");
        assert_eq!(holder.foreign, foreign, "{recipe}");
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

/// A server, tenure's client of `/interop`, and a plain client that makes other recipes'
/// nodes by hand ([`contender`]).
async fn hand_made_lab() -> (ZkEnsemble, ZkLock, zookeeper_client::Client) {
    let zk = ZkEnsemble::start(ZkOptions::default()).await.unwrap();
    let hosts = zk.connect_string();
    let lock = ZkLock::connect(&format!("zk://{hosts}/interop"))
        .await
        .unwrap();
    let other = zookeeper_client::Client::connect(&hosts).await.unwrap();
    (zk, lock, other)
}

/// Another recipe's contender in `dir`, as its client makes one: the directory (every
/// missing parent, persistent), then an ephemeral sequential node named `prefix`, its
/// data `worker-7`. Its path, and its name (the prefix and the sequence the server
/// appended).
async fn contender(other: &zookeeper_client::Client, dir: &str, prefix: &str) -> (String, String) {
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
    let name = format!("{prefix}{sequence}");
    (format!("{dir}/{name}"), name)
}

/// The other recipes' session timeout: how long their lock outlives their process.
const RECIPE_SESSION: Duration = Duration::from_secs(5);

/// kazoo's `Lock` on `path` (a lock driver, see `tenure_conformance::foreign`), also
/// treating nodes named with `extra_patterns` as contenders.
async fn kazoo(hosts: &str, path: &str, extra_patterns: &[&str]) -> ForeignClient {
    let session = RECIPE_SESSION.as_millis().to_string();
    let args = [&[hosts, session.as_str(), path], extra_patterns].concat();
    ForeignClient::python_lock("kazoo", &args).await.unwrap()
}

/// Curator's `InterProcessMutex` on `path`.
async fn curator(hosts: &str, path: &str) -> ForeignClient {
    tenure_zk::lab::curator(hosts, RECIPE_SESSION, path)
        .await
        .unwrap()
}

/// Waits until `key`'s queue has `len` nodes.
async fn queued(lock: &ZkLock, k: &LockKey, len: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while lock.queue(k).await.unwrap().len() != len {
        assert!(tokio::time::Instant::now() < deadline, "{len} queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// tenure and `recipe` share `key` as one lock: each refused while the other holds, one
/// FIFO queue across both (the recipe queued before a tenure waiter is served first),
/// each release waking the other side, and the recipe's lock freed for tenure when its
/// process is killed and its session expires.
async fn share_a_lock(lock: &ZkLock, k: &LockKey, mut recipe: ForeignClient) {
    let what = recipe.what().to_string();
    let ours = lock.try_acquire(k, TTL).await.unwrap().expect("a free key");
    let first = ours.token();
    assert!(
        !recipe.acquire(Duration::from_secs(1)).await,
        "{what} granted beside tenure's holder"
    );
    recipe.send("acquire 30000").await;
    queued(lock, k, 2).await;
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            let opts = AcquireOptions::new(TTL).wait(Duration::from_secs(60));
            lock.acquire(&k, &opts).await
        }
    });
    queued(lock, k, 3).await;
    assert_eq!(lock.release(ours).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(recipe.line(Duration::from_secs(30)).await, "acquired");
    assert!(
        lock.try_acquire(k, TTL).await.unwrap().is_none(),
        "tenure granted beside {what}"
    );
    assert!(!waiter.is_finished(), "{what}, queued first, holds");
    recipe.release().await;
    let lease = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap_or_else(|_| panic!("tenure granted once {what} let go"))
        .unwrap()
        .unwrap();
    assert!(
        lease.token() > first,
        "{what}: a later grant, a larger token"
    );
    lock.release(lease).await.unwrap();

    assert!(
        recipe.acquire(Duration::from_secs(10)).await,
        "{what}: free"
    );
    recipe.kill().await;
    assert!(
        lock.try_acquire(k, TTL).await.unwrap().is_none(),
        "{what}'s session outlives its process"
    );
    let opts = AcquireOptions::new(TTL).wait(RECIPE_SESSION * 6);
    let lease = lock.acquire(k, &opts).await.unwrap();
    lock.release(lease).await.unwrap();
}

/// An ensemble that removes emptied containers within a fifth of a second.
async fn ensemble() -> ZkEnsemble {
    let options = ZkOptions {
        container_check_ms: 200,
        ..ZkOptions::default()
    };
    ZkEnsemble::start(options).await.unwrap()
}

/// Waits until the server has removed the node at `path` (an emptied container).
async fn removed(hosts: &str, path: &str) {
    let client = zookeeper_client::Client::connect(hosts).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client.check_stat(path).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{path} removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With its default node names, tenure shares a lock with Curator's `InterProcessMutex`
/// and with kazoo's `Lock` given `extra_lock_patterns=["-lock-"]`, real clients given the
/// key's directory. Before, Curator and kazoo were granted beside tenure's holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_kazoo_share_a_lock_with_tenure() {
    let zk = ensemble().await;
    let hosts = zk.connect_string();
    let lock = ZkLock::connect(&format!("zk://{hosts}/interop"))
        .await
        .unwrap();
    let k = LockKey::new("job-curator").unwrap();
    let curator = curator(&hosts, &lock.lock_dir(&k)).await;
    share_a_lock(&lock, &k, curator).await;
    // A container, as Curator makes it: removed once empty.
    removed(&hosts, &lock.lock_dir(&k)).await;
    let k = LockKey::new("job-kazoo").unwrap();
    let kazoo = kazoo(&hosts, &lock.lock_dir(&k), &["-lock-"]).await;
    share_a_lock(&lock, &k, kazoo).await;
}

/// kazoo on a key directory tenure made (a container, as Curator makes them) takes the
/// lock again after the server removed the emptied directory — its driver makes a `Lock`
/// per use, as docs/interop.md advises. With one `Lock` for the process (the driver
/// before), the second acquire failed with `NoNodeError`: `curator_and_kazoo_share_a_lock_with_tenure`
/// failed that way once in four `./x test` runs, when the removal came between two uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_takes_a_lock_again_after_its_container_directory_is_removed() {
    let zk = ensemble().await;
    let hosts = zk.connect_string();
    let lock = ZkLock::connect(&format!("zk://{hosts}/interop"))
        .await
        .unwrap();
    let k = LockKey::new("job-kazoo-again").unwrap();
    let dir = lock.lock_dir(&k);
    // tenure's holder keeps the directory it made (a container) from being removed
    // until kazoo has queued in it: the server removes an emptied container at any time.
    let lease = lock
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("a free key");
    let mut kazoo = kazoo(&hosts, &dir, &["-lock-"]).await;
    kazoo.send("acquire 30000").await;
    queued(&lock, &k, 2).await;
    lock.release(lease).await.unwrap();
    assert_eq!(kazoo.line(Duration::from_secs(30)).await, "acquired");
    kazoo.release().await;
    removed(&hosts, &dir).await;
    assert!(
        kazoo.acquire(Duration::from_secs(10)).await,
        "kazoo: free again, its directory made anew"
    );
    assert!(
        lock.try_acquire(&k, TTL).await.unwrap().is_none(),
        "tenure granted beside kazoo"
    );
    kazoo.release().await;
}

/// `node_names=kazoo` shares a lock with kazoo's `Lock` as it comes; `prefix=` makes the
/// key's directory the path kazoo is given, `<chroot>/<key>`, persistent as kazoo makes
/// it (a container would be removed once empty, and kazoo's `Lock` then fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_names_share_a_lock_with_kazoo_as_it_comes() {
    let zk = ensemble().await;
    let hosts = zk.connect_string();
    let lock = ZkLock::connect(&format!("zk://{hosts}/interop?prefix=&node_names=kazoo"))
        .await
        .unwrap();
    let k = LockKey::new("job14").unwrap();
    assert_eq!(lock.lock_dir(&k), "/interop/job14");
    let kazoo = kazoo(&hosts, "/interop/job14", &[]).await;
    share_a_lock(&lock, &k, kazoo).await;
    // Emptied before a container the server has since removed, job14's directory stays.
    let curator_named = ZkLock::connect(&format!("zk://{hosts}/interop?prefix="))
        .await
        .unwrap();
    let control = LockKey::new("control").unwrap();
    let lease = curator_named.try_acquire(&control, TTL).await.unwrap();
    curator_named.release(lease.unwrap()).await.unwrap();
    removed(&hosts, "/interop/control").await;
    let client = zookeeper_client::Client::connect(&hosts).await.unwrap();
    let stat = client.check_stat("/interop/job14").await.unwrap();
    assert!(stat.is_some(), "persistent, as kazoo makes it");
}

/// Other recipes' readers' nodes (Curator's `__READ__`, kazoo's `__rlock__`) share a key
/// with tenure's readers and keep tenure's writers out; their writers' nodes (Curator's
/// `__WRIT__`) keep tenure's readers out. A tenure reader's node is named for Curator's
/// mutex to order it (`…-__READ__-lock-<sequence>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_recipes_readers_share_with_tenures_and_their_writers_exclude() {
    let (zk, lock, other) = hand_made_lab().await;
    let once = AcquireOptions::new(TTL).wait(Duration::ZERO);
    for (recipe, prefix, reader) in [
        (
            "curator reader",
            "_c_3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b-__READ__",
            true,
        ),
        (
            "kazoo reader",
            "3f2a9c1e5b7d4e8f9a0b1c2d3e4f5a6b__rlock__",
            true,
        ),
        (
            "curator writer",
            "_c_3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b-__WRIT__",
            false,
        ),
    ] {
        let k = LockKey::new(format!("rw-{}", recipe.replace(' ', "-"))).unwrap();
        let dir = lock.lock_dir(&k);
        let (node, _) = contender(&other, &dir, prefix).await;
        let ours = lock.acquire_shared(&k, &once).await;
        match (reader, ours) {
            (true, Ok(lease)) => {
                assert!(lease.is_shared());
                let name = lease.handle().path.rsplit('/').next().unwrap().to_owned();
                assert!(
                    name.starts_with("_c_") && name.contains("-__READ__"),
                    "{name}"
                );
                assert!(
                    lock.try_acquire(&k, TTL).await.unwrap().is_none(),
                    "{recipe}: a writer got in beside two readers"
                );
                assert_eq!(lock.release(lease).await.unwrap(), ReleaseOutcome::Released);
            }
            (false, Err(tenure_api::LockError::Timeout { .. })) => {}
            (_, other) => panic!("{recipe}: a tenure reader got {other:?}"),
        }
        assert!(
            lock.try_acquire(&k, TTL).await.unwrap().is_none(),
            "{recipe} holds: no tenure writer"
        );
        other.delete(&node, None).await.unwrap();
        let writer = lock
            .try_acquire(&k, TTL)
            .await
            .unwrap()
            .expect("free again");
        lock.release(writer).await.unwrap();
    }
    // Older clients know no readers' nodes: the legacy layout has no readers.
    let legacy = ZkLock::connect(&format!(
        "zk://{}/interop?node_names=legacy",
        zk.connect_string()
    ))
    .await
    .unwrap();
    assert!(!legacy.capabilities().shared);
    let k = LockKey::new("rw-legacy").unwrap();
    match legacy.acquire_shared(&k, &once).await {
        Err(tenure_api::LockError::Config(why)) => assert!(why.contains("legacy"), "{why}"),
        other => panic!("a legacy reader: {other:?}"),
    }
    assert!(
        legacy.inspect(&k).await.unwrap().is_none(),
        "nothing queued"
    );
}

/// A tenure reader keeps the other recipes' exclusive locks out, real clients given the
/// key's directory: Curator's `InterProcessMutex` and kazoo's `Lock` with the `-lock-`
/// pattern (default names), kazoo's `Lock` as it comes (`node_names=kazoo`). Each is
/// granted once the reader lets go. With readers named `…-__READ__<sequence>` (as
/// Curator's read-write lock names its own), Curator's mutex was granted beside one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenure_reader_keeps_curator_and_kazoo_locks_out() {
    let zk = ensemble().await;
    let hosts = zk.connect_string();
    let once = AcquireOptions::new(TTL).wait(Duration::ZERO);
    for (recipe, options) in [
        ("curator", ""),
        ("kazoo", ""),
        ("kazoo", "&node_names=kazoo"),
    ] {
        let lock = ZkLock::connect(&format!("zk://{hosts}/interop?prefix={options}"))
            .await
            .unwrap();
        let k = LockKey::new(format!("read-{recipe}{}", options.len())).unwrap();
        let dir = lock.lock_dir(&k);
        let reader = lock.acquire_shared(&k, &once).await.unwrap();
        let mut theirs = match (recipe, options) {
            ("curator", _) => curator(&hosts, &dir).await,
            (_, "") => kazoo(&hosts, &dir, &["-lock-"]).await,
            _ => kazoo(&hosts, &dir, &[]).await,
        };
        let what = format!("{} ({options})", theirs.what());
        assert!(
            !theirs.acquire(Duration::from_secs(1)).await,
            "{what} granted beside tenure's reader"
        );
        assert_eq!(
            lock.release(reader).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(
            theirs.acquire(Duration::from_secs(20)).await,
            "{what} not granted once tenure's reader let go"
        );
        match lock.acquire_shared(&k, &once).await {
            Err(tenure_api::LockError::Timeout { .. }) => {}
            other => panic!("a tenure reader beside {what}: {other:?}"),
        }
        theirs.release().await;
    }
}
