//! Renders a [`Matrix`]: Markdown (for the README), a self-contained HTML page with the
//! outcome grid and charts, and the comparison of seed 003's claims with measurements.

use std::fmt::Write as _;

use serde::Serialize;

use tenure_conformance::LostUpdates;

use super::{BackendReport, Matrix};
use super::{Cell, Fault, Verdict};
use crate::bench::{BenchLine, Mode};

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// CPU count, memory and kernel of this machine.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| (kb / 1024.0 / 1024.0).round());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, {mem_gib} GiB RAM, Linux {}", kernel.trim())
}

fn perf(report: &BackendReport, mode: Mode) -> Option<&BenchLine> {
    report
        .perf
        .iter()
        .find(|l| l.mode == mode && l.implementation == "tenure")
}

fn cell(report: &BackendReport, fault: Fault) -> Option<&Cell> {
    report
        .faults
        .iter()
        .find(|f| f.fault == fault)
        .map(|f| &f.cell)
}

fn suite_summary(report: &BackendReport) -> String {
    if report.suite.is_empty() {
        return "not run".into();
    }
    let count = |r| report.suite.iter().filter(|s| s.result == r).count();
    let failed = count("failed");
    let mut text = format!("{} passed", count("passed"));
    if failed > 0 {
        let _ = write!(text, ", **{failed} failed**");
    }
    if count("ignored") > 0 {
        let _ = write!(text, ", {} ignored", count("ignored"));
    }
    text
}

/// One row of "seed claims vs measured".
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedClaim {
    /// What the seed says, and where.
    pub claim: &'static str,
    /// What this run measured.
    pub measured: String,
    /// `holds`, `contradicted`, `partly` or `not measurable here`.
    pub assessment: &'static str,
}

fn backend<'a>(matrix: &'a Matrix, name: &str) -> Option<&'a BackendReport> {
    matrix
        .backends
        .iter()
        .find(|b| b.backend == name && b.error.is_none())
}

fn has(cell: Option<&Cell>, verdict: Verdict) -> bool {
    cell.is_some_and(|c| c.verdicts().contains(&verdict))
}

/// Whether the cell ran with at least one trial in which the fault fired.
fn ran(cell: Option<&Cell>) -> bool {
    cell.is_some_and(|c| !c.verdicts().is_empty())
}

/// Seed 003's decision matrix (§35.5.1, §35.5.2) and §35.5.3/§35.5.4, row by row, against
/// this run.
pub fn seed_claims(matrix: &Matrix) -> Vec<SeedClaim> {
    let mut claims = Vec::new();
    let throughput = |name: &str| {
        backend(matrix, name)
            .and_then(|b| perf(b, Mode::Par64))
            .map(|l| l.cycles_per_s)
    };
    if let (Some(redis), Some(zk)) = (throughput("redis"), throughput("zk")) {
        claims.push(SeedClaim {
            claim: "§35.5.2 throughput: Redis 100,000+ ops/s, ZooKeeper tens of thousands",
            measured: format!(
                "par64 lock cycles/s (acquire + release, 2+ round trips): redis {redis:.0}, \
                 zk {zk:.0} (redis/zk = {:.1}×) on this machine, one client process",
                redis / zk.max(1.0)
            ),
            assessment: if redis > zk { "partly" } else { "contradicted" },
        });
    }
    if let Some(redis) = backend(matrix, "redis") {
        let failover = cell(redis, Fault::ReplicaFailover);
        let sentinel = cell(redis, Fault::SentinelFailover);
        let cluster = cell(redis, Fault::ClusterFailover);
        let restart = cell(redis, Fault::Restart);
        claims.push(SeedClaim {
            claim: "§35.5.2 Redis consistency protocol: none (single node); §35.5.1 SET NX: \
                    occasional concurrent execution",
            measured: format!(
                "failover to async replica: {}; Sentinel failover: {}; Cluster failover: {}; \
                 restart without persistence: {}",
                failover.map_or("—".into(), Cell::summary),
                sentinel.map_or("—".into(), Cell::summary),
                cluster.map_or("—".into(), Cell::summary),
                restart.map_or("—".into(), Cell::summary)
            ),
            assessment: if [failover, sentinel, cluster, restart]
                .iter()
                .any(|c| has(*c, Verdict::Unsafe) || has(*c, Verdict::FencedSafe))
            {
                "holds"
            } else if ran(failover) || ran(sentinel) || ran(cluster) {
                "contradicted"
            } else {
                "not measurable here"
            },
        });
    }
    if let Some(redlock) = backend(matrix, "redlock") {
        let jump = cell(redlock, Fault::ClockJump);
        claims.push(SeedClaim {
            claim: "§35.5.2 Redlock is clock-dependent (Kleppmann, §35.4)",
            measured: format!(
                "one node's clock jumps while two clients reach overlapping majorities: {}",
                jump.map_or("—".into(), Cell::summary)
            ),
            assessment: if !ran(jump) {
                "not measurable here"
            } else if has(jump, Verdict::FencedSafe) || has(jump, Verdict::Unsafe) {
                "holds"
            } else {
                "contradicted"
            },
        });
    }
    for (name, claim) in [
        (
            "zk",
            "§35.5.2 ZooKeeper: Zab, strong consistency; ephemeral nodes deleted on session loss",
        ),
        (
            "etcd",
            "§35.5.4 etcd: Raft, \"guaranteed consistent regardless of clock skew\"",
        ),
    ] {
        if let Some(report) = backend(matrix, name) {
            let unsafe_cells: Vec<&str> = report
                .faults
                .iter()
                .filter(|f| has(Some(&f.cell), Verdict::Unsafe))
                .map(|f| f.title)
                .collect();
            let jump = cell(report, Fault::ClockJump);
            let injected = report.faults.iter().filter(|f| ran(Some(&f.cell))).count();
            claims.push(SeedClaim {
                claim,
                measured: format!(
                    "{}; server clock jump {}",
                    if unsafe_cells.is_empty() {
                        format!("no uncontained double grant under any of {injected} faults")
                    } else {
                        format!("UNSAFE under: {}", unsafe_cells.join(", "))
                    },
                    jump.map_or("—".into(), Cell::summary)
                ),
                assessment: if !unsafe_cells.is_empty() {
                    "contradicted"
                } else if ran(jump) {
                    "holds"
                } else {
                    "partly"
                },
            });
        }
    }
    let paused: Vec<String> = matrix
        .backends
        .iter()
        .filter(|b| b.error.is_none())
        .filter_map(|b| {
            cell(b, Fault::PausedHolder).map(|c| format!("{} {}", b.backend, c.summary()))
        })
        .collect();
    if !paused.is_empty() {
        claims.push(SeedClaim {
            claim: "§35.5.2 fencing token: manual for Redis, built in (zxid) for ZooKeeper",
            measured: format!(
                "tenure issues a token on every backend; holder paused past its TTL: {}",
                paused.join("; ")
            ),
            assessment: "partly",
        });
    }
    if let Some(pg) = backend(matrix, "postgres") {
        let unsafe_cells = pg
            .faults
            .iter()
            .filter(|f| has(Some(&f.cell), Verdict::Unsafe))
            .count();
        claims.push(SeedClaim {
            claim: "§35.5.3 a database row lock is the ground truth (ACID)",
            measured: format!(
                "UNSAFE cells: {unsafe_cells}; restart: {}; paused holder: {}",
                cell(pg, Fault::Restart).map_or("—".into(), Cell::summary),
                cell(pg, Fault::PausedHolder).map_or("—".into(), Cell::summary)
            ),
            assessment: if unsafe_cells == 0 {
                "holds"
            } else {
                "contradicted"
            },
        });
    }
    claims
}

/// The outcome grid: backends × faults.
fn grid(matrix: &Matrix, out: &mut String) {
    let names: Vec<&str> = matrix.backends.iter().map(|b| b.backend.as_str()).collect();
    let _ = writeln!(out, "| fault | {} |", names.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(names.len()));
    let _ = writeln!(
        out,
        "| shared suite | {} |",
        matrix
            .backends
            .iter()
            .map(suite_summary)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for fault in Fault::ALL {
        let row: Vec<String> = matrix
            .backends
            .iter()
            .map(|b| {
                b.faults
                    .iter()
                    .find(|f| f.fault == fault)
                    .map_or("—".into(), |f| {
                        let mut text = f.cell.summary();
                        if let Cell::Ran {
                            fencing_contained: Some(false),
                            ..
                        } = f.cell
                        {
                            text.push_str(" (fence did not contain)");
                        }
                        if f.mismatch {
                            text.push_str(" ⚠");
                        }
                        text
                    })
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", fault.title(), row.join(" | "));
    }
}

/// The share of `written` that `lost` is, in whole percent.
fn percent(lost: u64, written: u64) -> String {
    format!("{:.0} %", lost as f64 * 100.0 / written.max(1) as f64)
}

/// What fencing bought in a cell: its verdicts, and the share of its counter increments
/// lost by a store that ignores tokens and by one that checks them.
fn fencing_cell(cell: &Cell) -> String {
    match cell {
        Cell::Ran {
            updates:
                LostUpdates {
                    updates: written,
                    unfenced: lost_unfenced,
                    fenced: lost_fenced,
                },
            ..
        } if *written > 0 => format!(
            "{}: {} lost ({lost_unfenced} of {written}) · fenced {}",
            cell.summary(),
            percent(*lost_unfenced, *written),
            percent(*lost_fenced, *written)
        ),
        _ => cell.summary(),
    }
}

/// The rows of "What fencing buys": every fault under which some backend lost an update,
/// with each backend's [`fencing_cell`].
fn fencing_rows(matrix: &Matrix) -> Vec<(Fault, Vec<String>)> {
    Fault::ALL
        .into_iter()
        .filter(|&fault| {
            matrix.backends.iter().any(|b| {
                matches!(cell(b, fault), Some(Cell::Ran { updates, .. })
                    if updates.unfenced + updates.fenced > 0)
            })
        })
        .map(|fault| {
            let row = matrix
                .backends
                .iter()
                .map(|b| cell(b, fault).map_or("—".into(), fencing_cell))
                .collect();
            (fault, row)
        })
        .collect()
}

/// What each trial's counter lost without fencing and with it, where anything was lost.
fn fencing_table(matrix: &Matrix, out: &mut String) {
    let rows = fencing_rows(matrix);
    if rows.is_empty() {
        let _ = writeln!(out, "No trial lost an update, fenced or not.");
        return;
    }
    let names: Vec<&str> = matrix.backends.iter().map(|b| b.backend.as_str()).collect();
    let _ = writeln!(out, "| fault | {} |", names.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(names.len()));
    for (fault, row) in rows {
        let _ = writeln!(out, "| {} | {} |", fault.title(), row.join(" | "));
    }
}

/// How [`fencing_table`] is measured.
const FENCING_LEGEND: &str = "Jepsen's lock workload in the holder/contender trials \
    above: each client reads a counter when it is granted the lock and, when its work \
    ends, writes what it read plus one if it still believes it holds the lock — the holder \
    first (also if it believed so when the contender was granted), the contender last. A lost update is one a \
    store acknowledged that its final value does not count; \"lost\" is for a store that \
    ignores fencing tokens, \"fenced\" for one that rejects a token lower than the highest \
    it has seen. Rows: the faults under which some backend lost an update.";

fn perf_table(matrix: &Matrix, out: &mut String) {
    let _ = writeln!(
        out,
        "| backend | seq p50 µs | seq p99 µs | par64 cycles/s | contended hand-offs/s |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for b in &matrix.backends {
        let seq = perf(b, Mode::Seq);
        let par = perf(b, Mode::Par64);
        let contended = perf(b, Mode::Contended);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            b.backend,
            seq.map_or("—".into(), |l| l.p50_us.to_string()),
            seq.map_or("—".into(), |l| l.p99_us.to_string()),
            par.map_or("—".into(), |l| format!("{:.0}", l.cycles_per_s)),
            contended
                .and_then(|l| l.handoffs_per_s)
                .map_or("—".into(), |h| format!("{h:.0}")),
        );
    }
}

fn notes(matrix: &Matrix, out: &mut String) {
    for b in &matrix.backends {
        if let Some(error) = &b.error {
            let _ = writeln!(out, "- **{}**: {}", b.backend, tenure::redact_url(error));
        }
        if !b.ttl_why.is_empty() {
            let _ = writeln!(out, "- {}: trials' TTL {}", b.backend, b.ttl_why);
        }
        if !b.schedule.is_empty() {
            let drawn: Vec<&str> = b.schedule.iter().map(|f| f.title()).collect();
            let _ = writeln!(
                out,
                "- {}: {} draws: {}",
                b.backend,
                drawn.len(),
                drawn.join(", ")
            );
        }
        for f in b.faults.iter().filter(|f| f.mismatch) {
            let expected: Vec<&str> = f.expected.iter().map(|v| v.label()).collect();
            let _ = writeln!(
                out,
                "- ⚠ {} / {}: expected {} — {}",
                b.backend,
                f.title,
                if expected.is_empty() {
                    "not to run".to_string()
                } else {
                    expected.join(" or ")
                },
                f.reason
            );
        }
        for f in &b.faults {
            let reason = match &f.cell {
                Cell::NotInjectable { reason } => format!("not injectable: {reason}"),
                Cell::NotApplicable { reason } => format!("n/a: {reason}"),
                Cell::Unhealthy { reason } => format!("not run, backend unhealthy: {reason}"),
                Cell::Ran { notes, .. } if !notes.is_empty() => notes.join("; "),
                Cell::Ran { .. } => continue,
            };
            let _ = writeln!(out, "- {} / {}: {reason}", b.backend, f.title);
        }
        for s in b.suite.iter().filter(|s| s.result == "failed") {
            let _ = writeln!(
                out,
                "- {} / suite `{}` failed: {}",
                b.backend,
                s.name,
                s.detail.as_deref().unwrap_or("")
            );
        }
    }
}

fn checks_table(matrix: &Matrix, out: &mut String) {
    let _ = writeln!(out, "| backend | declared | observed | |");
    let _ = writeln!(out, "|---|---|---|---|");
    for b in &matrix.backends {
        for c in &b.checks {
            let mark = c.mark();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {mark} |",
                b.backend, c.claim, c.observed
            );
        }
    }
}

/// How much was run, in words.
fn how_much(matrix: &Matrix) -> String {
    let options = &matrix.options;
    match &options.soak {
        Some(soak) => format!(
            "a soak — faults drawn at random for {} s per backend (seed {}), each draw a \
             cell of {} trials, the draws of a fault added up in its cell",
            soak.secs, soak.seed, options.trials
        ),
        None => format!(
            "{} trials per fault ({} injections per server fault), perf {} s per mode",
            options.trials, options.rounds, options.perf_secs
        ),
    }
}

/// The Markdown report.
pub fn markdown(matrix: &Matrix) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured {} on {} in {:.0} s: {} ({} build).\n",
        matrix.measured_at,
        matrix.machine,
        matrix.elapsed_secs,
        how_much(matrix),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    if matrix.options.tls {
        let _ = writeln!(
            out,
            "Secured servers (`--tls`): every server required TLS with a client certificate \
             and a password; clients had only the privileges docs/security.md \
             lists.\n"
        );
    }
    let _ = writeln!(
        out,
        "SAFE: mutual exclusion held · F-SAFE: two holders, the stale write was rejected by \
         fencing · UNSAFE: two holders (or a regressed token) not contained · UNAVAIL: no \
         violation, but a healthy client could not get the lock · ⚠: outside the verdicts \
         the backend's protocol allows (its reviewed row of the table, the backend crate's `src/verdicts.rs`).\n"
    );
    grid(matrix, &mut out);
    let _ = writeln!(out, "\n**What fencing buys** ({FENCING_LEGEND})\n");
    fencing_table(matrix, &mut out);
    let _ = writeln!(
        out,
        "\n**Performance** (one client process, this machine):\n"
    );
    perf_table(matrix, &mut out);
    let _ = writeln!(out, "\n**Declared capabilities vs observed:**\n");
    checks_table(matrix, &mut out);
    let _ = writeln!(out, "\n**Seed claims vs measured** (seed 003):\n");
    let _ = writeln!(out, "| claim | measured | |");
    let _ = writeln!(out, "|---|---|---|");
    for c in seed_claims(matrix) {
        let _ = writeln!(out, "| {} | {} | {} |", c.claim, c.measured, c.assessment);
    }
    let _ = writeln!(out, "\n**Notes:**\n");
    notes(matrix, &mut out);
    out
}

/// The terminal summary: the grid and the performance table.
pub fn terminal(matrix: &Matrix) -> String {
    let mut out = String::new();
    grid(matrix, &mut out);
    out.push_str("\nWhat fencing buys (updates lost without the fence, and with it):\n\n");
    fencing_table(matrix, &mut out);
    out.push('\n');
    perf_table(matrix, &mut out);
    out
}

/// The JSON report: the matrix and the seed comparison.
pub fn json(matrix: &Matrix) -> String {
    #[derive(Serialize)]
    struct Full<'a> {
        #[serde(flatten)]
        matrix: &'a Matrix,
        seed_claims: Vec<SeedClaim>,
    }
    serde_json::to_string_pretty(&Full {
        matrix,
        seed_claims: seed_claims(matrix),
    })
    .unwrap_or_default()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(cell: &Cell) -> &'static str {
    let verdicts = cell.verdicts();
    if verdicts.contains(&Verdict::Unsafe) {
        "#f4a6a6"
    } else if verdicts.contains(&Verdict::FencedSafe) {
        "#f9df9a"
    } else if verdicts.contains(&Verdict::Unavail) {
        "#c9d7f2"
    } else if verdicts.contains(&Verdict::Safe) {
        "#b9e4b9"
    } else {
        "#e6e6e6"
    }
}

/// A horizontal bar chart as inline SVG.
fn bars(title: &str, unit: &str, values: &[(String, f64)]) -> String {
    let max = values
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let row = 26;
    let height = 30 + row * values.len();
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg width=\"560\" height=\"{height}\" \
         role=\"img\">",
        escape(title)
    );
    for (i, (label, value)) in values.iter().enumerate() {
        let y = 10 + i * row;
        let width = (value / max * 380.0).max(1.0);
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"{}\" font-size=\"13\">{}</text>\
             <rect x=\"90\" y=\"{y}\" width=\"{width:.1}\" height=\"18\" fill=\"#5b8def\"/>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"12\">{value:.0} {unit}</text>",
            y + 14,
            escape(label),
            95.0 + width,
            y + 14
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

/// The self-contained HTML report: the grid, charts, checks, seed claims and notes.
pub fn html(matrix: &Matrix) -> String {
    let mut out = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>tenure matrix</title>\
         <style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}\
         table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;\
         padding:4px 8px;font-size:14px;vertical-align:top}th{background:#eee}\
         figure{display:inline-block;margin:1em 2em 1em 0}figcaption{font-weight:600}\
         .mis{outline:3px solid #d33}</style></head><body><h1>tenure decision matrix</h1>",
    );
    let _ = write!(
        out,
        "<p>Measured {} on {} in {:.0} s: {}.</p><p>SAFE: exclusion held · F-SAFE: two holders, stale write fenced off · \
         UNSAFE: not contained · UNAVAIL: no lock for a healthy client. Outlined cells are \
         outside the verdicts the backend's protocol allows.</p><table><tr><th>fault</th>",
        escape(&matrix.measured_at),
        escape(&matrix.machine),
        matrix.elapsed_secs,
        escape(&how_much(matrix))
    );
    for b in &matrix.backends {
        let _ = write!(out, "<th>{}</th>", escape(&b.backend));
    }
    out.push_str("</tr><tr><td>shared suite</td>");
    for b in &matrix.backends {
        let _ = write!(out, "<td>{}</td>", escape(&suite_summary(b)));
    }
    out.push_str("</tr>");
    for fault in Fault::ALL {
        let _ = write!(out, "<tr><td>{}</td>", escape(fault.title()));
        for b in &matrix.backends {
            match b.faults.iter().find(|f| f.fault == fault) {
                Some(f) => {
                    let title = match &f.cell {
                        Cell::Ran { notes, .. } => notes.join("; "),
                        Cell::NotInjectable { reason }
                        | Cell::NotApplicable { reason }
                        | Cell::Unhealthy { reason } => reason.clone(),
                    };
                    let _ = write!(
                        out,
                        "<td style=\"background:{}\"{} title=\"{}\">{}</td>",
                        color(&f.cell),
                        if f.mismatch { " class=\"mis\"" } else { "" },
                        escape(&title),
                        escape(&f.cell.summary())
                    );
                }
                None => out.push_str("<td>—</td>"),
            }
        }
        out.push_str("</tr>");
    }
    let _ = write!(
        out,
        "</table><h2>What fencing buys</h2><p>{}</p><table><tr><th>fault</th>",
        escape(FENCING_LEGEND)
    );
    for b in &matrix.backends {
        let _ = write!(out, "<th>{}</th>", escape(&b.backend));
    }
    out.push_str("</tr>");
    for (fault, row) in fencing_rows(matrix) {
        let _ = write!(out, "<tr><td>{}</td>", escape(fault.title()));
        for text in row {
            let _ = write!(out, "<td>{}</td>", escape(&text));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table><h2>Performance</h2>");
    let series = |mode: Mode, value: fn(&BenchLine) -> Option<f64>| -> Vec<(String, f64)> {
        matrix
            .backends
            .iter()
            .filter_map(|b| {
                perf(b, mode)
                    .and_then(value)
                    .map(|v| (b.backend.clone(), v))
            })
            .collect()
    };
    out.push_str(&bars(
        "seq: median acquire+release latency",
        "µs",
        &series(Mode::Seq, |l| Some(l.p50_us as f64)),
    ));
    out.push_str(&bars(
        "par64: lock cycles per second",
        "/s",
        &series(Mode::Par64, |l| Some(l.cycles_per_s)),
    ));
    out.push_str(&bars(
        "contended: hand-offs per second (16 clients, one key)",
        "/s",
        &series(Mode::Contended, |l| l.handoffs_per_s),
    ));
    out.push_str("<h2>Declared capabilities vs observed</h2><table><tr><th>backend</th><th>declared</th><th>observed</th><th></th></tr>");
    for b in &matrix.backends {
        for c in &b.checks {
            let mark = c.mark();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{mark}</td></tr>",
                escape(&b.backend),
                escape(&c.claim),
                escape(&c.observed)
            );
        }
    }
    out.push_str("</table><h2>Seed claims vs measured</h2><table><tr><th>claim</th><th>measured</th><th></th></tr>");
    for c in seed_claims(matrix) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(c.claim),
            escape(&c.measured),
            c.assessment
        );
    }
    out.push_str("</table><h2>Notes</h2><ul>");
    let mut text = String::new();
    notes(matrix, &mut text);
    for line in text.lines() {
        let _ = write!(out, "<li>{}</li>", escape(line.trim_start_matches("- ")));
    }
    out.push_str("</ul></body></html>\n");
    out
}
