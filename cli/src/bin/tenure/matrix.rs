//! `tenure matrix`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tenure::LockError;
use tenure_cli::matrix::{
    self, report, ClustersConfig, Fault, MatrixOptions, Progress, Soak, Source,
};

/// Trials around each of a soak's injections, unless `--trials` says otherwise.
const SOAK_TRIALS: usize = 4;

#[derive(Args, Debug)]
pub(crate) struct MatrixArgs {
    /// The 2-minute version (3 trials per fault, one injection, short perf runs).
    #[arg(long)]
    quick: bool,
    /// Trials per fault and backend (default 20; 3 with --quick).
    #[arg(long)]
    trials: Option<usize>,
    /// Separate injections of each server fault (default 4; 1 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds per performance mode (default 2; 0.3 with --quick).
    #[arg(long)]
    perf_secs: Option<f64>,
    /// Columns to run, comma-separated: backends, and configurations measured as columns
    /// of their own, such as `postgres lease` (default: all of this build).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// A trimmed run: only these fault cells (kebab-case names, as in matrix.json, e.g.
    /// `blackhole,lost-reply`), without the shared suite and the performance runs.
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// With `--faults`: run the shared suite and the performance runs too.
    #[arg(long, requires = "faults")]
    with_suite: bool,
    /// Prints the names of the deliberately broken variants (run one with
    /// `--backends broken:NAME`), one per line.
    #[arg(long, hide = true)]
    list_broken: bool,
    /// Run against your own clusters: a TOML file whose `backends` table lists URLs.
    #[arg(long, conflicts_with = "tls")]
    clusters: Option<PathBuf>,
    /// Start local servers that require TLS (certificates from a throwaway CA, client
    /// certificates too) and a password, and connect as a user with only the privileges
    /// docs/security.md lists.
    #[arg(long)]
    tls: bool,
    /// Directory for matrix.md, matrix.json and matrix.html.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// A chaos run: for this long per backend (`60s`, `30m`), faults drawn at random from
    /// those its servers allow (with `--faults`, from those), each draw a cell of
    /// `--trials` trials (default 4); no suite, no performance runs.
    #[arg(long, value_parser = humantime::parse_duration,
          conflicts_with_all = ["quick", "rounds", "perf_secs"])]
    soak: Option<Duration>,
    /// Seeds a soak's draws: the same seed draws the same faults in the same order
    /// (default: a random seed, given in the report).
    #[arg(long, requires = "soak")]
    seed: Option<u64>,
    /// Exit 0 even when a cell or a declared capability is outside the expected
    /// verdicts (⚠); the warning is still printed.
    #[arg(long)]
    allow_mismatch: bool,
}

/// The fault named `name` as in matrix.json.
fn fault_named(name: &str) -> Result<Fault, LockError> {
    Fault::ALL
        .into_iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
            LockError::InvalidInput(format!(
                "unknown fault {name:?} for --faults (known: {})",
                known.join(", ")
            ))
        })
}

/// The broken variants' names.
fn broken_names() -> Vec<&'static str> {
    tenure_cli::local::broken_names()
}

pub(crate) async fn run(args: &MatrixArgs) -> Result<ExitCode, LockError> {
    if args.list_broken {
        for name in broken_names() {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut options = if args.quick {
        MatrixOptions::quick()
    } else {
        MatrixOptions::default()
    };
    options.trials = args.trials.unwrap_or(options.trials);
    options.rounds = args.rounds.unwrap_or(options.rounds);
    options.perf_secs = args.perf_secs.unwrap_or(options.perf_secs);
    options.tls = args.tls;
    if !args.faults.is_empty() {
        let wanted = args
            .faults
            .iter()
            .map(|name| fault_named(name))
            .collect::<Result<Vec<_>, _>>()?;
        options.faults.retain(|f| wanted.contains(f));
        options.suite_and_perf = args.with_suite;
    }
    if let Some(duration) = args.soak {
        if duration.is_zero() {
            return Err(LockError::InvalidInput("--soak must be positive".into()));
        }
        options.soak = Some(Soak {
            secs: duration.as_secs_f64(),
            seed: args.seed.unwrap_or_else(rand::random),
        });
        options.trials = args.trials.unwrap_or(SOAK_TRIALS);
        options.rounds = 1;
        options.suite_and_perf = false;
    }
    if options.trials == 0
        || options.rounds == 0
        || !options.perf_secs.is_finite()
        || options.perf_secs <= 0.0
    {
        return Err(LockError::InvalidInput(
            "--trials, --rounds and --perf-secs must be positive".into(),
        ));
    }
    let sources: Vec<(String, Source)> = match &args.clusters {
        Some(path) => ClustersConfig::from_file(path)?
            .backends
            .into_iter()
            .map(|(name, url)| (name, Source::External(url)))
            .collect(),
        None => options
            .backends
            .iter()
            .chain(args.backends.iter().filter(|b| b.starts_with("broken:")))
            .map(|name| {
                let secured = args.tls;
                (name.clone(), Source::Local { secured })
            })
            .collect(),
    };
    for name in args.backends.iter() {
        if let Some(variant) = name.strip_prefix("broken:") {
            if !broken_names().contains(&variant) {
                return Err(LockError::InvalidInput(format!(
                    "no broken variant {variant:?} (see --list-broken)"
                )));
            }
        }
    }
    let sources: Vec<_> = sources
        .into_iter()
        .filter(|(name, _)| args.backends.is_empty() || args.backends.contains(name))
        .collect();
    if sources.is_empty() {
        return Err(LockError::InvalidInput("no backend selected".into()));
    }
    options.backends = sources.iter().map(|(name, _)| name.clone()).collect();
    let progress = Progress::new();
    let measured = matrix::run(sources, &options, &progress).await;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| LockError::Config(format!("{}: {e}", args.out.display())))?;
    for (file, text) in [
        ("matrix.md", report::markdown(&measured)),
        ("matrix.json", report::json(&measured)),
        ("matrix.html", report::html(&measured)),
    ] {
        let path = args.out.join(file);
        std::fs::write(&path, text)
            .map_err(|e| LockError::Config(format!("writing {}: {e}", path.display())))?;
    }
    println!("{}", report::terminal(&measured));
    eprintln!(
        "tenure matrix: wrote {}/matrix.{{md,json,html}} in {:.0} s",
        args.out.display(),
        measured.elapsed_secs
    );
    let broken = measured.backends.iter().any(|b| b.error.is_some());
    let mismatches = measured.mismatches();
    if !mismatches.is_empty() {
        eprintln!(
            "tenure matrix: ⚠ {} outside the expected verdicts{}: {}",
            mismatches.len(),
            if args.allow_mismatch {
                " (allowed by --allow-mismatch)"
            } else {
                " (--allow-mismatch to exit 0)"
            },
            mismatches.join("; ")
        );
    }
    Ok(
        if broken || (!mismatches.is_empty() && !args.allow_mismatch) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}
