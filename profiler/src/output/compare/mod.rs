//! `mmaplock-prof compare BEFORE AFTER`: did a fix remove the contention, and which of two
//! ways of running a tool waits less? Per group of processes (`--by`, group.rs: the whole run
//! unless asked otherwise), and within it per thread role and per write cause: writes, total,
//! mean and p99 write wait before and after, with the ratio. A file may hold several runs
//! (each ending with its summary line): then each figure is the mean over the runs with its
//! range, and a difference whose ranges overlap is called within run-to-run noise rather than
//! claimed.

mod group;
pub mod text;

use std::{collections::BTreeMap, path::Path};

pub use group::By;
use group::{Fig, Figs, Grouped, Key};
use serde::{Deserialize, Serialize};
pub use text::{CompareText, runs_label, value};

use crate::{
    output::{
        compare_findings::{self, RunFindings},
        findings::StudyEffects,
        partial::Summed,
        reading::{self, InputError, Keep, Line},
        report::{Report, SCHEMA_VERSION},
    },
    vocab::Mode,
};

/// One figure over the runs of one side.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread {
                mean: 0.0,
                min: 0.0,
                max: 0.0,
                runs: 0,
            };
        }
        Spread {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            runs: values.len(),
        }
    }
}

/// Before against after, for one figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub before: Spread,
    pub after: Spread,
    /// after / before (None when before is 0).
    pub ratio: Option<f64>,
    /// `changed`, `within noise` (the runs' ranges overlap), or `one run` (noise cannot be
    /// judged from a single run per side).
    pub verdict: &'static str,
}

impl Change {
    pub(crate) fn of(before: &[f64], after: &[f64]) -> Change {
        let (b, a) = (Spread::of(before), Spread::of(after));
        let ratio = (b.mean > 0.0).then(|| a.mean / b.mean);
        let verdict = if b.runs < 2 || a.runs < 2 {
            "one run"
        } else if a.min <= b.max && b.min <= a.max {
            "within noise"
        } else {
            "changed"
        };
        Change {
            before: b,
            after: a,
            ratio,
            verdict,
        }
    }
}

/// One row: a group of processes, and within it everything, a role or a cause.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The group's name: a command name, a cgroup, an executable, or `run` (`--by`).
    pub process: String,
    /// `all`, `role` or `cause`.
    pub group: &'static str,
    /// The role or cause (`all` for the process).
    pub key: String,
    pub writes: Change,
    pub wait_ns: Change,
    pub mean_wait_ns: Change,
    pub p99_wait_ns: Change,
    /// The same of the reads (`all` and `role` rows: a cause is the writes').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads: Option<ReadChanges>,
}

/// A row's reads before and after: as many figures as its writes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReadChanges {
    pub reads: Change,
    pub read_wait_ns: Change,
    pub mean_read_wait_ns: Change,
    pub p99_read_wait_ns: Change,
}

impl Row {
    /// Its figures in the order text and page show them, each with whether it is a time.
    pub fn figures(&self) -> [(&Change, bool); 4] {
        [
            (&self.writes, false),
            (&self.wait_ns, true),
            (&self.mean_wait_ns, true),
            (&self.p99_wait_ns, true),
        ]
    }

    /// Its reads' figures likewise, when it has reads.
    pub fn read_figures(&self) -> Option<[(&Change, bool); 4]> {
        self.reads.as_ref().map(|r| {
            [
                (&r.reads, false),
                (&r.read_wait_ns, true),
                (&r.mean_read_wait_ns, true),
                (&r.p99_read_wait_ns, true),
            ]
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub schema_version: u32,
    /// Both sides' mode (never mixed): in contention mode, `writes` are contended writes.
    pub mode: Mode,
    /// What the processes were grouped by: rows' and findings' `process` is a group's name.
    pub by: By,
    pub before: Side,
    pub after: Side,
    /// Each group's processes on each side, by name.
    pub groups: Vec<Group>,
    pub rows: Vec<Row>,
    /// Per finding (group and pattern): found before, after, and whether the after-runs
    /// removed it.
    pub findings: Vec<compare_findings::FindingChange>,
    /// Which figures leave out, or put apart, the processes a summary grouped by command
    /// (`minor_processes`), per file; empty when none does.
    pub notes: Vec<String>,
}

/// A group and its processes on each side.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    pub name: String,
    pub before: Members,
    pub after: Members,
}

/// A group's processes on one side.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Members {
    /// How many, over the side's runs (0 in a run without the group).
    pub processes: Spread,
    /// Their command names, in any run.
    pub comms: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub file: String,
    pub runs: usize,
}

fn mean(f: &Fig) -> f64 {
    if f.count == 0 {
        0.0
    } else {
        f.wait.sum as f64 / f.count as f64
    }
}

fn p99(f: &Fig) -> f64 {
    f.wait.quantiles([0.99])[0] as f64
}

/// One run as `compare` keeps it: its processes grouped (figures, findings) and its mode.
#[derive(Clone)]
struct Run {
    grouped: Grouped,
    mode: Mode,
}

impl Run {
    fn of(summary: &Report, by: By) -> Run {
        Run {
            grouped: Grouped::of(summary, by),
            mode: summary.mode,
        }
    }
}

/// Runs of both modes in one comparison: their counts mean different things (every
/// acquisition against the contended waits), so they are never set side by side.
#[derive(Debug, thiserror::Error)]
#[error(
    "{full} was profiled in full mode and {contention} in contention mode: their writes and waits are not the same measure (every acquisition against the contended waits only); compare runs of one --mode"
)]
pub struct MixedModes {
    pub full: String,
    pub contention: String,
}

/// Two files that cannot be compared as asked.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error(transparent)]
    MixedModes(#[from] MixedModes),
    /// `--by` a key that no process of a file has: one group of unknowns would pass for a
    /// grouping.
    #[error("--by {}: {file} records no process's {} ({}); group by comm or run", by.name(), by.what(), why(*by))]
    Ungroupable { by: By, file: String },
}

/// Why a file would record no process's key.
fn why(by: By) -> &'static str {
    match by {
        By::Exe => "a build before executables were reported, or a run that could not read them",
        By::Cgroup => "a host without cgroup v2, or a build before cgroups were reported",
        By::Comm | By::Run => "every process has them",
    }
}

/// The one mode of the runs of both files.
fn one_mode(before: (&str, &[Run]), after: (&str, &[Run])) -> Result<Mode, MixedModes> {
    let file_of = |mode: Mode| {
        [before, after]
            .into_iter()
            .find(|(_, runs)| runs.iter().any(|r| r.mode == mode))
            .map(|(f, _)| f.to_string())
    };
    match (file_of(Mode::Full), file_of(Mode::Contention)) {
        (Some(full), Some(contention)) => Err(MixedModes { full, contention }),
        (None, Some(_)) => Ok(Mode::Contention),
        _ => Ok(Mode::Full),
    }
}

/// A side whose listed processes all lack the key they are grouped by is refused (those it
/// grouped by command never have it).
fn groupable(by: By, (file, runs): (&str, &[Run])) -> Result<(), CompareError> {
    let listed: u64 = runs
        .iter()
        .map(|r| r.grouped.processes() - r.grouped.grouped)
        .sum();
    let unknown: u64 = runs.iter().map(|r| r.grouped.unknown).sum();
    if listed > 0 && unknown == listed {
        return Err(CompareError::Ungroupable {
            by,
            file: file.to_string(),
        });
    }
    Ok(())
}

/// What `compare` keeps of a file, read one line at a time: each run's processes grouped
/// `by` (a summary line, or each run of a demo line), and while there is none, the interval
/// lines summed (a file without any summary is one run, its interval lines summed).
#[derive(Default)]
pub struct Runs {
    by: By,
    runs: Vec<Run>,
    summed: Summed,
}

impl Keep for Runs {
    fn add(&mut self, line: Line) {
        match line {
            Line::Interval(r) if self.runs.is_empty() => self.summed.add(&r),
            Line::Summary(r) => self.runs.push(Run::of(&r, self.by)),
            Line::Demo(d) => {
                let by = self.by;
                self.runs
                    .extend(d.runs.iter().map(|r| Run::of(&r.report, by)))
            }
            Line::Interval(_) | Line::Study(_) => {}
        }
    }
}

impl Runs {
    /// Nothing read yet; its processes to be grouped `by`.
    pub fn new(by: By) -> Runs {
        Runs {
            by,
            ..Runs::default()
        }
    }

    /// What it keeps of a file, its processes grouped `by`.
    pub fn read(path: &Path, by: By) -> Result<Runs, InputError> {
        let mut k = Runs::new(by);
        reading::read_file(path, |l| k.add(l))?;
        Ok(k)
    }

    /// Each run.
    fn runs(&self) -> Vec<Run> {
        if self.runs.is_empty() && self.summed.lines() > 0 {
            vec![Run::of(&self.summed.report(), self.by)]
        } else {
            self.runs.clone()
        }
    }
}

/// Each group's processes on each side.
fn groups(b: &[Run], a: &[Run]) -> Vec<Group> {
    let mut names: Vec<&String> = b
        .iter()
        .chain(a)
        .flat_map(|r| r.grouped.members.keys())
        .collect();
    names.sort();
    names.dedup();
    let members = |runs: &[Run], name: &String| {
        let counts: Vec<f64> = runs
            .iter()
            .map(|r| {
                r.grouped
                    .members
                    .get(name)
                    .map_or(0.0, |m| m.processes as f64)
            })
            .collect();
        let mut comms: Vec<String> = runs
            .iter()
            .filter_map(|r| r.grouped.members.get(name))
            .flat_map(|m| m.comms.iter().cloned())
            .collect();
        comms.sort();
        comms.dedup();
        Members {
            processes: Spread::of(&counts),
            comms,
        }
    };
    names
        .into_iter()
        .map(|n| Group {
            name: n.clone(),
            before: members(b, n),
            after: members(a, n),
        })
        .collect()
}

/// Compares the runs of two files, grouped as they were read (both sides alike; with a study
/// of the host, the findings quote its measured effects).
pub fn compare(
    before: (&str, &Runs),
    after: (&str, &Runs),
    study: Option<&StudyEffects>,
) -> Result<Comparison, CompareError> {
    let by = before.1.by;
    debug_assert_eq!(by, after.1.by, "both sides grouped alike");
    let (b, a) = (before.1.runs(), after.1.runs());
    let mode = one_mode((before.0, &b), (after.0, &a))?;
    groupable(by, (before.0, &b))?;
    groupable(by, (after.0, &a))?;
    let groups = groups(&b, &a);
    let notes = [
        group::notes(by, (before.0, &b)),
        group::notes(by, (after.0, &a)),
    ]
    .concat();
    let runs_b: Vec<BTreeMap<Key, Figs>> = b.iter().map(|r| r.grouped.figures.clone()).collect();
    let runs_a: Vec<BTreeMap<Key, Figs>> = a.iter().map(|r| r.grouped.figures.clone()).collect();
    let findings_b: Vec<RunFindings> = b.into_iter().map(|r| r.grouped.findings).collect();
    let findings_a: Vec<RunFindings> = a.into_iter().map(|r| r.grouped.findings).collect();
    let mut keys: Vec<Key> = runs_b
        .iter()
        .chain(&runs_a)
        .flat_map(|m| m.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let series = |runs: &[BTreeMap<Key, Figs>], k: &Key, f: &dyn Fn(&Figs) -> f64| -> Vec<f64> {
        runs.iter().map(|m| m.get(k).map_or(0.0, f)).collect()
    };
    let rows = keys
        .into_iter()
        .map(|k| {
            let change = |f: &dyn Fn(&Figs) -> f64| {
                Change::of(&series(&runs_b, &k, f), &series(&runs_a, &k, f))
            };
            let reads = (k.1 != "cause").then(|| ReadChanges {
                reads: change(&|f| f.read.count as f64),
                read_wait_ns: change(&|f| f.read.wait.sum as f64),
                mean_read_wait_ns: change(&|f| mean(&f.read)),
                p99_read_wait_ns: change(&|f| p99(&f.read)),
            });
            Row {
                writes: change(&|f| f.write.count as f64),
                wait_ns: change(&|f| f.write.wait.sum as f64),
                mean_wait_ns: change(&|f| mean(&f.write)),
                p99_wait_ns: change(&|f| p99(&f.write)),
                reads,
                process: k.0.clone(),
                group: k.1,
                key: k.2.clone(),
            }
        })
        .collect();
    Ok(Comparison {
        kind: "compare",
        schema_version: SCHEMA_VERSION,
        mode,
        by,
        before: Side {
            file: before.0.to_string(),
            runs: runs_b.len(),
        },
        after: Side {
            file: after.0.to_string(),
            runs: runs_a.len(),
        },
        groups,
        rows,
        findings: compare_findings::changes(&findings_b, &findings_a, study),
        notes,
    })
}

#[cfg(test)]
mod tests;
