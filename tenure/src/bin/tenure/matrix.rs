//! `tenure matrix`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tenure::matrix::{self, report, ClustersConfig, MatrixOptions, Progress, Source};
use tenure::LockError;

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
    /// Backends to run, comma-separated (default: all of this build).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Run against your own clusters: a TOML file with a [backends] table of URLs.
    #[arg(long)]
    clusters: Option<PathBuf>,
    /// Directory for matrix.md, matrix.json and matrix.html.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Exit 0 even when a cell or a declared capability is outside the expected
    /// verdicts (⚠); the warning is still printed.
    #[arg(long)]
    allow_mismatch: bool,
}

pub(crate) async fn run(args: &MatrixArgs) -> Result<ExitCode, LockError> {
    let mut options = if args.quick {
        MatrixOptions::quick()
    } else {
        MatrixOptions::default()
    };
    options.trials = args.trials.unwrap_or(options.trials);
    options.rounds = args.rounds.unwrap_or(options.rounds);
    options.perf_secs = args.perf_secs.unwrap_or(options.perf_secs);
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
            .map(|name| (name.clone(), Source::Local))
            .collect(),
    };
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
