//! Property tests: bad input never panics, tokens always increase.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tenure_api::{DistributedLock, LockError, LockKey, ManualClock, MemoryLock, OwnerId};

proptest! {
    #[test]
    fn any_key_is_accepted_or_rejected_without_panic(name in any::<String>()) {
        match LockKey::new(name.clone()) {
            Ok(key) => {
                prop_assert!(!name.is_empty() && name.len() <= LockKey::MAX_LEN);
                prop_assert!(!name.chars().any(char::is_control));
                prop_assert_eq!(key.as_str(), name.as_str());
            }
            Err(LockError::InvalidInput(msg)) => prop_assert!(!msg.is_empty()),
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }

    #[test]
    fn owner_id_round_trips(bytes in any::<[u8; 16]>()) {
        let id = OwnerId(bytes);
        prop_assert_eq!(OwnerId::parse(&id.to_string()).unwrap(), id);
        // The allocation-free form is the same text, lowercase hex as ever.
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        prop_assert_eq!(id.to_string(), expected.clone());
        prop_assert_eq!(&id.hex()[..], expected.as_bytes());
    }

    #[test]
    fn owner_id_parse_never_panics(text in ".{0,40}") {
        let _ = OwnerId::parse(&text);
    }

    /// Random interleavings of acquire, release, expiry and extend on a few keys: every
    /// grant's token is larger than every earlier grant's, and a key never has two holders.
    #[test]
    fn tokens_strictly_increase_per_key(ops in proptest::collection::vec((0u8..4, 0usize..3, 1u64..40), 1..80)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let clock = ManualClock::new();
            let lock = MemoryLock::with_clock(Arc::new(clock.clone()));
            let keys: Vec<LockKey> = (0..3).map(|i| LockKey::new(format!("k{i}")).unwrap()).collect();
            let ttl = Duration::from_millis(20);
            let mut held: Vec<Option<tenure_api::Lease>> = vec![None, None, None];
            let mut last_token = [0u64; 3];
            for (op, k, ms) in ops {
                match op {
                    0 => if let Some(lease) = lock.try_acquire(&keys[k], ttl).await.unwrap() {
                        assert!(lease.token().get() > last_token[k], "token did not increase");
                        last_token[k] = lease.token().get();
                        held[k] = Some(lease);
                    },
                    1 => if let Some(lease) = held[k].take() { lock.release(lease).await.unwrap(); },
                    2 => clock.advance(Duration::from_millis(ms)),
                    _ => if let Some(lease) = held[k].as_mut() { let _ = lock.extend(lease, ttl).await; },
                }
            }
        });
    }
}

proptest! {
    #[test]
    fn url_helpers_never_panic(text in "\\PC{0,40}") {
        let _ = tenure_api::urls::redact_url(&text);
        let _ = tenure_api::urls::parse_host_list(&text, 1);
    }

    #[test]
    fn redaction_hides_any_password(user in "[a-z]{1,8}", password in "[A-Za-z0-9]{6,16}", host in "[a-z]{1,8}") {
        let shown = tenure_api::urls::redact_url(&format!("redis://{user}:{password}@{host}:6379/0"));
        let secret = format!(":{password}@");
        prop_assert!(!shown.contains(&secret), "{}", shown);
    }
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..10_000).prop_map(Duration::from_millis),
    ]
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        any::<f64>(),
        0.0..=1.0,
    ]
}

proptest! {
    /// No option value panics: validation gives a typed error, the backoff a delay
    /// within its bounds, and an acquire on a free key succeeds or is refused cleanly.
    #[test]
    fn no_option_value_panics(
        ttl in any_duration(),
        wait in any_duration(),
        initial in any_duration(),
        max in any_duration(),
        jitter in any_f64(),
        attempt in any::<u32>(),
    ) {
        let backoff = tenure_api::Backoff { initial, max, jitter };
        let delay = backoff.delay(attempt);
        prop_assert!(delay <= max, "delay {delay:?} above max {max:?}");
        prop_assert_eq!(backoff.validate().is_ok(), (0.0..=1.0).contains(&jitter));
        let opts = tenure_api::AcquireOptions::new(ttl).wait(wait).backoff(backoff);
        let started = std::time::Instant::now();
        prop_assert!(opts.wait_deadline(started) >= started);
        let valid = opts.validate();
        if let Err(error) = &valid {
            prop_assert!(matches!(error, LockError::InvalidInput(_)), "{error}");
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = runtime.block_on(MemoryLock::new().acquire(&LockKey::new("k").unwrap(), &opts));
        prop_assert_eq!(result.is_ok(), valid.is_ok());
    }
}
