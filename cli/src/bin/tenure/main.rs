//! The `tenure` command: run a command under a lock, or acquire, extend, release and
//! inspect locks from scripts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use tenure::{
    AcquireOptions, Config, Election, ExpiryKind, FencingToken, Lease, LeaseHandle, LockError,
    LockKey, OwnerId, ReleaseOutcome, Semaphore,
};

#[cfg(feature = "lab")]
mod bench;
#[cfg(feature = "lab")]
mod matrix;
mod run;

use run::EXIT_LOST;

/// With the lab, allocations are counted for `tenure bench` (see
/// [`tenure_cli::COUNTING_ALLOCATOR`]).
#[cfg(feature = "lab")]
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &tenure_cli::COUNTING_ALLOCATOR;

/// Exit code: the lock is held by someone else (after waiting).
const EXIT_BUSY: u8 = 75;
/// Exit code: bad configuration or input.
const EXIT_CONFIG: u8 = 78;
/// Exit code: the backend failed.
const EXIT_BACKEND: u8 = 69;
/// Exit code: `tenure doctor` found leaked locks.
const EXIT_FINDINGS: u8 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "tenure",
    version,
    about = "Distributed locks with fencing tokens"
)]
struct Cli {
    /// Backend URL (memory://, redis://, redlock://h1,h2,h3, file:///var/lock/tenure, …).
    /// With neither this nor --config: this host's lock directory (file://; see `tenure
    /// run`'s note on stderr).
    #[arg(long, global = true, env = "TENURE_URL", hide_env_values = true)]
    url: Option<String>,
    /// TOML config file with `url`, `ttl`, `wait`.
    #[arg(long, global = true, conflicts_with = "url")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure lock cycles/s and latency (JSON lines with --json), optionally against the
    /// raw protocol floor; --all-local starts every backend's servers and runs them all.
    #[cfg(feature = "lab")]
    Bench(bench::BenchArgs),
    /// The decision matrix, measured: starts every backend's servers (or uses
    /// --clusters), runs the suite, fault scenarios and a performance run, and writes
    /// matrix.md, matrix.json and matrix.html. Exits 1 when a cell is outside the
    /// verdicts its protocol allows (⚠), unless --allow-mismatch.
    #[cfg(feature = "lab")]
    Matrix(matrix::MatrixArgs),
    /// Run CMD while holding the lock; renews it and passes TENURE_FENCE and TENURE_KEY.
    /// CMD runs in its own process group, which is stopped (SIGTERM, then SIGKILL after
    /// --grace) before the lease could expire if renewals fail, and when tenure gets
    /// SIGTERM, SIGINT or SIGHUP. Exits with CMD's status (128+N if signal N killed it),
    /// 75 when the lock stayed busy, 76 when the lease was lost, 128+N when tenure was
    /// stopped by signal N.
    Run {
        #[command(flatten)]
        lock: LockArgs,
        /// Time between SIGTERM and SIGKILL when the command must stop (default 5s, at
        /// most a quarter of the TTL); must fit, with a margin, in half the TTL.
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// Keep the lock at least this long after it was granted, even if the command
        /// finishes sooner (a job scheduled on several hosts runs once per period).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        hold_at_least: Duration,
        /// Admit up to N runs of KEY at once, fleet-wide (1 to 64): each run holds one
        /// permit, KEY#permit-I, which TENURE_KEY names; TENURE_FENCE orders that
        /// permit's runs. Every run of KEY must give the same N: a run whose N differs
        /// from a live permit's is refused (exit 78, naming both); to change N, let the
        /// runs drain or use a new KEY.
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
        /// Run as a reader of KEY (each KEY, with several): runs with --shared hold it
        /// together, a run without (a writer) holds it alone, and a writer waiting for
        /// it holds back the readers that come after it. For backends with shared locks
        /// (exit 78 on the others).
        #[arg(long, conflicts_with = "permits")]
        shared: bool,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Hot standby: wait until this process leads NAME (an election, see
    /// `tenure_api::Election`), run CMD while it leads, stop CMD when the leadership is lost.
    /// VALUE is the leader's value, shown by `tenure inspect NAME` as its label;
    /// TENURE_FENCE is the term (send it with every write), TENURE_KEY the name. Waits
    /// without bound unless --wait says otherwise. Exits as `tenure run` does (76 when
    /// the leadership was lost): restart it (systemd `Restart=always`) to stand by again.
    Elect {
        /// The name led.
        #[arg(long)]
        name: String,
        /// The leader's value (1 to 256 bytes, no control characters).
        #[arg(long)]
        value: String,
        /// Leadership TTL: how long a leader that stops renewing keeps the name (default:
        /// TENURE_TTL, else the config file's ttl, else 30s).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// How long to wait for the leadership (default: without bound).
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        /// Time between SIGTERM and SIGKILL when the command must stop (as for `run`).
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Internal: the process that runs CMD for `tenure run` (see run.rs).
    #[command(name = "__keeper", hide = true)]
    Keeper {
        /// The pid of the `tenure run` that started it.
        parent: i32,
        /// The path of the socket on which tenure tells the lease deadlines.
        #[arg(long)]
        switch: Option<std::path::PathBuf>,
        /// The lease's deadline when the command starts, ns of CLOCK_MONOTONIC.
        #[arg(long)]
        deadline_ns: Option<u64>,
        /// The stop plan: SIGTERM-to-SIGKILL time, ms.
        #[arg(long, default_value_t = 0)]
        grace_ms: u64,
        /// The stop plan: time kept after SIGKILL, ms.
        #[arg(long, default_value_t = 0)]
        margin_ms: u64,
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Acquire the lock and print the lease as JSON, for scripts (TTL backends: redis,
    /// redlock, etcd; ZooKeeper, Postgres and file locks end with the process).
    Acquire {
        #[command(flatten)]
        lock: LockArgs,
    },
    /// Extend a lease printed by `acquire` (read from stdin).
    Extend {
        /// New TTL.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
    /// Release a lease printed by `acquire` (read from stdin).
    Release,
    /// Show who holds KEY: owner, fencing token, remaining time, label. With --prefix, one JSON
    /// line per held lock whose key starts with PREFIX ("" for all).
    Inspect {
        /// The lock key.
        #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
        key: Option<String>,
        /// List every held lock whose key starts with this.
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Look for leaked locks (Redis keys without TTL, etcd keys without a live lease,
    /// ZooKeeper nodes that are not ephemeral, Postgres holders idle past their TTL, file
    /// locks held past their deadline by a stopped process):
    /// one JSON line per finding. Exits 1 when it found any, 0 when clean.
    Doctor,
}

#[derive(Args, Debug)]
struct LockArgs {
    /// The lock key. `run` takes it more than once to hold several keys at once, all or
    /// none (taken in sorted order, so runs on overlapping keys never deadlock).
    #[arg(long, required = true)]
    key: Vec<String>,
    /// Lease TTL (default: TENURE_TTL, else the config file's ttl, else 30s).
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// How long to wait for a held lock (default: TENURE_WAIT, else the config file's
    /// wait, else 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// A text recorded with the grant that `tenure inspect` shows while it is held (who
    /// holds it: a host name, a job id), 1 to 256 bytes without control characters (245
    /// with --permits, whose count is recorded with it as `permits=N LABEL`).
    #[arg(long)]
    label: Option<String>,
}

/// A lease as `tenure acquire` prints it (the handle fields carry backend data such as
/// etcd's lease id and key).
#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct LeaseJson {
    key: String,
    owner: String,
    token: u64,
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    path: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    id: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    revision: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Keeper {
        parent,
        switch,
        deadline_ns,
        grace_ms,
        margin_ms,
        cmd,
    } = &cli.command
    {
        let plan = run::StopPlan::from_millis(*grace_ms, *margin_ms);
        return run::keeper(*parent, switch.as_deref(), *deadline_ns, plan, cmd);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tenure: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_BACKEND);
        }
    };
    // `run` runs on this (the main) thread: `tenure run` forks its keeper from here.
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tenure: {}", tenure::redact_url(&error.to_string()));
            ExitCode::from(match error {
                LockError::Timeout { .. } => EXIT_BUSY,
                LockError::LeaseLost { .. } => EXIT_LOST,
                LockError::Config(_) | LockError::InvalidInput(_) => EXIT_CONFIG,
                _ => EXIT_BACKEND,
            })
        }
    }
}

/// The configuration: the file or the URL, then `TENURE_TTL` / `TENURE_WAIT`, then the
/// lock flags (flag > environment > file > default).
fn config(cli: &Cli) -> Result<Config, LockError> {
    let mut config = match (&cli.config, &cli.url) {
        (Some(path), _) => Config::from_file(path)?,
        (None, Some(url)) => Config::new(url.clone()),
        (None, None) => {
            let url = default_url()?;
            eprintln!(
                "tenure: no --url, --config or TENURE_URL: locking with the files in {} \
                 (this host's processes only)",
                url.trim_start_matches("file://")
            );
            Config::new(url)
        }
    };
    config.override_from_env()?;
    if let Command::Run { lock, .. } | Command::Acquire { lock } = &cli.command {
        lock.apply(&mut config);
        config.session_timeout_from_ttl();
    }
    if let Command::Elect { ttl, wait, .. } = &cli.command {
        config.ttl = ttl.unwrap_or(config.ttl);
        config.wait = wait.unwrap_or(Duration::MAX);
        config.session_timeout_from_ttl();
    }
    Ok(config)
}

/// The backend with nothing configured: this host's lock directory
/// ([`tenure::file::default_dir`]).
fn default_url() -> Result<String, LockError> {
    Ok(tenure::file::FileConfig::in_dir(tenure::file::default_dir()?)?.url())
}

impl LockArgs {
    /// Puts `--ttl` and `--wait`, where given, over the configuration's.
    fn apply(&self, config: &mut Config) {
        config.ttl = self.ttl.unwrap_or(config.ttl);
        config.wait = self.wait.unwrap_or(config.wait);
    }

    /// The keys, the TTL and wait of `config` (which [`config`] gave the flags), and the
    /// label.
    fn options(&self, config: &Config) -> Result<(Vec<LockKey>, AcquireOptions), LockError> {
        let mut opts = config.acquire_options();
        opts.label.clone_from(&self.label);
        let keys = self.key.iter().cloned().map(LockKey::new);
        Ok((keys.collect::<Result<_, _>>()?, opts))
    }

    /// As [`options`](Self::options), for a command that takes one key.
    fn one_key(
        &self,
        config: &Config,
        command: &str,
    ) -> Result<(LockKey, AcquireOptions), LockError> {
        let (mut keys, opts) = self.options(config)?;
        match (keys.pop(), keys.is_empty()) {
            (Some(key), true) => Ok((key, opts)),
            _ => Err(LockError::InvalidInput(format!(
                "`tenure {command}` takes one --key (only `tenure run` holds several)"
            ))),
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, LockError> {
    match &cli.command {
        #[cfg(feature = "lab")]
        Command::Bench(args) => return until_stopped(bench::run(cli.url.as_deref(), args)).await,
        #[cfg(feature = "lab")]
        Command::Matrix(args) => return until_stopped(matrix::run(args)).await,
        _ => {}
    }
    let config = config(&cli)?;
    let lock = config.connect().await?;
    match cli.command {
        #[cfg(feature = "lab")]
        Command::Bench(_) | Command::Matrix(_) => unreachable!("handled above"),
        Command::Keeper { .. } => unreachable!("handled above"),
        Command::Run {
            lock: args,
            grace,
            hold_at_least,
            permits,
            shared,
            cmd,
        } => {
            let (keys, opts) = args.options(&config)?;
            if let Some(key) = keys
                .iter()
                .find(|k| keys.len() > 1 && k.as_str().contains(','))
            {
                return Err(LockError::InvalidInput(format!(
                    "`{key}` contains a comma: with several --key, TENURE_KEY joins them with \
                     commas"
                )));
            }
            let lock = match permits {
                Some(_) if keys.len() > 1 => {
                    return Err(LockError::InvalidInput(
                        "--permits takes one --key: a semaphore is one name's permits".into(),
                    ))
                }
                Some(permits) => Arc::new(Semaphore::new(lock, permits)?),
                None => lock,
            };
            let options = run::RunOptions {
                grace,
                hold_at_least,
                shared,
            };
            run::run_under_lock(lock, keys, opts, options, cmd).await
        }
        Command::Elect {
            name,
            value,
            grace,
            cmd,
            ..
        } => {
            // Refuses backends that cannot hold elections (no labels, no terms).
            let election = Election::new(lock.clone())?.with_ttl(config.ttl)?;
            let name = LockKey::new(name)?;
            let opts = election.campaign_options(&value, config.wait);
            let options = run::RunOptions {
                grace,
                hold_at_least: Duration::ZERO,
                shared: false,
            };
            run::run_under_lock(lock, vec![name], opts, options, cmd).await
        }
        Command::Acquire { lock: args } => {
            let (key, opts) = args.one_key(&config, "acquire")?;
            let expiry = lock.capabilities().expiry;
            if matches!(
                expiry,
                ExpiryKind::SessionHeartbeat
                    | ExpiryKind::ConnectionTransaction
                    | ExpiryKind::HolderProcess
            ) {
                return Err(LockError::InvalidInput(format!(
                    "a {} lock lives only as long as this process, its session or its \
                     connection ({expiry:?}), so it would end as soon as `tenure acquire` \
                     exits: use `tenure run` instead",
                    lock.capabilities().backend
                )));
            }
            let lease = lock.acquire(&key, &opts).await?;
            print_lease(&lease);
            Ok(ExitCode::SUCCESS)
        }
        Command::Extend { ttl } => {
            let mut lease = read_lease()?;
            let ttl = ttl.unwrap_or(lease.ttl());
            lock.extend(&mut lease, ttl).await?;
            print_lease(&lease);
            Ok(ExitCode::SUCCESS)
        }
        Command::Release => {
            let outcome = lock.release(read_lease()?).await?;
            println!(
                "{}",
                serde_json::json!({ "released": outcome == ReleaseOutcome::Released })
            );
            Ok(if outcome == ReleaseOutcome::Released {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_LOST)
            })
        }
        Command::Inspect { key, prefix } => {
            let holders = match (key, prefix) {
                (_, Some(prefix)) => config.connect_admin().await?.holders(&prefix).await?,
                (Some(key), None) => {
                    let key = LockKey::new(key)?;
                    match lock.inspect(&key).await? {
                        Some(holder) => vec![(key, holder)],
                        None => {
                            println!(
                                "{}",
                                serde_json::json!({ "key": key.as_str(), "held": false })
                            );
                            return Ok(ExitCode::SUCCESS);
                        }
                    }
                }
                (None, None) => return Err(LockError::InvalidInput("give KEY or --prefix".into())),
            };
            for (key, h) in holders {
                let shown = serde_json::json!({
                    "key": key.as_str(),
                    "held": true,
                    "owner": h.owner.to_string(),
                    "token": h.token.map(FencingToken::get),
                    "remaining_ms": h.remaining.map(|r| r.as_millis() as u64),
                    "label": h.label,
                    "foreign": h.foreign,
                });
                println!("{shown}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => {
            let findings = config.connect_admin().await?.doctor().await?;
            for f in &findings {
                let shown = serde_json::json!({
                    "key": f.key,
                    "problem": f.problem.as_str(),
                    "location": f.location,
                    "detail": f.detail,
                });
                println!("{shown}");
            }
            eprintln!("tenure doctor: {} finding(s)", findings.len());
            Ok(if findings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_FINDINGS)
            })
        }
    }
}

/// Runs `work` until it ends or tenure gets SIGTERM, SIGINT or SIGHUP. On a signal the
/// work is dropped, which stops the servers it started (they run in process groups of
/// their own, out of reach of a terminal's Ctrl-C), and tenure exits 128+signal.
#[cfg(feature = "lab")]
async fn until_stopped(
    work: impl std::future::Future<Output = Result<ExitCode, LockError>>,
) -> Result<ExitCode, LockError> {
    let mut signals = run::StopSignals::new()?;
    tokio::select! {
        result = work => result,
        signal = signals.recv() => {
            eprintln!("tenure: received {signal}; stopping");
            Ok(run::signalled(signal))
        }
    }
}

fn print_lease(lease: &Lease) {
    let json = LeaseJson {
        key: lease.key().to_string(),
        owner: lease.owner().to_string(),
        token: lease.token().get(),
        ttl_ms: lease.ttl().as_millis() as u64,
        path: lease.handle().path.clone(),
        id: lease.handle().id,
        revision: lease.handle().revision,
    };
    println!("{}", serde_json::to_string(&json).unwrap_or_default());
}

fn read_lease() -> Result<Lease, LockError> {
    let mut text = String::new();
    std::io::stdin()
        .read_line(&mut text)
        .map_err(|e| LockError::InvalidInput(format!("cannot read the lease from stdin: {e}")))?;
    let json: LeaseJson = serde_json::from_str(text.trim()).map_err(|e| {
        LockError::InvalidInput(format!("not a lease printed by `tenure acquire`: {e}"))
    })?;
    Ok(Lease::new(
        LockKey::new(json.key)?,
        OwnerId::parse(&json.owner).map_err(|_| LockError::InvalidInput("bad owner id".into()))?,
        FencingToken(json.token),
        Instant::now(),
        Duration::from_millis(json.ttl_ms),
        Duration::ZERO,
    )
    .with_handle(LeaseHandle {
        path: json.path,
        id: json.id,
        revision: json.revision,
    }))
}
