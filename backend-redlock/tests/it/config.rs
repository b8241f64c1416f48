//! Configurations built by hand (the fields are public) are validated by
//! `Redlock::with_config` exactly as by `RedlockConfig::new`: typed errors, never a panic.
//! No server is needed: valid configurations point at loopback ports nothing listens on.

use std::time::Duration;

use proptest::prelude::*;
use tenure_api::{LockError, MAX_TTL};
use tenure_redis::RedisConfig;
use tenure_redlock::{Redlock, RedlockConfig, MIN_NODE_TIMEOUT};

/// Loopback endpoints where nothing listens (a connect is refused at once), with an
/// identity per distinct node: entries with the same identity are the same node spelled
/// differently.
const POOL: [(&str, usize); 5] = [
    ("redis://127.0.0.1:1", 0),
    ("redis://127.0.0.1:2", 1),
    ("redis://127.0.0.1:3/1?prefix=p:", 2),
    ("redis://127.0.0.1:1/2", 0),
    ("redis://127.0.0.1:3", 2),
];

fn node(url: &str) -> RedisConfig {
    let mut node = RedisConfig::from_url(url).unwrap();
    node.connect_timeout = Duration::from_millis(200);
    node
}

fn literal(nodes: Vec<RedisConfig>, node_timeout: Option<Duration>) -> RedlockConfig {
    RedlockConfig {
        nodes,
        node_timeout,
        fencing: true,
    }
}

async fn with_config(config: RedlockConfig) -> Result<Redlock, LockError> {
    tokio::time::timeout(Duration::from_secs(30), Redlock::with_config(config))
        .await
        .expect("with_config is bounded")
}

#[tokio::test]
async fn with_config_rejects_what_new_rejects() {
    let empty = literal(Vec::new(), None);
    assert!(
        matches!(with_config(empty).await, Err(LockError::Config(_))),
        "no nodes"
    );
    let twice = literal(
        vec![node(POOL[0].0), node(POOL[1].0), node(POOL[3].0)],
        None,
    );
    match with_config(twice).await {
        Err(LockError::Config(msg)) => assert!(msg.contains("more than once"), "{msg}"),
        other => panic!("duplicate node: {other:?}"),
    }
    for bad in [Duration::ZERO, Duration::from_secs(61), Duration::MAX] {
        let config = literal(vec![node(POOL[0].0)], Some(bad));
        assert!(
            matches!(with_config(config).await, Err(LockError::Config(_))),
            "node_timeout {bad:?}"
        );
    }
    let mut slow = node(POOL[0].0);
    slow.connect_timeout = Duration::MAX;
    assert!(
        matches!(
            with_config(literal(vec![slow], None)).await,
            Err(LockError::Config(_))
        ),
        "connect_timeout Duration::MAX"
    );
}

fn node_timeouts() -> impl Strategy<Value = Option<Duration>> {
    prop_oneof![
        Just(None),
        Just(Some(Duration::ZERO)),
        Just(Some(Duration::MAX)),
        Just(Some(Duration::from_secs(60))),
        (0u64..120_000).prop_map(|ms| Some(Duration::from_millis(ms))),
        any::<u64>().prop_map(|ns| Some(Duration::from_nanos(ns))),
    ]
}

fn ttls() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(MAX_TTL),
        Just(Duration::MAX),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_millis),
    ]
}

fn connect_timeouts() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => Just(Duration::from_millis(200)),
        1 => Just(Duration::ZERO),
        1 => Just(Duration::MAX),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn configs_never_panic_and_fail_with_typed_errors(
        picks in proptest::collection::vec(0..POOL.len(), 0..7),
        node_timeout in node_timeouts(),
        connect_timeout in connect_timeouts(),
        ttl in ttls(),
    ) {
        let nodes: Vec<RedisConfig> = picks
            .iter()
            .map(|&i| {
                let mut n = node(POOL[i].0);
                n.connect_timeout = connect_timeout;
                n
            })
            .collect();
        let mut identities: Vec<usize> = picks.iter().map(|&i| POOL[i].1).collect();
        identities.sort_unstable();
        identities.dedup();
        let distinct = !picks.is_empty() && identities.len() == picks.len();
        let timeouts_ok = (Duration::from_millis(1)..=Duration::from_secs(600))
            .contains(&connect_timeout);
        let node_timeout_ok = node_timeout
            .is_none_or(|t| (Duration::from_millis(1)..=Duration::from_secs(60)).contains(&t));
        let valid = distinct && timeouts_ok && node_timeout_ok;

        match RedlockConfig::new(nodes.clone()) {
            Ok(config) => {
                prop_assert!(distinct && timeouts_ok && !config.nodes.is_empty());
                let bound = config.node_timeout_for(ttl);
                prop_assert!((MIN_NODE_TIMEOUT..=Duration::from_secs(60)).contains(&bound));
            }
            Err(LockError::Config(_)) => prop_assert!(!(distinct && timeouts_ok)),
            Err(other) => prop_assert!(false, "new: {other:?}"),
        }

        let config = literal(nodes, node_timeout);
        if valid {
            // Validation passed, so only the per-node bound decides; never a panic.
            let _ = config.node_timeout_for(ttl);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(with_config(config));
        match result {
            Err(LockError::Config(_)) => prop_assert!(!valid, "a valid config was refused"),
            // Nothing listens on the pool's ports.
            Err(LockError::NoQuorum { .. }) => prop_assert!(valid),
            other => prop_assert!(false, "{other:?}"),
        }
    }
}
