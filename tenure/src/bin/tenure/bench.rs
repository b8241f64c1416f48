//! `tenure bench`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tenure::bench::{self, BenchLine, BenchOptions, HeldLine, Mode};
use tenure::local::{self, LocalOptions};
use tenure::LockError;

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
    /// Also run the raw protocol floor, interleaved, and print library/floor ratios.
    #[arg(long)]
    floor: bool,
    /// Start local servers for every backend of this build and bench them all (plus
    /// memory://); ignores --url.
    #[arg(long)]
    all_local: bool,
    /// Also hold this many leases at once with renewing guards and report the RSS
    /// (memory:// and redis with --all-local, else the --url backend).
    #[arg(long)]
    held: Option<usize>,
    /// Print JSON lines (DESIGN.md §6) instead of a Markdown table.
    #[arg(long)]
    json: bool,
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
    };
    let mut rows = Vec::new();
    if args.all_local {
        let mut targets = vec![("memory".to_owned(), "memory://".to_owned(), None)];
        for name in local::backends() {
            eprintln!("tenure bench: starting local {name} servers");
            let backend = local::start(name, LocalOptions::default())
                .await
                .map_err(|e| LockError::backend(format!("starting local {name}: {e}")))?;
            targets.push((name.to_owned(), backend.harness.url(), Some(backend)));
        }
        for (name, url, _servers) in &targets {
            let floor = options.floor && name != "memory";
            let options = BenchOptions { floor, ..options };
            bench_url(url, &modes, options, args.json, &mut rows).await?;
            if let (Some(leases), "memory" | "redis") = (args.held, name.as_str()) {
                held(url, leases, args.ttl, args.json, &mut rows).await?;
            }
        }
    } else {
        let url = url.ok_or_else(|| {
            LockError::Config("no backend: pass --url, set TENURE_URL, or use --all-local".into())
        })?;
        bench_url(url, &modes, options, args.json, &mut rows).await?;
        if let Some(leases) = args.held {
            held(url, leases, args.ttl, args.json, &mut rows).await?;
        }
    }
    if !args.json {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench_url(
    url: &str,
    modes: &[Mode],
    options: BenchOptions,
    json: bool,
    rows: &mut Vec<Row>,
) -> Result<(), LockError> {
    for &mode in modes {
        for line in bench::run(url, mode, options).await? {
            if json {
                println!("{}", serde_json::to_string(&line).unwrap_or_default());
            } else {
                eprintln!(
                    "tenure bench: {} {} {}: {:.0} cycles/s",
                    line.backend, line.mode, line.implementation, line.cycles_per_s
                );
            }
            rows.push(Row::Cycles(line));
        }
    }
    Ok(())
}

async fn held(
    url: &str,
    leases: usize,
    ttl: Duration,
    json: bool,
    rows: &mut Vec<Row>,
) -> Result<(), LockError> {
    let line = bench::held(url, leases, ttl).await?;
    if json {
        println!("{}", serde_json::to_string(&line).unwrap_or_default());
    }
    rows.push(Row::Held(line));
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!(
        "| backend | mode | impl | cycles/s | hand-offs/s | p50 µs | p99 µs | errors | tenure/floor |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        if let Row::Cycles(l) = row {
            let ratio = l.ratio.map_or(String::new(), |r| format!("{r:.2}×"));
            let handoffs = l
                .handoffs_per_s
                .map_or(String::new(), |h| format!("{h:.0}"));
            println!(
                "| {} | {} | {} | {:.0} | {handoffs} | {} | {} | {} | {ratio} |",
                l.backend, l.mode, l.implementation, l.cycles_per_s, l.p50_us, l.p99_us, l.errors
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
        println!("| backend | leases held with guards | RSS before MiB | RSS held MiB | acquire s | lost |");
        println!("|---|---:|---:|---:|---:|---:|");
        for h in held {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                h.backend, h.leases, h.rss_before_mb, h.rss_held_mb, h.acquire_secs, h.lost
            );
        }
    }
}
