//! The result model: a trial's verdict, and a cell that merges a fault's trials into one
//! entry of the matrix.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Fault;
use crate::LostUpdates;

/// The outcome of one trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Verdict {
    /// Mutual exclusion held.
    #[serde(rename = "SAFE")]
    Safe,
    /// Two holders, and fencing rejected the stale holder's write.
    #[serde(rename = "F-SAFE")]
    FencedSafe,
    /// Two holders (or a regressed token), and fencing did not contain it.
    #[serde(rename = "UNSAFE")]
    Unsafe,
    /// No violation, but a healthy client could not get the lock.
    #[serde(rename = "UNAVAIL")]
    Unavail,
}

impl Verdict {
    /// The label used in reports.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Safe => "SAFE",
            Verdict::FencedSafe => "F-SAFE",
            Verdict::Unsafe => "UNSAFE",
            Verdict::Unavail => "UNAVAIL",
        }
    }
}

/// One trial's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial {
    /// The verdict.
    pub verdict: Verdict,
    /// Whether there is evidence that the fault took effect in this trial.
    pub fired: bool,
    /// What was observed, when worth saying.
    pub note: Option<String>,
    /// The trial's counter increments, and those lost with and without fencing.
    pub updates: LostUpdates,
}

/// A cell of the matrix: one backend under one fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Cell {
    /// The fault was injected.
    Ran {
        /// Trials per verdict (only trials where the fault fired).
        counts: BTreeMap<Verdict, usize>,
        /// Trials run.
        trials: usize,
        /// Separate injections of the fault (server faults inject once per round).
        injections: usize,
        /// Trials where there was no evidence the fault fired (not counted above).
        not_fired: usize,
        /// Whether fencing contained every violation observed (`None`: none observed).
        fencing_contained: Option<bool>,
        /// The counter increments of the trials counted above, and those lost.
        updates: LostUpdates,
        /// Distinct observations, for the report.
        notes: Vec<String>,
    },
    /// This setup cannot inject the fault.
    NotInjectable {
        /// Why.
        reason: String,
    },
    /// The fault does not apply to this backend's design.
    NotApplicable {
        /// Why.
        reason: String,
    },
    /// Not run: the backend could not be brought back to health before the cell (a server
    /// down that did not restart, one that does not answer, no lock granted).
    Unhealthy {
        /// What is wrong.
        reason: String,
    },
}

impl Cell {
    /// Whether the fault fired in some trial: a cell that ran with evidence of it in no
    /// trial judged nothing. True for cells that ran no trials (not injectable, not
    /// applicable, failed).
    pub fn judged(&self) -> bool {
        match self {
            Cell::Ran { counts, .. } => counts.values().sum::<usize>() > 0,
            _ => true,
        }
    }

    /// Aggregates trials.
    pub fn from_trials(trials: Vec<Trial>, injections: usize) -> Cell {
        let mut counts = BTreeMap::new();
        let mut notes: Vec<String> = Vec::new();
        let mut not_fired = 0;
        let mut updates = LostUpdates::default();
        for trial in &trials {
            if trial.fired {
                *counts.entry(trial.verdict).or_insert(0) += 1;
                updates += trial.updates;
            } else {
                not_fired += 1;
            }
            if let Some(note) = &trial.note {
                if !notes.contains(note) && notes.len() < 4 {
                    notes.push(note.clone());
                }
            }
        }
        Cell::Ran {
            fencing_contained: contained(&counts),
            counts,
            trials: trials.len(),
            injections,
            not_fired,
            updates,
            notes,
        }
    }

    /// This cell and `later`, another run of the same fault, as one: trials, injections,
    /// verdicts and updates added up. A run that did not happen (an unhealthy backend)
    /// leaves its reason in the notes of one that did.
    pub fn merge(self, later: Cell) -> Cell {
        match (self, later) {
            (
                Cell::Ran {
                    mut counts,
                    trials,
                    injections,
                    not_fired,
                    mut updates,
                    notes,
                    ..
                },
                Cell::Ran {
                    counts: more_counts,
                    trials: more_trials,
                    injections: more_injections,
                    not_fired: more_not_fired,
                    updates: more_updates,
                    notes: more_notes,
                    ..
                },
            ) => {
                let more_unsafe = more_counts.contains_key(&Verdict::Unsafe);
                for (verdict, n) in more_counts {
                    *counts.entry(verdict).or_insert(0) += n;
                }
                updates += more_updates;
                // The notes of a run that saw an uncontained violation come first: they
                // say what happened, and must not be crowded out by earlier runs'.
                let (first, then) = match more_unsafe {
                    true => (more_notes, notes),
                    false => (notes, more_notes),
                };
                let mut notes: Vec<String> = Vec::new();
                for note in first.into_iter().chain(then) {
                    if !notes.contains(&note) && notes.len() < MERGED_NOTES {
                        notes.push(note);
                    }
                }
                Cell::Ran {
                    fencing_contained: contained(&counts),
                    counts,
                    trials: trials + more_trials,
                    injections: injections + more_injections,
                    not_fired: not_fired + more_not_fired,
                    updates,
                    notes,
                }
            }
            (ran @ Cell::Ran { .. }, other) | (other, ran @ Cell::Ran { .. }) => {
                let mut ran = ran;
                if let (Cell::Ran { notes, .. }, Some(reason)) = (&mut ran, other.reason()) {
                    let note = format!("{}: {reason}", other.summary());
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                ran
            }
            (_, later) => later,
        }
    }

    /// Whether the cell's lost updates agree with its verdicts: an update is lost only
    /// where two clients held at once (`F-SAFE`, `UNSAFE`), and the fenced store loses
    /// one only where fencing did not contain it (`UNSAFE`). A holder paused past its TTL
    /// (`fault` one of the paused ones) writes once it wakes, after the contender's
    /// write: where every trial counted held twice, each wrote twice and lost one update
    /// in the store that ignores tokens (Jepsen's lock workload). The reason, if they
    /// disagree.
    pub fn check_updates(&self, fault: Fault) -> Result<(), String> {
        let Cell::Ran {
            counts, updates, ..
        } = self
        else {
            return Ok(());
        };
        let count = |verdict| counts.get(&verdict).copied().unwrap_or(0) as u64;
        let counted: u64 = counts.values().map(|&n| n as u64).sum();
        let held_twice = count(Verdict::FencedSafe) + count(Verdict::Unsafe);
        let summary = self.summary();
        if held_twice == 0 && updates.unfenced > 0 {
            return Err(format!(
                "{summary}, yet the plain store lost {} updates: {updates:?}",
                updates.unfenced
            ));
        }
        if count(Verdict::Unsafe) == 0 && updates.fenced > 0 {
            return Err(format!(
                "{summary}, yet the fenced store lost {} updates: {updates:?}",
                updates.fenced
            ));
        }
        let paused = matches!(
            fault,
            Fault::PausedHolder
                | Fault::PausedPermitHolder
                | Fault::PausedLeader
                | Fault::PausedReader
        );
        // Only where every counted trial was a double grant: a contender never granted
        // (UNAVAIL, allowed by `never_unsafe`) leaves the holder's one write alone.
        let all_twice = held_twice == counted;
        if paused && all_twice && (updates.updates != 2 * counted || updates.unfenced != counted) {
            return Err(format!(
                "{summary}: each paused holder writes once after the contender, losing one \
                 update in the plain store; counted {updates:?}"
            ));
        }
        Ok(())
    }

    /// Why the cell did not run (`None` if it ran).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Cell::Ran { .. } => None,
            Cell::NotInjectable { reason }
            | Cell::NotApplicable { reason }
            | Cell::Unhealthy { reason } => Some(reason),
        }
    }

    /// The verdicts observed (empty unless it ran).
    pub fn verdicts(&self) -> Vec<Verdict> {
        match self {
            Cell::Ran { counts, .. } => counts.keys().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// A short summary: `SAFE 20`, `F-SAFE 18 · UNSAFE 2`, `not injectable`.
    pub fn summary(&self) -> String {
        match self {
            Cell::Ran {
                counts, not_fired, ..
            } => {
                let mut parts: Vec<String> = counts
                    .iter()
                    .map(|(v, n)| format!("{} {n}", v.label()))
                    .collect();
                if *not_fired > 0 {
                    parts.push(format!("not fired {not_fired}"));
                }
                if parts.is_empty() {
                    // Only a soak's fault that was never drawn has no trials.
                    "not drawn".into()
                } else {
                    parts.join(" · ")
                }
            }
            Cell::NotInjectable { .. } => "not injectable".into(),
            Cell::NotApplicable { .. } => "n/a".into(),
            Cell::Unhealthy { .. } => "unhealthy".into(),
        }
    }
}

/// The most distinct notes a merged cell keeps.
pub(super) const MERGED_NOTES: usize = 8;

/// Whether fencing contained every violation counted (`None`: none counted).
pub(super) fn contained(counts: &BTreeMap<Verdict, usize>) -> Option<bool> {
    let violations = |v| counts.get(&v).copied().unwrap_or(0);
    match (violations(Verdict::FencedSafe), violations(Verdict::Unsafe)) {
        (0, 0) => None,
        (_, 0) => Some(true),
        _ => Some(false),
    }
}

#[cfg(test)]
mod cell_tests {
    use super::*;

    #[test]
    fn a_fault_is_named_as_in_the_json() {
        for fault in Fault::ALL {
            let json = serde_json::to_value(fault).unwrap();
            assert_eq!(json.as_str(), Some(fault.name()));
        }
    }

    fn trial(verdict: Verdict, fired: bool, lost_unfenced: u64) -> Trial {
        Trial {
            verdict,
            fired,
            note: None,
            updates: LostUpdates {
                updates: 2,
                unfenced: lost_unfenced,
                fenced: 0,
            },
        }
    }

    /// A soak adds up each fault's draws: verdicts, trials, injections and updates; a
    /// draw on an unhealthy backend leaves its reason in the notes.
    #[test]
    fn draws_of_a_fault_add_up_to_one_cell() {
        let first = Cell::from_trials(vec![trial(Verdict::Safe, true, 0)], 1);
        let second = Cell::from_trials(
            vec![
                trial(Verdict::FencedSafe, true, 1),
                trial(Verdict::Safe, false, 1),
            ],
            1,
        );
        let unhealthy = Cell::Unhealthy {
            reason: "node 0 is down".into(),
        };
        let merged = Cell::from_trials(Vec::new(), 0)
            .merge(first)
            .merge(unhealthy)
            .merge(second);
        let Cell::Ran {
            counts,
            trials,
            injections,
            not_fired,
            fencing_contained,
            updates,
            notes,
        } = &merged
        else {
            panic!("{merged:?}")
        };
        let expected = BTreeMap::from([(Verdict::Safe, 1), (Verdict::FencedSafe, 1)]);
        assert_eq!(counts, &expected);
        assert_eq!((*trials, *injections, *not_fired), (3, 2, 1));
        assert_eq!(*fencing_contained, Some(true));
        // The trial that did not fire counts no updates, as it counts no verdict.
        assert_eq!(
            *updates,
            LostUpdates {
                updates: 4,
                unfenced: 1,
                fenced: 0
            }
        );
        assert_eq!(notes, &["unhealthy: node 0 is down"]);
        assert_eq!(merged.summary(), "SAFE 1 · F-SAFE 1 · not fired 1");
        // A fault never drawn says so.
        assert_eq!(Cell::from_trials(Vec::new(), 0).summary(), "not drawn");
    }

    /// A long soak's notes fill up; the note of a later draw's uncontained violation is
    /// kept, first.
    #[test]
    fn the_note_of_an_unsafe_draw_is_never_crowded_out() {
        let noted = |verdict, note: String| Trial {
            note: Some(note),
            ..trial(verdict, true, 0)
        };
        let mut merged = Cell::from_trials(Vec::new(), 0);
        for i in 0..20 {
            let run = Cell::from_trials(vec![noted(Verdict::Safe, format!("safe {i}"))], 1);
            merged = merged.merge(run);
        }
        let unsafe_run = Cell::from_trials(vec![noted(Verdict::Unsafe, "the fence".into())], 1);
        let merged = merged.merge(unsafe_run);
        let Cell::Ran { notes, .. } = &merged else {
            panic!("{merged:?}")
        };
        assert_eq!(notes.len(), MERGED_NOTES);
        assert_eq!(notes[0], "the fence");
        assert_eq!(merged.summary(), "SAFE 20 · UNSAFE 1");
    }
}
