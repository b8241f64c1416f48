//! `tenure bench`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tenure::LockError;
use tenure_cli::bench::{self, BenchLine, BenchOptions, HeldLine, Mode};
use tenure_cli::local::{self, TestbedOptions};

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Modes to run, comma-separated: seq, par64, contended (default: all).
    #[arg(long, value_delimiter = ',')]
    mode: Vec<Mode>,
    /// Measured seconds per mode and implementation.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Lease TTL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Also run the floors, interleaved: the protocol floor (the plain client doing the least
    /// a lock needs) and, for a lock's seq and par64, the same-work floor (the plain client
    /// sending tenure's own server work); print tenure/floor ratios.
    #[arg(long)]
    floor: bool,
    /// Also run the backend's peer library where the bench has one (ZooKeeper:
    /// zookeeper-client's lock recipe), interleaved, and print tenure/peer ratios.
    #[arg(long, conflicts_with_all = ["permits", "election", "keys", "shared"])]
    peers: bool,
    /// Rounds (1..=100): every backend and mode is run this many times, round-robin, and
    /// each line reports the medians over its rounds (ratios taken within each round).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// Start local servers for every backend of this build and bench them all (plus
    /// memory://, and Postgres again with `locking=advisory` against its advisory floor);
    /// ignores --url.
    #[arg(long)]
    all_local: bool,
    /// Also hold this many leases at once with renewing guards and report the RSS and how
    /// many the backend allowed (every backend with --all-local, else the --url backend).
    #[arg(long)]
    held: Option<usize>,
    /// Print JSON lines (DESIGN.md §6) instead of a Markdown table.
    #[arg(long)]
    json: bool,
    /// Bench a semaphore of N permits per key instead of the lock (1 to 64); the seq and
    /// par64 floors stay the plain client's, the contended floor polls the semaphore.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Bench an election instead of the lock: a cycle is a campaign and a resignation
    /// (contended: 16 candidates, a hand-off is a change of leader); the contended floor
    /// campaigns in a 10 ms polling loop.
    #[arg(long, conflicts_with = "permits")]
    election: bool,
    /// Bench a multi-lock of N keys (2 to 64) instead of the lock: a cycle takes them all
    /// and releases them; the seq and par64 floor is the same client taking the keys one
    /// by one with plain leases, the contended floor polls the multi-lock.
    #[arg(long, value_name = "N", conflicts_with_all = ["permits", "election"])]
    keys: Option<u32>,
    /// Bench a reader (a read-write lock's read side) instead of the lock, on a backend
    /// with shared locks: the seq and par64 floor is the same client's plain (exclusive)
    /// lock, the contended floor (16 readers of one key) polls as a reader every 10 ms.
    /// One --url at a time (not every backend has readers).
    #[arg(long, conflicts_with_all = ["permits", "election", "keys", "all_local", "held"])]
    shared: bool,
}

/// One printed result.
enum Row {
    Cycles(BenchLine),
    Held(HeldLine),
}

pub(crate) async fn run(url: Option<&str>, args: &BenchArgs) -> Result<ExitCode, LockError> {
    let modes = if args.mode.is_empty() {
        Mode::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    let options = BenchOptions {
        secs: args.secs,
        ttl: args.ttl,
        floor: args.floor,
        permits: args.permits,
        election: args.election,
        keys: args.keys,
        shared: args.shared,
        peers: args.peers,
    };
    let mut rows = Vec::new();
    let mut cycles = Vec::new();
    if args.all_local {
        let mut targets = vec![("memory".to_owned(), "memory://".to_owned(), None)];
        for name in local::backends() {
            eprintln!("tenure bench: starting local {name} servers");
            let backend = local::start(name, TestbedOptions::BENCH)
                .await
                .map_err(|e| LockError::backend(format!("starting local {name}: {e}")))?;
            let url = backend.harness.url();
            // The backend's other configurations, on the same servers.
            let variants = backend.testbed.bench_variants.iter();
            let variants = variants.map(|v| (format!("{name} {}", v.name), v.url(&url), None));
            let variants: Vec<_> = variants.collect();
            targets.push((name.to_owned(), url, Some(backend)));
            targets.extend(variants);
        }
        for round in 1..=args.repeat {
            for (name, url, _servers) in &targets {
                let floor = options.floor && name != "memory";
                let options = BenchOptions { floor, ..options };
                bench_url(url, &modes, options, round, &mut cycles).await?;
            }
        }
        rows.extend(bench::medians(&cycles).into_iter().map(Row::Cycles));
        for (name, url, _servers) in &targets {
            if let Some(leases) = args.held {
                eprintln!("tenure bench: holding {leases} leases on {name}");
                held(url, leases, args.ttl, &mut rows).await?;
            }
        }
    } else {
        let url = url.ok_or_else(|| {
            LockError::Config("no backend: pass --url, set TENURE_URL, or use --all-local".into())
        })?;
        for round in 1..=args.repeat {
            bench_url(url, &modes, options, round, &mut cycles).await?;
        }
        rows.extend(bench::medians(&cycles).into_iter().map(Row::Cycles));
        if let Some(leases) = args.held {
            held(url, leases, args.ttl, &mut rows).await?;
        }
    }
    if args.json {
        for row in &rows {
            let line = match row {
                Row::Cycles(line) => serde_json::to_string(line),
                Row::Held(line) => serde_json::to_string(line),
            };
            println!("{}", line.unwrap_or_default());
        }
    } else {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

/// One round of every mode against `url`; progress on stderr.
async fn bench_url(
    url: &str,
    modes: &[Mode],
    options: BenchOptions,
    round: u32,
    lines: &mut Vec<BenchLine>,
) -> Result<(), LockError> {
    for &mode in modes {
        for line in bench::run(url, mode, options).await? {
            eprintln!(
                "tenure bench: round {round}: {} {} {}: {:.0} cycles/s",
                line.backend, line.mode, line.implementation, line.cycles_per_s
            );
            lines.push(line);
        }
    }
    Ok(())
}

async fn held(
    url: &str,
    leases: usize,
    ttl: Duration,
    rows: &mut Vec<Row>,
) -> Result<(), LockError> {
    rows.push(Row::Held(bench::held(url, leases, ttl).await?));
    Ok(())
}

fn print_table(rows: &[Row]) {
    // The tenure/peer column only where a peer ran.
    let peers = rows
        .iter()
        .any(|r| matches!(r, Row::Cycles(l) if l.peer_ratio.is_some()));
    let (peer_head, peer_rule) = if peers {
        (" tenure/peer |", "---:|")
    } else {
        ("", "")
    };
    println!(
        "| backend | mode | impl | cycles/s | hand-offs/s | fairness | p50 µs | p99 µs | errors | ÷ floor | ÷ same-work |{peer_head} CPU µs/cycle | switches/cycle | allocs/cycle |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|{peer_rule}---:|---:|---:|");
    let times = |r: Option<f64>| r.map_or(String::new(), |r| format!("{r:.2}×"));
    for row in rows {
        if let Row::Cycles(l) = row {
            let ratio = times(l.ratio);
            let same_work_ratio = times(l.same_work_ratio);
            let number =
                |n: Option<f64>, places| n.map_or(String::new(), |n| format!("{n:.places$}"));
            let (cpu, switches, allocs) = (
                number(l.cpu_us_per_cycle, 1),
                number(l.switches_per_cycle, 2),
                number(l.allocs_per_cycle, 1),
            );
            let peer_ratio = if peers {
                format!(" {} |", times(l.peer_ratio))
            } else {
                String::new()
            };
            let handoffs = l
                .handoffs_per_s
                .map_or(String::new(), |h| format!("{h:.0}"));
            let fairness = l.fairness.map_or(String::new(), |f| format!("{f:.2}"));
            let implementation = match (l.permits, l.election, l.keys, l.shared) {
                (Some(n), _, _, _) => format!("{} ({n} permits)", l.implementation),
                (None, true, _, _) => format!("{} (election)", l.implementation),
                (None, false, Some(n), _) => format!("{} ({n} keys)", l.implementation),
                (None, false, None, true) => format!("{} (reader)", l.implementation),
                (None, false, None, false) => l.implementation.to_owned(),
            };
            println!(
                "| {} | {} | {implementation} | {:.0} | {handoffs} | {fairness} | {} | {} | {} | {ratio} | {same_work_ratio} |{peer_ratio} {cpu} | {switches} | {allocs} |",
                l.backend, l.mode, l.cycles_per_s, l.p50_us, l.p99_us, l.errors
            );
        }
    }
    let held: Vec<&HeldLine> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Held(h) => Some(h),
            Row::Cycles(_) => None,
        })
        .collect();
    if !held.is_empty() {
        println!();
        println!("| backend | leases held with guards | RSS before MiB | RSS held MiB | acquire s | lost | refused |");
        println!("|---|---:|---:|---:|---:|---:|---|");
        for h in held {
            let refused = h.refused.as_deref().unwrap_or("");
            println!(
                "| {} | {} of {} | {} | {} | {} | {} | {refused} |",
                h.backend, h.held, h.leases, h.rss_before_mb, h.rss_held_mb, h.acquire_secs, h.lost
            );
        }
    }
}
