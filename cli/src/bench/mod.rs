//! `tenure bench`: lock cycles per second and latency per backend, against the raw
//! protocol floor measured in the same process, interleaved slice by slice so that a noisy
//! machine shifts both alike.
//!
//! Modes (DESIGN.md §6): `seq` — one task, acquire + release of a fresh key per cycle;
//! `par64` — 64 tasks on one client, each on fresh keys of its own; `contended` — 16
//! clients, one key, blocking `acquire`. `seq`/`par64` have two floors, both the same cycle
//! sent with the backend's plain client crate (module `floor`): the protocol floor (the
//! least a lock needs) and the same-work floor (tenure's own server work); the floor of
//! `contended` is the same library polling with `try_acquire` and 10 ms sleeps, the loop
//! push wake-ups replace. Every line reports its client's CPU time and context switches
//! per cycle (module `profile`). `held` is not a cycle: it holds N leases with renewing
//! guards and reports the RSS.

mod floor;
mod peer;
mod profile;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tenure_api::{
    async_trait, AcquireOptions, DistributedLock, Lease, LockError, LockExt, LockKey,
};

use floor::Floor;
use profile::Usage;

/// What one cycle measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One task; acquire + release on a fresh key per cycle.
    Seq,
    /// 64 concurrent tasks on one client, each on its own fresh keys.
    Par64,
    /// 16 clients on one key, blocking acquire: hand-offs per second.
    Contended,
}

impl Mode {
    /// Every cycle mode.
    pub const ALL: [Mode; 3] = [Mode::Seq, Mode::Par64, Mode::Contended];

    fn tasks(self) -> usize {
        match self {
            Mode::Seq => 1,
            Mode::Par64 => 64,
            Mode::Contended => 16,
        }
    }

    /// Separate clients, as separate processes would be: one per task when contended,
    /// else one shared by every task.
    fn clients(self) -> usize {
        match self {
            Mode::Contended => self.tasks(),
            Mode::Seq | Mode::Par64 => 1,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Seq => "seq",
            Mode::Par64 => "par64",
            Mode::Contended => "contended",
        })
    }
}

impl FromStr for Mode {
    type Err = LockError;
    fn from_str(text: &str) -> Result<Self, LockError> {
        Mode::ALL
            .into_iter()
            .find(|m| m.to_string() == text)
            .ok_or_else(|| {
                LockError::InvalidInput(format!("mode {text:?}: expected seq, par64 or contended"))
            })
    }
}

/// How long and how to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchOptions {
    /// Measured time per implementation.
    pub secs: f64,
    /// Lease TTL of every grant.
    pub ttl: Duration,
    /// Also measure the floors, interleaved: `seq` and `par64` against the protocol floor
    /// and the same-work floor (a lock bench only), `contended` against 10 ms polling.
    pub floor: bool,
    /// Bench a [`Semaphore`](tenure::Semaphore) of this many permits per key instead of
    /// the lock. The `seq` and `par64` floors stay the plain client's; the `contended`
    /// floor polls the same semaphore.
    pub permits: Option<u32>,
    /// Bench an [`Election`](tenure::Election) instead of the lock: a cycle is a campaign
    /// and a resignation (`contended`: 16 candidates for one name, so a hand-off is a
    /// change of leader). The `seq` and `par64` floors stay the plain client's; the
    /// `contended` floor campaigns in a 10 ms polling loop.
    pub election: bool,
    /// Bench a [`MultiLock`](tenure::MultiLock) of this many keys (2 to 64) instead of
    /// the lock: a cycle takes them all and releases them. The floor (`seq`, `par64`) is
    /// the same client taking the keys one by one, in order, with plain leases (no guard);
    /// the `contended` floor polls the same multi-lock every 10 ms.
    pub keys: Option<u32>,
    /// Bench a reader (`acquire_shared`, an `RwLock`'s read side) instead of the lock, on
    /// a backend with the shared mode. The floor (`seq`, `par64`) is the same client's
    /// plain (exclusive) lock: what a reader costs over a writer; the `contended` floor
    /// polls as a reader every 10 ms (16 readers on one key share it).
    pub shared: bool,
    /// Also run the backend's peer library, where its testbed names one (ZooKeeper's:
    /// zookeeper-client's lock recipe), interleaved, and report
    /// tenure's throughput over the peer's.
    pub peers: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            secs: 5.0,
            ttl: Duration::from_secs(10),
            floor: false,
            permits: None,
            election: false,
            keys: None,
            shared: false,
            peers: false,
        }
    }
}

/// One run: the JSON line `tenure bench` prints (DESIGN.md §6), plus which implementation
/// ran and, on library lines measured with `--floor`, the ratio to the floor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchLine {
    /// Backend name.
    pub backend: String,
    /// The mode.
    pub mode: Mode,
    /// `tenure` (the library), `floor` (the protocol floor: plain client), `same-work` (the
    /// same-work floor: plain client sending tenure's server work), `poll10ms` (contended
    /// floor) or the peer library's name.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// On library lines of a semaphore bench: its permits per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// On library lines of an election bench: true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub election: bool,
    /// On lines of a multi-lock bench: its keys per cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<u32>,
    /// On library lines of a reader bench (and its contended floor's): true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// Measured seconds.
    pub secs: f64,
    /// Completed cycles.
    pub cycles: u64,
    /// Cycles per second.
    pub cycles_per_s: f64,
    /// Median cycle latency, µs.
    pub p50_us: u64,
    /// 99th percentile cycle latency, µs.
    pub p99_us: u64,
    /// Failed cycles.
    pub errors: u64,
    /// `contended` only: grants per second that went to another client than the previous
    /// grant (a client re-taking the lock it just released is not a hand-off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoffs_per_s: Option<f64>,
    /// `contended` only: the fewest grants any one client got divided by the most (1.0 =
    /// every client got the lock equally often; 0 = a client starved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<f64>,
    /// Library throughput divided by the (protocol) floor's (cycles/s; hand-offs/s in
    /// `contended`), on library lines run with a floor; on the same-work floor's line, its
    /// throughput over the protocol floor's (what the guarantee costs the servers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Library throughput divided by the same-work floor's (what tenure's client costs),
    /// on library lines run with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_work_ratio: Option<f64>,
    /// Library throughput divided by the peer library's (as `ratio`), on library lines
    /// run with a peer (`--peers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_ratio: Option<f64>,
    /// This process's CPU time (user + system, all threads) per cycle, µs: the client's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_cycle: Option<f64>,
    /// This process's context switches (voluntary + involuntary) per cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switches_per_cycle: Option<f64>,
    /// This process's heap allocations per cycle (the bench's own included: a key string
    /// per cycle), where its allocator counts them (the `tenure` binary's does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocs_per_cycle: Option<f64>,
    /// Rounds this line summarises: with more than one (`--repeat`), every rate, latency,
    /// fairness and ratio is the median over the rounds (each ratio taken within its
    /// round), and `cycles`, `errors` and `secs` are totals.
    pub rounds: u32,
}

/// One line per (backend, mode, implementation) over several rounds of [`run`]: medians
/// of the rates, latencies, fairness and ratios (a ratio is taken within its round, where
/// library and floor ran interleaved), totals of cycles, errors and seconds. Lines keep
/// the order in which they first appear.
pub fn medians(rounds: &[BenchLine]) -> Vec<BenchLine> {
    let mut groups: Vec<Vec<&BenchLine>> = Vec::new();
    for line in rounds {
        let same = |g: &&mut Vec<&BenchLine>| {
            let first = g[0];
            (
                first.backend.as_str(),
                first.mode,
                first.implementation,
                first.permits,
                first.election,
                first.keys,
                first.shared,
            ) == (
                line.backend.as_str(),
                line.mode,
                line.implementation,
                line.permits,
                line.election,
                line.keys,
                line.shared,
            )
        };
        match groups.iter_mut().find(same) {
            Some(group) => group.push(line),
            None => groups.push(vec![line]),
        }
    }
    groups
        .into_iter()
        .map(|group| {
            let all = |value: &dyn Fn(&BenchLine) -> f64| median(group.iter().map(|l| value(l)));
            let known = |value: &dyn Fn(&BenchLine) -> Option<f64>| {
                let values: Vec<f64> = group.iter().filter_map(|l| value(l)).collect();
                (!values.is_empty()).then(|| median(values))
            };
            BenchLine {
                backend: group[0].backend.clone(),
                mode: group[0].mode,
                implementation: group[0].implementation,
                permits: group[0].permits,
                election: group[0].election,
                keys: group[0].keys,
                shared: group[0].shared,
                secs: group.iter().map(|l| l.secs).sum(),
                cycles: group.iter().map(|l| l.cycles).sum(),
                cycles_per_s: all(&|l| l.cycles_per_s),
                p50_us: all(&|l| l.p50_us as f64) as u64,
                p99_us: all(&|l| l.p99_us as f64) as u64,
                errors: group.iter().map(|l| l.errors).sum(),
                handoffs_per_s: known(&|l| l.handoffs_per_s),
                fairness: known(&|l| l.fairness),
                ratio: known(&|l| l.ratio),
                same_work_ratio: known(&|l| l.same_work_ratio),
                peer_ratio: known(&|l| l.peer_ratio),
                cpu_us_per_cycle: known(&|l| l.cpu_us_per_cycle),
                switches_per_cycle: known(&|l| l.switches_per_cycle),
                allocs_per_cycle: known(&|l| l.allocs_per_cycle),
                rounds: group.iter().map(|l| l.rounds).sum(),
            }
        })
        .collect()
}

/// The median of a non-empty set (the mean of the middle two for an even count).
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[mid],
        _ => (values[mid - 1] + values[mid]) / 2.0,
    }
}

pub(crate) use tenure_conformance::testbed::Locker;

/// The library: `try_acquire` (seq, par64 — the key is fresh, so it must be granted),
/// blocking `acquire` (contended), or a 10 ms polling loop (the contended floor).
struct Library {
    lock: Arc<dyn DistributedLock>,
    ttl: Duration,
    wait: Wait,
    /// As a reader (`acquire_shared`).
    shared: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Wait {
    None,
    Push,
    Poll10ms,
}

#[async_trait]
impl Locker for Library {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let key = LockKey::new(key).map_err(|e| e.to_string())?;
        let lease = match self.shared {
            false => self.write(&key).await?,
            true => self.read(&key).await?,
        };
        held();
        self.lock
            .release(lease)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Library {
    /// A writer's lease: `try_acquire`, a wait, or `try_acquire` every 10 ms.
    async fn write(&self, key: &LockKey) -> Result<Lease, String> {
        match self.wait {
            Wait::None => self
                .lock
                .try_acquire(key, self.ttl)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "a fresh key was busy".into()),
            Wait::Push => self
                .lock
                .acquire(
                    key,
                    &AcquireOptions::new(self.ttl).wait(Duration::from_secs(30)),
                )
                .await
                .map_err(|e| e.to_string()),
            Wait::Poll10ms => loop {
                match self.lock.try_acquire(key, self.ttl).await {
                    Ok(Some(lease)) => break Ok(lease),
                    Ok(None) => tokio::time::sleep(Duration::from_millis(10)).await,
                    Err(e) => break Err(e.to_string()),
                }
            },
        }
    }

    /// A reader's lease: `acquire_shared` (one attempt, a wait, or one attempt every
    /// 10 ms).
    async fn read(&self, key: &LockKey) -> Result<Lease, String> {
        let once = AcquireOptions::new(self.ttl).wait(Duration::ZERO);
        match self.wait {
            Wait::None => self.lock.acquire_shared(key, &once).await,
            Wait::Push => {
                let opts = once.wait(Duration::from_secs(30));
                self.lock.acquire_shared(key, &opts).await
            }
            Wait::Poll10ms => loop {
                match self.lock.acquire_shared(key, &once).await {
                    Err(LockError::Timeout { .. }) => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    other => break other,
                }
            },
        }
        .map_err(|e| e.to_string())
    }
}

/// An election's candidate: a campaign, then a resignation (`seq`, `par64`: one attempt,
/// the name is fresh; `contended`: a wait; the contended floor: a 10 ms polling loop).
struct Candidate {
    election: tenure::Election,
    wait: Wait,
}

#[async_trait]
impl Locker for Candidate {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let name = LockKey::new(key).map_err(|e| e.to_string())?;
        let campaign = |wait| self.election.campaign(&name, "tenure-bench", wait);
        let leadership = match self.wait {
            Wait::None => match campaign(Duration::ZERO).await {
                Err(LockError::Timeout { .. }) => return Err("a fresh name was led".into()),
                other => other.map_err(|e| e.to_string())?,
            },
            Wait::Push => campaign(Duration::from_secs(30))
                .await
                .map_err(|e| e.to_string())?,
            Wait::Poll10ms => loop {
                match campaign(Duration::ZERO).await {
                    Ok(leadership) => break leadership,
                    Err(LockError::Timeout { .. }) => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    Err(e) => return Err(e.to_string()),
                }
            },
        };
        held();
        leadership
            .resign()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A multi-lock of `keys` keys (`<cycle key>/<i>`): taken together and released together
/// (`seq`, `par64`: one attempt per key; `contended`: a wait; the contended floor: a
/// 10 ms polling loop), or — the `seq`/`par64` floor — taken one by one with plain leases.
struct Multi {
    lock: Arc<dyn DistributedLock>,
    keys: u32,
    ttl: Duration,
    wait: Wait,
    /// The floor: plain leases, one key after the other, no guard.
    one_by_one: bool,
}

#[async_trait]
impl Locker for Multi {
    async fn cycle(&self, key: &str, held: &(dyn Fn() + Send + Sync)) -> Result<(), String> {
        let keys = (0..self.keys)
            .map(|i| LockKey::new(format!("{key}/{i}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        if self.one_by_one {
            let mut leases = Vec::with_capacity(keys.len());
            for key in &keys {
                match self.lock.try_acquire(key, self.ttl).await {
                    Ok(Some(lease)) => leases.push(lease),
                    Ok(None) => return Err("a fresh key was busy".into()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            held();
            for lease in leases {
                self.lock.release(lease).await.map_err(|e| e.to_string())?;
            }
            return Ok(());
        }
        let multi = tenure::MultiLock::new(self.lock.clone(), keys).map_err(|e| e.to_string())?;
        let once = AcquireOptions::new(self.ttl).wait(Duration::ZERO);
        let guard = match self.wait {
            Wait::None => multi.lock(&once).await.map_err(|e| e.to_string())?,
            Wait::Push => multi
                .lock(&once.clone().wait(Duration::from_secs(30)))
                .await
                .map_err(|e| e.to_string())?,
            Wait::Poll10ms => loop {
                match multi.lock(&once).await {
                    Ok(guard) => break guard,
                    Err(LockError::Timeout { .. }) => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    Err(e) => return Err(e.to_string()),
                }
            },
        };
        held();
        guard.release().await.map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Counts and latencies of one implementation, over all its slices.
struct Stats {
    histogram: Histogram<u64>,
    cycles: u64,
    /// Grants to another task than the previous grant's (contended mode).
    handoffs: u64,
    /// Grants per task (task i holds client i in contended mode).
    per_task: Vec<u64>,
    errors: u64,
    elapsed: Duration,
    /// What this process spent during the slices.
    usage: Usage,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Self {
        Self {
            histogram: Histogram::new(3).expect("3 significant figures is valid"),
            cycles: 0,
            handoffs: 0,
            per_task: Vec::new(),
            errors: 0,
            elapsed: Duration::ZERO,
            usage: Usage::default(),
            first_error: None,
        }
    }

    fn line(&self, backend: &str, mode: Mode, implementation: &'static str) -> BenchLine {
        let secs = self.elapsed.as_secs_f64();
        let per_s = |n: u64| {
            if secs > 0.0 {
                (n as f64 / secs * 10.0).round() / 10.0
            } else {
                0.0
            }
        };
        let per_cycle = self.usage.per_cycle(self.cycles);
        BenchLine {
            backend: backend.to_owned(),
            mode,
            implementation,
            permits: None,
            election: false,
            keys: None,
            shared: false,
            secs: (secs * 1000.0).round() / 1000.0,
            cycles: self.cycles,
            cycles_per_s: per_s(self.cycles),
            handoffs_per_s: (mode == Mode::Contended).then(|| per_s(self.handoffs)),
            fairness: (mode == Mode::Contended).then(|| self.fairness()),
            p50_us: self.histogram.value_at_quantile(0.5),
            p99_us: self.histogram.value_at_quantile(0.99),
            errors: self.errors,
            ratio: None,
            same_work_ratio: None,
            peer_ratio: None,
            cpu_us_per_cycle: per_cycle.map(|p| p.cpu_us),
            switches_per_cycle: per_cycle.map(|p| p.switches),
            allocs_per_cycle: per_cycle.and_then(|p| p.allocations),
            rounds: 1,
        }
    }

    /// The fewest grants a task got over the most, rounded to 2 places (0 without grants).
    fn fairness(&self) -> f64 {
        let most = self.per_task.iter().copied().max().unwrap_or(0);
        let fewest = self.per_task.iter().copied().min().unwrap_or(0);
        if most == 0 {
            0.0
        } else {
            (fewest as f64 / most as f64 * 100.0).round() / 100.0
        }
    }
}

/// Runs `mode.tasks()` tasks over `lockers` (task i uses locker i mod n) until `slice`
/// has passed; adds what they did to `stats`.
async fn drive(
    lockers: &[Arc<dyn Locker>],
    mode: Mode,
    run: &str,
    slice: Duration,
    stats: &mut Stats,
) {
    let started = Instant::now();
    let used = Usage::now();
    let until = started + slice;
    let last_holder = Arc::new(AtomicUsize::new(usize::MAX));
    let tasks: Vec<_> = (0..mode.tasks())
        .map(|task| {
            let locker = lockers[task % lockers.len()].clone();
            let run = run.to_owned();
            let last_holder = last_holder.clone();
            tokio::spawn(async move {
                let handoffs = AtomicU64::new(0);
                let held = || {
                    if last_holder.swap(task, Ordering::Relaxed) != task {
                        handoffs.fetch_add(1, Ordering::Relaxed);
                    }
                };
                let mut local = Stats::new();
                let mut n = 0u64;
                while Instant::now() < until {
                    let key = match mode {
                        Mode::Contended => format!("{run}/contended"),
                        _ => format!("{run}/{task}/{n}"),
                    };
                    n += 1;
                    let begun = Instant::now();
                    match locker.cycle(&key, &held).await {
                        Ok(()) => {
                            let micros = begun.elapsed().as_micros();
                            let _ = local
                                .histogram
                                .record(u64::try_from(micros).unwrap_or(u64::MAX));
                            local.cycles += 1;
                        }
                        Err(e) => {
                            local.errors += 1;
                            local.first_error.get_or_insert(e);
                            // A dead backend fails fast: do not spin on it.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    // A cycle that never waits (memory://) would otherwise keep its
                    // worker thread for the whole slice and starve the other tasks.
                    if mode != Mode::Seq {
                        tokio::task::yield_now().await;
                    }
                }
                local.handoffs = handoffs.load(Ordering::Relaxed);
                local
            })
        })
        .collect();
    stats.per_task.resize(tasks.len(), 0);
    for (i, task) in tasks.into_iter().enumerate() {
        if let Ok(local) = task.await {
            stats.per_task[i] += local.cycles;
            let _ = stats.histogram.add(&local.histogram);
            stats.cycles += local.cycles;
            stats.handoffs += local.handoffs;
            stats.errors += local.errors;
            if stats.first_error.is_none() {
                stats.first_error = local.first_error;
            }
        }
    }
    stats.elapsed += started.elapsed();
    stats.usage = stats.usage.plus(Usage::now().since(used));
}

/// The backend name of a URL, from its scheme, and what its testbed reports the URL's
/// lines apart under (`postgres advisory`).
fn backend_name(url: &str) -> String {
    let name = tenure::driver_for(url).map_or("unknown", |driver| driver.name);
    let variant = crate::local::testbed(name)
        .and_then(|testbed| testbed.bench_variants.iter().find(|v| v.configured_by(url)));
    match variant {
        Some(variant) => format!("{name} {}", variant.name),
        None => name.to_owned(),
    }
}

/// The library's lockers for `mode`, or with `as_floor` the floor's form of the variant
/// benched: a multi-lock's keys taken one by one, a reader's lock taken exclusively.
async fn library_lockers(
    url: &str,
    mode: Mode,
    options: BenchOptions,
    wait: Wait,
    as_floor: bool,
) -> Result<Vec<Arc<dyn Locker>>, LockError> {
    let ttl = options.ttl;
    let clients = mode.clients();
    // A `memory://` lock table lives in its client: in-process clients share one (16
    // separate tables would never contend).
    let shared = match backend_name(url).as_str() {
        "memory" => Some(tenure::connect(url).await?),
        _ => None,
    };
    let mut lockers: Vec<Arc<dyn Locker>> = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut lock = match &shared {
            Some(lock) => lock.clone(),
            None => tenure::connect(url).await?,
        };
        if let Some(permits) = options.permits {
            lock = Arc::new(tenure::Semaphore::new(lock, permits)?);
        }
        if options.election {
            let election = tenure::Election::new(lock)?.with_ttl(ttl)?;
            lockers.push(Arc::new(Candidate { election, wait }));
            continue;
        }
        if let Some(keys) = options.keys {
            lockers.push(Arc::new(Multi {
                lock,
                keys,
                ttl,
                wait,
                one_by_one: as_floor,
            }));
            continue;
        }
        if options.shared && !lock.capabilities().shared {
            return Err(LockError::Config(format!(
                "{} has no shared (read) locks to bench (Capabilities::shared)",
                lock.capabilities().backend
            )));
        }
        let shared = options.shared && !as_floor;
        lockers.push(Arc::new(Library {
            lock,
            ttl,
            wait,
            shared,
        }));
    }
    Ok(lockers)
}

/// Runs `mode` against `url` for `options.secs` (per implementation), in 1 s slices
/// alternating library, floors and peer. Returns the library line (with its ratios) and,
/// with floors or a peer, their lines (the same-work floor's with its ratio to the
/// protocol floor). A run where every cycle failed is an error
/// carrying the first failure.
///
/// # Cancel safety
/// Dropping it abandons the run; locks it held expire by TTL.
pub async fn run(
    url: &str,
    mode: Mode,
    options: BenchOptions,
) -> Result<Vec<BenchLine>, LockError> {
    tenure_api::validate_ttl(options.ttl)?;
    if !(options.secs > 0.0 && options.secs <= 3600.0) {
        return Err(LockError::InvalidInput(format!(
            "--secs {} must be in (0, 3600]",
            options.secs
        )));
    }
    let variants = [
        options.permits.is_some(),
        options.election,
        options.keys.is_some(),
        options.shared,
    ];
    if variants.iter().filter(|on| **on).count() > 1 {
        return Err(LockError::InvalidInput(
            "one of --permits, --election, --keys and --shared at a time".into(),
        ));
    }
    if options.peers && variants.contains(&true) {
        return Err(LockError::InvalidInput(
            "--peers compares locks: not with --permits, --election, --keys or --shared".into(),
        ));
    }
    if options.keys.is_some_and(|keys| !(2..=64).contains(&keys)) {
        return Err(LockError::InvalidInput(format!(
            "--keys {} must be in 2..=64",
            options.keys.unwrap_or_default()
        )));
    }
    let backend = backend_name(url);
    let wait = if mode == Mode::Contended {
        Wait::Push
    } else {
        Wait::None
    };
    let library = library_lockers(url, mode, options, wait, false).await?;
    let floor = match (options.floor, mode) {
        (false, _) => None,
        (true, Mode::Contended) => Some((
            library_lockers(url, mode, options, Wait::Poll10ms, false).await?,
            "poll10ms",
        )),
        (true, _) if options.keys.is_some() => Some((
            library_lockers(url, mode, options, wait, true).await?,
            "one-by-one",
        )),
        (true, _) if options.shared => Some((
            library_lockers(url, mode, options, wait, true).await?,
            "exclusive",
        )),
        (true, _) => floor::lockers(url, mode.tasks(), options.ttl, Floor::Protocol)
            .await?
            .map(|lockers| (lockers, Floor::Protocol.name())),
    };
    // The same work as a lock's: not a semaphore's, an election's, a multi-lock's or a
    // reader's.
    let lock_bench = !variants.contains(&true);
    let same_work = match (options.floor && lock_bench, mode) {
        (false, _) | (true, Mode::Contended) => None,
        (true, _) => floor::lockers(url, mode.tasks(), options.ttl, Floor::SameWork)
            .await?
            .map(|lockers| (lockers, Floor::SameWork.name())),
    };
    let peer = if options.peers {
        peer::lockers(url, mode).await?
    } else {
        None
    };
    let run = format!("tenure-bench/{:08x}", rand::random::<u32>());
    let total = Duration::from_secs_f64(options.secs);
    let slice = total.min(Duration::from_secs(1));
    let (mut ours, mut theirs, mut peers) = (Stats::new(), Stats::new(), Stats::new());
    let mut same = Stats::new();
    while ours.elapsed < total {
        let this = slice.min(total - ours.elapsed);
        drive(&library, mode, &format!("{run}/lib"), this, &mut ours).await;
        if let Some((lockers, _)) = &floor {
            drive(lockers, mode, &format!("{run}/floor"), this, &mut theirs).await;
        }
        if let Some((lockers, _)) = &same_work {
            drive(lockers, mode, &format!("{run}/same"), this, &mut same).await;
        }
        if let Some((lockers, _)) = &peer {
            drive(lockers, mode, &format!("{run}/peer"), this, &mut peers).await;
        }
    }
    let all = [
        (&ours, "tenure"),
        (&theirs, "floor"),
        (&same, "same-work"),
        (&peers, "peer"),
    ];
    for (stats, what) in all {
        if stats.cycles == 0 && stats.errors > 0 {
            return Err(LockError::backend(format!(
                "{backend} {mode} ({what}): every cycle failed; the first: {}",
                stats.first_error.as_deref().unwrap_or("?")
            )));
        }
    }
    let mut line = ours.line(&backend, mode, "tenure");
    line.permits = options.permits;
    line.election = options.election;
    line.keys = options.keys;
    line.shared = options.shared;
    if options.shared {
        // Readers hold together: no hand-offs, no order among them to measure.
        (line.handoffs_per_s, line.fairness) = (None, None);
    }
    let throughput = |l: &BenchLine| l.handoffs_per_s.unwrap_or(l.cycles_per_s);
    // Ours over theirs, to two places; none if theirs did nothing.
    let ratio = |ours: &BenchLine, theirs: &BenchLine| {
        (throughput(theirs) > 0.0)
            .then(|| (throughput(ours) / throughput(theirs) * 100.0).round() / 100.0)
    };
    let floor_line = floor.map(|(_, implementation)| {
        let mut floor_line = theirs.line(&backend, mode, implementation);
        if mode == Mode::Contended {
            floor_line.permits = options.permits;
            floor_line.election = options.election;
            floor_line.shared = options.shared;
            if options.shared {
                (floor_line.handoffs_per_s, floor_line.fairness) = (None, None);
            }
        }
        floor_line.keys = options.keys;
        floor_line
    });
    let mut same_line = same_work.map(|(_, name)| same.line(&backend, mode, name));
    let peer_line = peer.map(|(_, implementation)| peers.line(&backend, mode, implementation));
    line.ratio = floor_line.as_ref().and_then(|floor| ratio(&line, floor));
    line.peer_ratio = peer_line.as_ref().and_then(|peer| ratio(&line, peer));
    if let Some(same_line) = &mut same_line {
        line.same_work_ratio = ratio(&line, same_line);
        same_line.ratio = floor_line
            .as_ref()
            .and_then(|floor| ratio(same_line, floor));
    }
    Ok([Some(line), floor_line, same_line, peer_line]
        .into_iter()
        .flatten()
        .collect())
}

/// What `held` measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldLine {
    /// Backend name.
    pub backend: String,
    /// Always `held`.
    pub mode: &'static str,
    /// Leases asked for.
    pub leases: usize,
    /// Leases held at once, each with a renewing guard (fewer than `leases` when the
    /// backend refused more: see `refused`).
    pub held: usize,
    /// Why the backend refused the next lease (e.g. Postgres past `max_held`), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Resident set size of this process before acquiring, MiB.
    pub rss_before_mb: f64,
    /// Resident set size while all leases were held (after a renewal round), MiB.
    pub rss_held_mb: f64,
    /// Seconds to acquire them all.
    pub acquire_secs: f64,
    /// Guards that reported a lost lease while held.
    pub lost: usize,
}

/// This process's resident set size in MiB, from `/proc/self/status`.
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| (kb / 1024.0 * 10.0).round() / 10.0)
}

/// Holds `leases` locks at once on one client, each with a [`tenure_api::LockGuard`]
/// renewing it, for one and a half renewal rounds; reports the RSS, then releases all.
/// A backend that refuses more (its limit on held locks) is reported with how many it
/// held and its error.
///
/// # Cancel safety
/// Dropping it drops the guards, which release in the background.
pub async fn held(url: &str, leases: usize, ttl: Duration) -> Result<HeldLine, LockError> {
    tenure_api::validate_ttl(ttl)?;
    let lock = tenure::connect(url).await?;
    let before = rss_mb();
    let run = format!("tenure-bench/{:08x}/held", rand::random::<u32>());
    let started = Instant::now();
    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(10));
    let mut guards = Vec::with_capacity(leases);
    let mut refused = None;
    // Acquire in waves of 256 so a remote backend sees bounded concurrency; stop at the
    // first refusal (a backend's limit on held locks) and report it.
    for wave in (0..leases).collect::<Vec<_>>().chunks(256) {
        let acquired = futures::future::join_all(wave.iter().map(|i| {
            let (lock, opts) = (lock.clone(), opts.clone());
            let key = LockKey::new(format!("{run}/{i}"));
            async move { lock.lock(&key?, &opts).await }
        }))
        .await;
        for guard in acquired {
            match guard {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    refused.get_or_insert_with(|| e.to_string());
                }
            }
        }
        if refused.is_some() {
            break;
        }
    }
    let acquire_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(tenure_api::renewal_interval(ttl).mul_f64(1.5)).await;
    let held_rss = rss_mb();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let guards_held = guards.len();
    futures::future::join_all(guards.into_iter().map(|g| g.release())).await;
    Ok(HeldLine {
        backend: backend_name(url),
        mode: "held",
        leases,
        held: guards_held,
        refused,
        rss_before_mb: before,
        rss_held_mb: held_rss,
        acquire_secs: (acquire_secs * 1000.0).round() / 1000.0,
        lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_advisory_rows_are_named_apart_from_row_locks() {
        assert_eq!(backend_name("postgres://u@h/db"), "postgres");
        assert_eq!(backend_name("postgres://u@h/db?locking=row"), "postgres");
        assert_eq!(
            backend_name("postgres://u@h/db?pool_size=2&locking=advisory"),
            "postgres advisory"
        );
        assert_eq!(backend_name("redis://h"), "redis");
    }

    fn line(implementation: &'static str, cycles_per_s: f64, ratio: Option<f64>) -> BenchLine {
        BenchLine {
            backend: "redis".into(),
            mode: Mode::Seq,
            implementation,
            permits: None,
            election: false,
            keys: None,
            shared: false,
            secs: 1.0,
            cycles: cycles_per_s as u64,
            cycles_per_s,
            p50_us: cycles_per_s as u64 / 10,
            p99_us: 0,
            errors: 1,
            handoffs_per_s: None,
            fairness: None,
            ratio,
            same_work_ratio: None,
            peer_ratio: None,
            cpu_us_per_cycle: Some(cycles_per_s / 100.0),
            switches_per_cycle: None,
            allocs_per_cycle: None,
            rounds: 1,
        }
    }

    #[test]
    fn medians_group_by_implementation_and_take_ratios_within_rounds() {
        let rounds = [
            line("tenure", 100.0, Some(0.5)),
            line("floor", 200.0, None),
            line("tenure", 300.0, Some(0.9)),
            line("floor", 330.0, None),
            line("tenure", 50.0, Some(0.2)),
            line("floor", 250.0, None),
        ];
        let lines = medians(&rounds);
        assert_eq!(lines.len(), 2);
        let (ours, floor) = (&lines[0], &lines[1]);
        assert_eq!(ours.implementation, "tenure");
        assert_eq!(ours.cycles_per_s, 100.0);
        assert_eq!(ours.p50_us, 10);
        // The median of the per-round ratios, not median(ours) / median(floor) (0.4).
        assert_eq!(ours.ratio, Some(0.5));
        assert_eq!((ours.rounds, ours.cycles, ours.errors), (3, 450, 3));
        assert_eq!(floor.cycles_per_s, 250.0);
        assert_eq!(floor.ratio, None);
    }

    #[test]
    fn medians_keep_a_semaphore_bench_apart_from_the_lock() {
        let semaphore = BenchLine {
            permits: Some(4),
            ..line("tenure", 50.0, None)
        };
        let rounds = [line("tenure", 100.0, None), semaphore.clone(), semaphore];
        let lines = medians(&rounds);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!((lines[0].permits, lines[0].rounds), (None, 1));
        assert_eq!((lines[1].permits, lines[1].rounds), (Some(4), 2));
        let json = serde_json::to_string(&lines[1]).unwrap();
        assert!(json.contains("\"permits\":4"), "{json}");
        let json = serde_json::to_string(&lines[0]).unwrap();
        assert!(!json.contains("permits"), "{json}");
        let election = BenchLine {
            election: true,
            ..line("tenure", 70.0, None)
        };
        let lines = medians(&[line("tenure", 100.0, None), election]);
        assert_eq!(
            lines.len(),
            2,
            "an election's line is not the lock's: {lines:?}"
        );
        assert!(serde_json::to_string(&lines[1])
            .unwrap()
            .contains("\"election\":true"));
        assert!(!serde_json::to_string(&lines[0])
            .unwrap()
            .contains("election"));
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median([7.0]), 7.0);
    }

    #[test]
    fn fairness_is_fewest_over_most_grants() {
        let mut stats = Stats::new();
        stats.per_task = vec![10, 40, 20];
        assert_eq!(stats.fairness(), 0.25);
        stats.per_task = vec![0, 0];
        assert_eq!(stats.fairness(), 0.0);
    }

    /// A peer is a lock: a semaphore or election bench with peers is refused before
    /// anything runs.
    #[tokio::test]
    async fn peers_are_refused_with_a_semaphore_or_an_election() {
        for options in [
            BenchOptions {
                peers: true,
                permits: Some(2),
                ..BenchOptions::default()
            },
            BenchOptions {
                peers: true,
                election: true,
                ..BenchOptions::default()
            },
        ] {
            let refused = run("memory://", Mode::Seq, options).await;
            assert!(
                matches!(refused, Err(LockError::InvalidInput(ref m)) if m.contains("--peers")),
                "{refused:?}"
            );
        }
    }
}
