//! What the server is asked. A grant right after its node's create needs no `sync`: the
//! create went through the leader. Renewing many leases of one session: each renewal
//! proves the session alive through the leader, but the proof that its node still exists
//! is a watch set once, not a read per renewal; renewals that overlap share one `sync`.

use std::time::Duration;

use tenure_api::{DistributedLock, LockError, LockKey};
use tenure_conformance::proxy::{FaultProxy, ProxyMode};
use tenure_zk::lab::{ZkEnsemble, ZkNode, ZkOptions};
use tenure_zk::ZkLock;

const TICK_MS: u32 = 200;
const TTL: Duration = Duration::from_secs(10);

async fn standalone() -> ZkEnsemble {
    ZkEnsemble::start(ZkOptions::default().tick_time_ms(TICK_MS))
        .await
        .unwrap()
}

async fn connect(hosts: &str) -> ZkLock {
    ZkLock::connect(&format!(
        "zk://{hosts}/requests?session_timeout_ms=4000&op_timeout_ms=1000&tick_ms={TICK_MS}"
    ))
    .await
    .unwrap()
}

fn key(i: usize) -> LockKey {
    LockKey::new(format!("renewals/{i}")).unwrap()
}

/// The number after `label` in the server's answer to the four-letter word `word`.
async fn four_letter_count(node: &ZkNode, word: &str, label: &str) -> u64 {
    let answer = node.four_letter(word).await.unwrap();
    answer
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {label} in {word}:\n{answer}"))
}

/// Requests the server has received from clients (`mntr`'s `zk_packets_received`).
async fn packets_received(node: &ZkNode) -> u64 {
    four_letter_count(node, "mntr", "zk_packets_received").await
}

/// An uncontended try-acquire and release on a key whose directory exists: the create,
/// the listing that finds the node first, the delete. Before, a `sync` came between the
/// create and the listing, although the create itself had just gone through the leader.
#[tokio::test]
async fn an_uncontended_cycle_is_three_requests() {
    let _serial = crate::SERIAL.lock().await;
    let zk = standalone().await;
    let lock = connect(&zk.connect_string()).await;
    let node = &zk.nodes()[0];
    const CYCLES: u64 = 20;
    // The key's directory exists from the first cycle on (a container outlives its last
    // node by the server's container check interval, a minute by default).
    let lease = lock.try_acquire(&key(0), TTL).await.unwrap().unwrap();
    lock.release(lease).await.unwrap();
    let before = packets_received(node).await;
    let started = std::time::Instant::now();
    for _ in 0..CYCLES {
        let lease = lock
            .try_acquire(&key(0), TTL)
            .await
            .unwrap()
            .expect("free key");
        lock.release(lease).await.unwrap();
    }
    let requests = packets_received(node).await - before;
    // The session's own traffic comes on top, by time, not by cycle: a background `sync`
    // every quarter session timeout (1 s) and a ping when idle for a third of it. The
    // cycles take some 70 ms here (200 ms on a loaded machine); allow for slower.
    let background = 2 * (started.elapsed().as_secs() + 1) + 1;
    assert!(
        requests <= 3 * CYCLES + background,
        "{CYCLES} cycles cost {requests} requests to the server (3 each would be {})",
        3 * CYCLES
    );
}

/// 100 leases of one session renewed three times over, each round all at once (as the
/// guards of leases taken together renew together). Before, each renewal was a `sync` and
/// a read of the lease's node: 600 requests. Now the node is watched from its first
/// renewal on, and overlapping renewals share a `sync`.
#[tokio::test]
async fn renewing_many_leases_does_not_read_each_node() {
    let _serial = crate::SERIAL.lock().await;
    let zk = standalone().await;
    let lock = connect(&zk.connect_string()).await;
    const LEASES: usize = 100;
    const ROUNDS: usize = 3;
    let mut leases = Vec::new();
    for i in 0..LEASES {
        leases.push(
            lock.try_acquire(&key(i), TTL)
                .await
                .unwrap()
                .expect("free key"),
        );
    }
    // The first renewal of each lease reads its node and sets the watch.
    futures::future::try_join_all(leases.iter_mut().map(|l| lock.extend(l, TTL)))
        .await
        .unwrap();
    let node = &zk.nodes()[0];
    let before = packets_received(node).await;
    for _ in 0..ROUNDS {
        futures::future::try_join_all(leases.iter_mut().map(|l| lock.extend(l, TTL)))
            .await
            .unwrap();
    }
    let requests = packets_received(node).await - before;
    let renewals = (LEASES * ROUNDS) as u64;
    assert!(
        requests <= renewals / 4,
        "{renewals} renewals cost {requests} requests to the server (a read per renewal \
         would be {renewals}, and a sync each as many again)"
    );
    for lease in leases {
        lock.release(lease).await.unwrap();
    }
}

/// A watched node deleted behind the holder's back (an operator, another session) is
/// noticed by the next renewal: the renewal's `sync` is answered only after the
/// deletion's notification.
#[tokio::test]
async fn a_watched_node_deleted_by_another_session_is_lost_at_the_next_renewal() {
    let _serial = crate::SERIAL.lock().await;
    let zk = standalone().await;
    let lock = connect(&zk.connect_string()).await;
    let mut lease = lock.try_acquire(&key(0), TTL).await.unwrap().unwrap();
    lock.extend(&mut lease, TTL).await.unwrap(); // sets the watch
    lock.extend(&mut lease, TTL).await.unwrap(); // renewed by the watch alone
    let operator = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let path = lease.handle().path.clone();
    operator.delete(&path, None).await.unwrap();
    match lock.extend(&mut lease, TTL).await {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("renewal after its node was deleted: {other:?}"),
    }
}

/// The same while the holder is disconnected: on reconnecting, the client re-sets its
/// watches before anything else, and the server reports the deletion it missed.
#[tokio::test]
async fn a_node_deleted_while_the_holder_was_disconnected_is_lost_at_the_next_renewal() {
    let _serial = crate::SERIAL.lock().await;
    let zk = standalone().await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let lock = connect(&proxy.addr().to_string()).await;
    let mut lease = lock.try_acquire(&key(0), TTL).await.unwrap().unwrap();
    lock.extend(&mut lease, TTL).await.unwrap(); // sets the watch
    let session = lock.session_id();
    proxy.set_mode(ProxyMode::Reset);
    let operator = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    operator.delete(&lease.handle().path, None).await.unwrap();
    // Within the session timeout (4 s): the session survives the cut.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::Pass);
    assert!(
        proxy.stats().resets > 0,
        "the cut did not touch the holder's connection"
    );
    let outcome = loop {
        match lock.extend(&mut lease, TTL).await {
            Err(LockError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    assert_eq!(
        lock.session_id(),
        session,
        "the session did not survive the cut: this tests a reconnection within it"
    );
    match outcome {
        Err(LockError::LeaseLost { .. }) => {}
        other => panic!("renewal after its node was deleted during a disconnect: {other:?}"),
    }
}

/// A waiter woken by its predecessor's deletion sends the queue's listing right behind
/// its `sync`, not after the `sync`'s reply: ZooKeeper serves a session's requests in
/// order (a read behind a `sync` sees at least the state the `sync` brought), so the
/// listing proves the same and the hand-off takes one round trip less. The waiter's proxy
/// holds every reply back for `DELAY`: the deletion's notification, then the replies to
/// the `sync` and the listing — two delays before the grant, where waiting for the
/// `sync`'s reply before listing took three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_lists_the_queue_without_waiting_for_its_sync() {
    const DELAY: Duration = Duration::from_secs(3);
    let _serial = crate::SERIAL.lock().await;
    // Long sessions (a server allows up to 20 ticks): delayed replies must not look like
    // a dead link.
    let zk = ZkEnsemble::start(ZkOptions::default().tick_time_ms(1000))
        .await
        .unwrap();
    let connect = |hosts: String| async move {
        let options = "session_timeout_ms=20000&op_timeout_ms=15000&tick_ms=1000";
        ZkLock::connect(&format!("zk://{hosts}/requests?{options}"))
            .await
            .unwrap()
    };
    let holder = connect(zk.connect_string()).await;
    let proxy = FaultProxy::start(zk.nodes()[0].addr()).await.unwrap();
    let waiter = connect(proxy.addr().to_string()).await;
    let k = key(0);
    let held = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free key");
    let waiting = tokio::spawn(async move {
        let opts = tenure_api::AcquireOptions::new(TTL).wait(Duration::from_secs(60));
        let lease = waiter.acquire(&k, &opts).await;
        (lease, std::time::Instant::now(), waiter)
    });
    // Queued behind the holder and watching it (the count below holds either way: a
    // waiter still on its way lists again once its watch finds the holder gone).
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_mode(ProxyMode::Delay {
        up: Duration::ZERO,
        down: DELAY,
    });
    let released = std::time::Instant::now();
    holder.release(held).await.unwrap();
    let (lease, granted, waiter) = waiting.await.unwrap();
    let lease = lease.expect("granted once the holder released");
    let took = granted - released;
    eprintln!("hand-off through a proxy delaying replies by {DELAY:?}: {took:?}");
    assert!(
        took >= DELAY * 2 - Duration::from_millis(100),
        "the fault fired: the notification and the listing were both held back ({took:?})"
    );
    assert!(
        took < DELAY * 5 / 2,
        "the hand-off took {took:?}: three delayed replies, so the listing waited for \
         the sync's reply"
    );
    waiter.release(lease).await.unwrap();
}

/// Watches the server holds (`wchs`'s "Total watches").
async fn watches(node: &ZkNode) -> u64 {
    four_letter_count(node, "wchs", "Total watches:").await
}

/// A waiter woken right after it queued lists the queue without a `sync`: its create,
/// within a tenth of the lease's length, still stands for one (see `Queue::position`). A
/// hand-off is then the holder's delete, the notification and one listing; before, the
/// listing went out behind a `sync` each time, which waits behind the server's writes.
/// Each round: the holder takes the key (create, listing), the waiter queues (create,
/// listing, watch on the holder's node), the holder releases (delete), the waiter is
/// woken and lists (one request; two with a `sync`), and releases (delete): 8 requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_woken_soon_after_queueing_lists_without_a_sync() {
    let _serial = crate::SERIAL.lock().await;
    let zk = ZkEnsemble::start(ZkOptions::default().tick_time_ms(1000))
        .await
        .unwrap();
    let node = &zk.nodes()[0];
    // A 20 s session and a 10 s TTL: a proof stands for a `sync` for 1 s, and the
    // wake-up below comes a few milliseconds after the waiter's create.
    let options = "session_timeout_ms=20000&op_timeout_ms=5000&tick_ms=1000";
    let connect = |hosts: String| async move {
        ZkLock::connect(&format!("zk://{hosts}/requests?{options}"))
            .await
            .unwrap()
    };
    let holder = connect(zk.connect_string()).await;
    let waiter = std::sync::Arc::new(connect(zk.connect_string()).await);
    let k = key(0);
    // The key's directory exists from the first round on.
    let lease = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    holder.release(lease).await.unwrap();
    const ROUNDS: u64 = 30;
    let before = packets_received(node).await;
    let started = std::time::Instant::now();
    let mut polls = 0;
    for _ in 0..ROUNDS {
        let held = holder
            .try_acquire(&k, TTL)
            .await
            .unwrap()
            .expect("free key");
        let waiting = tokio::spawn({
            let (waiter, k) = (waiter.clone(), k.clone());
            async move {
                let opts = tenure_api::AcquireOptions::new(TTL).wait(Duration::from_secs(30));
                waiter.acquire(&k, &opts).await
            }
        });
        // The waiter is queued and watches the holder's node. The server counts each
        // four-letter word as one packet received: those are taken off below.
        polls += 1;
        while watches(node).await == 0 {
            assert!(
                !waiting.is_finished(),
                "the waiter returned before it queued"
            );
            polls += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        holder.release(held).await.unwrap();
        let lease = waiting
            .await
            .unwrap()
            .expect("granted once the holder released");
        waiter.release(lease).await.unwrap();
    }
    let requests = packets_received(node).await - before - polls;
    eprintln!("{ROUNDS} hand-offs: {requests} requests");
    // Each session's own traffic on top, by time (a `sync` every 5 s, a ping when idle
    // for a third of the session timeout), and a waiter that a loaded machine wakes
    // later than 1 s after its create sends its `sync` after all: allowed in a sixth of
    // the rounds.
    let background = 2 * (2 * started.elapsed().as_secs() / 5 + 1);
    let expected = 8 * ROUNDS;
    assert!(
        requests <= expected + ROUNDS / 6 + background,
        "{ROUNDS} hand-offs cost {requests} requests to the server ({expected} without \
         a `sync` per wake-up, {} with one)",
        9 * ROUNDS
    );
    // The fault that matters fired in each round: the waiter was queued behind the
    // holder (its watch set) when the holder let go, so each grant was a wake-up.
    assert!(
        requests >= expected,
        "{requests} requests: some rounds had no wake-up"
    );
}
