//! The observability layers on a scripted sequence — acquire, contend, time out, lose,
//! release — with exact span fields and metric values.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tenure::observe::{Metered, Traced};
use tenure::{
    AcquireOptions, DistributedLock, LockError, LockKey, ManualClock, MemoryLock, ReleaseOutcome,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

struct FieldVisitor<'a>(&'a mut Fields);

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.to_string());
    }
}

/// An event: its level, its fields, and the `op` of the span it happened in.
type Logged = (tracing::Level, Fields, Option<String>);

/// What the capturing layer saw: closed spans (name, fields) and events.
#[derive(Clone, Default)]
struct Captured {
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    events: Arc<Mutex<Vec<Logged>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut FieldVisitor(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(&mut FieldVisitor(fields));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut FieldVisitor(&mut fields));
        let op = ctx.event_span(event).and_then(|span| {
            span.extensions()
                .get::<Fields>()
                .and_then(|f| f.get("op").cloned())
        });
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((*event.metadata().level(), fields, op));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            self.spans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((span.name().to_string(), fields));
        }
    }
}

/// Absolute metric values: the debugging recorder's snapshots are deltas (it swaps values
/// to zero), so they are summed here.
struct Readings {
    snapshotter: Snapshotter,
    values: HashMap<(String, Vec<(String, String)>), f64>,
}

impl Readings {
    fn read(&mut self) -> &Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            let delta = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            *self
                .values
                .entry((key.name().to_string(), labels))
                .or_default() += delta;
        }
        self
    }

    /// The value of `name` with the memory backend's labels for `jobs/…` keys plus
    /// `extra` (0 if never recorded).
    fn get(&self, name: &str, extra: &[(&str, &str)]) -> f64 {
        let mut labels: Vec<(String, String)> = [("backend", "memory"), ("key_prefix", "jobs")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        self.values
            .get(&(name.to_string(), labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn series(&self, name: &str) -> usize {
        self.values.keys().filter(|(n, _)| n == name).count()
    }
}

/// Runs `body` on a current-thread runtime with the capturing subscriber and a local
/// debugging recorder, so parallel tests do not see each other's spans or metrics.
fn observed<F>(body: impl FnOnce(Readings) -> F) -> Captured
where
    F: std::future::Future<Output = ()>,
{
    let captured = Captured::default();
    let recorder = DebuggingRecorder::new();
    let readings = Readings {
        snapshotter: recorder.snapshotter(),
        values: HashMap::new(),
    };
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(body(readings))
        })
    });
    captured
}

fn layered(inner: MemoryLock) -> Arc<dyn DistributedLock> {
    Arc::new(Metered::new(Arc::new(Traced::new(Arc::new(inner)))))
}

#[test]
fn a_scripted_sequence_gives_exact_spans_and_metrics() {
    let captured = observed(|mut metrics| async move {
        let clock = ManualClock::new();
        let lock = layered(MemoryLock::with_clock(Arc::new(clock.clone())));
        let key = LockKey::new("jobs/nightly").unwrap();
        let ttl = Duration::from_secs(10);
        let no_wait = AcquireOptions::new(ttl).wait(Duration::ZERO);

        // Acquire, then contend: a busy try and an acquire that times out.
        let mut first = lock.acquire(&key, &no_wait).await.unwrap();
        assert_eq!(metrics.read().get("tenure_held", &[]), 1.0);
        assert!(lock.try_acquire(&key, ttl).await.unwrap().is_none());
        let timeout = lock.acquire(&key, &no_wait).await.unwrap_err();
        assert!(matches!(timeout, LockError::Timeout { .. }), "{timeout}");
        assert_eq!(metrics.read().get("tenure_held", &[]), 1.0);

        // Lose it: the TTL passes, extend says LeaseLost, the late release finds it gone.
        clock.advance(ttl + Duration::from_secs(1));
        let lost = lock.extend(&mut first, ttl).await.unwrap_err();
        assert!(matches!(lost, LockError::LeaseLost { .. }), "{lost}");
        assert_eq!(metrics.read().get("tenure_held", &[]), 0.0);
        let late = lock.release(first).await.unwrap();
        assert_eq!(late, ReleaseOutcome::NotHeld);

        // Someone else takes it, extends it, and releases it normally.
        let mut second = lock.try_acquire(&key, ttl).await.unwrap().unwrap();
        lock.extend(&mut second, ttl).await.unwrap();
        assert_eq!(metrics.read().get("tenure_held", &[]), 1.0);
        assert_eq!(
            lock.release(second).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(lock.inspect(&key).await.unwrap().is_none());

        let m = metrics.read();
        let outcome = |o: &'static str| [("outcome", o)];
        assert_eq!(m.get("tenure_acquire_total", &outcome("acquired")), 2.0);
        assert_eq!(m.get("tenure_acquire_total", &outcome("busy")), 1.0);
        assert_eq!(m.get("tenure_acquire_total", &outcome("timeout")), 1.0);
        assert_eq!(m.series("tenure_acquire_total"), 3, "no other outcome");
        assert_eq!(m.get("tenure_extend_total", &outcome("lost")), 1.0);
        assert_eq!(m.get("tenure_extend_total", &outcome("extended")), 1.0);
        assert_eq!(
            m.get("tenure_lease_lost_total", &[]),
            1.0,
            "counted once: by extend, not again by the late release"
        );
        assert_eq!(m.get("tenure_held", &[]), 0.0, "never decremented twice");
        assert_eq!(
            m.get("tenure_acquire_wait_seconds", &[]),
            4.0,
            "one sample per acquire or try_acquire"
        );
    });

    let spans = captured.spans.lock().unwrap().clone();
    let expected = [
        ("acquire", "acquired", Some("1")),
        ("try_acquire", "busy", None),
        ("acquire", "timeout", None),
        ("extend", "lost", Some("1")),
        ("release", "not_held", Some("1")),
        ("try_acquire", "acquired", Some("2")),
        ("extend", "extended", Some("2")),
        ("release", "released", Some("2")),
        ("inspect", "free", None),
    ];
    assert_eq!(spans.len(), expected.len(), "{spans:#?}");
    for ((name, fields), (op, outcome, fence)) in spans.iter().zip(expected) {
        assert_eq!(name, "tenure");
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        let mut want = vec!["backend", "key", "op", "outcome"];
        if fence.is_some() {
            want.insert(1, "fence");
        }
        assert_eq!(keys, want, "only these fields, no URL: {fields:?}");
        assert_eq!(fields["op"], op);
        assert_eq!(fields["outcome"], outcome, "{op}");
        assert_eq!(fields.get("fence").map(String::as_str), fence, "{op}");
        assert_eq!(fields["key"], "jobs/nightly");
        assert_eq!(fields["backend"], "memory");
    }

    let events = captured.events.lock().unwrap().clone();
    let levels: Vec<(tracing::Level, Option<&str>)> = events
        .iter()
        .map(|(level, _, op)| (*level, op.as_deref()))
        .collect();
    assert_eq!(
        levels,
        [
            (tracing::Level::DEBUG, Some("acquire")),
            (tracing::Level::WARN, Some("extend")),
        ],
        "a timeout is debug, a lost lease a warning, each inside its span"
    );
    assert!(
        events[1].1["error"].contains("no longer held"),
        "{events:?}"
    );
}

#[test]
fn releases_and_losses_never_push_the_gauge_below_zero() {
    observed(|mut metrics| async move {
        let clock = ManualClock::new();
        let inner = MemoryLock::with_clock(Arc::new(clock.clone()));
        let lock = layered(inner.clone());
        let other = layered(inner);
        let ttl = Duration::from_secs(5);
        let a = lock
            .try_acquire(&LockKey::new("jobs/a").unwrap(), ttl)
            .await
            .unwrap()
            .unwrap();
        let mut b = lock
            .try_acquire(&LockKey::new("jobs/b").unwrap(), ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(metrics.read().get("tenure_held", &[]), 2.0);

        // Released through another wrapper than the one that granted it: still counted
        // down once. A second release of the same lease is a caller's mistake: not a loss.
        assert_eq!(
            other.release(a.clone()).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(lock.release(a).await.unwrap(), ReleaseOutcome::NotHeld);
        assert_eq!(metrics.read().get("tenure_held", &[]), 1.0);

        clock.advance(ttl * 2);
        for _ in 0..3 {
            assert!(lock.extend(&mut b, ttl).await.is_err());
        }
        let m = metrics.read();
        assert_eq!(m.get("tenure_held", &[]), 0.0);
        assert_eq!(
            m.get("tenure_lease_lost_total", &[]),
            1.0,
            "b, once; not the twice-released lease"
        );
        assert_eq!(
            m.get("tenure_extend_total", &[("outcome", "lost")]),
            3.0,
            "every extend call is counted"
        );
    });
}

#[test]
fn a_semaphore_permit_is_one_observed_acquire_any() {
    let captured = observed(|mut metrics| async move {
        let uploads = tenure::Semaphore::new(layered(MemoryLock::new()), 3).unwrap();
        let name = LockKey::new("jobs/uploads").unwrap();
        let ttl = Duration::from_secs(10);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(uploads.try_acquire(&name, ttl).await.unwrap().unwrap());
        }
        assert!(uploads.try_acquire(&name, ttl).await.unwrap().is_none());
        assert_eq!(metrics.read().get("tenure_held", &[]), 3.0);
        for lease in held {
            uploads.release(lease).await.unwrap();
        }
        let m = metrics.read();
        let outcome = |o: &'static str| [("outcome", o)];
        assert_eq!(m.get("tenure_acquire_total", &outcome("acquired")), 3.0);
        assert_eq!(m.get("tenure_acquire_total", &outcome("timeout")), 1.0);
        assert_eq!(m.get("tenure_held", &[]), 0.0);
    });
    let spans = captured.spans.lock().unwrap().clone();
    let ops: Vec<(&str, &str)> = spans
        .iter()
        .map(|(_, fields)| (fields["op"].as_str(), fields["outcome"].as_str()))
        .collect();
    // Each grant is followed by the count's check: one read of the 2 other permits
    // (held after the first grant), forwarded to the backend's one call.
    let mut expected = Vec::new();
    for read in ["free", "held", "held"] {
        expected.extend([("acquire_any", "acquired"), ("inspect_each", read)]);
    }
    expected.push(("acquire_any", "timeout"));
    expected.extend([("release", "released"); 3]);
    assert_eq!(
        ops, expected,
        "one span per permit taken, not one per permit tried"
    );
    assert!(
        spans
            .iter()
            .all(|(_, f)| f["key"].starts_with("jobs/uploads#permit-")),
        "{spans:?}"
    );
}
