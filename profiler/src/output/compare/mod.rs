//! `mmaplock-prof compare BEFORE AFTER`: did a fix remove the contention? Per process name,
//! and within it per thread role and per write cause: writes, total, mean and p99 write wait
//! before and after, with the ratio. A file may hold several runs (each ending with its
//! summary line): then each figure is the mean over the runs with its range, and a difference
//! whose ranges overlap is called within run-to-run noise rather than claimed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    aggregation::SideStats,
    output::{
        Output,
        compare_findings::{self, RunFindings},
        findings::StudyEffects,
        partial::Summed,
        reading::{Keep, Line},
        report::{Report, SCHEMA_VERSION, Stats},
        text::{fit, fmt_ns},
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

/// One row: a process name, and within it everything, a role or a cause.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub process: String,
    /// `all`, `role` or `cause`.
    pub group: &'static str,
    /// The role or cause (`all` for the process).
    pub key: String,
    pub writes: Change,
    pub wait_ns: Change,
    pub mean_wait_ns: Change,
    pub p99_wait_ns: Change,
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
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub schema_version: u32,
    /// Both sides' mode (never mixed): in contention mode, `writes` are contended writes.
    pub mode: Mode,
    pub before: Side,
    pub after: Side,
    pub rows: Vec<Row>,
    /// Per finding (process name and pattern): found before, after, and whether the
    /// after-runs removed it.
    pub findings: Vec<compare_findings::FindingChange>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub file: String,
    pub runs: usize,
}

/// Write acquisitions of one group in one run: the figures are its count, its total and
/// mean wait, and its p99 ([`DurationHist::quantiles`](crate::aggregation::DurationHist),
/// as everywhere else).
type Fig = SideStats;

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

type Key = (String, &'static str, String);

/// A run's figures per (process name, group, key): processes with one name are pooled.
fn figures(summary: &Report) -> BTreeMap<Key, Fig> {
    let mut m: BTreeMap<Key, Fig> = BTreeMap::new();
    let mut add = |key: Key, s: &Stats| m.entry(key).or_default().merge(&s.side());
    for p in &summary.processes {
        add((p.comm.clone(), "all", "all".into()), &p.lock.write);
        for t in &p.threads {
            add(
                (p.comm.clone(), "role", t.role.as_str().into()),
                &t.lock.write,
            );
        }
        for c in &p.lock.causes {
            add((p.comm.clone(), "cause", c.cause.to_string()), &c.write);
        }
    }
    m
}

/// One run as `compare` keeps it: its figures, its findings and its mode.
#[derive(Clone)]
struct Run {
    figures: BTreeMap<Key, Fig>,
    findings: RunFindings,
    mode: Mode,
}

impl Run {
    fn of(summary: &Report) -> Run {
        Run {
            figures: figures(summary),
            findings: compare_findings::per_run(summary),
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

/// What `compare` keeps of a file, read one line at a time: the figures and findings of each
/// run (a summary line, or each run of a demo line), and while there is none, the interval
/// lines summed (a file without any summary is one run, its interval lines summed).
#[derive(Default)]
pub struct Runs {
    runs: Vec<Run>,
    summed: Summed,
}

impl Keep for Runs {
    fn add(&mut self, line: Line) {
        match line {
            Line::Interval(r) if self.runs.is_empty() => self.summed.add(&r),
            Line::Summary(r) => self.runs.push(Run::of(&r)),
            Line::Demo(d) => self.runs.extend(d.runs.iter().map(|r| Run::of(&r.report))),
            Line::Interval(_) | Line::Study(_) => {}
        }
    }
}

impl Runs {
    /// Each run.
    fn runs(&self) -> Vec<Run> {
        if self.runs.is_empty() && self.summed.lines() > 0 {
            vec![Run::of(&self.summed.report())]
        } else {
            self.runs.clone()
        }
    }
}

/// Compares the runs of two files (with a study of the host, the findings quote its
/// measured effects).
pub fn compare(
    before: (&str, &Runs),
    after: (&str, &Runs),
    study: Option<&StudyEffects>,
) -> Result<Comparison, MixedModes> {
    let (b, a) = (before.1.runs(), after.1.runs());
    let mode = one_mode((before.0, &b), (after.0, &a))?;
    let runs_b: Vec<BTreeMap<Key, Fig>> = b.iter().map(|r| r.figures.clone()).collect();
    let runs_a: Vec<BTreeMap<Key, Fig>> = a.iter().map(|r| r.figures.clone()).collect();
    let findings_b: Vec<RunFindings> = b.into_iter().map(|r| r.findings).collect();
    let findings_a: Vec<RunFindings> = a.into_iter().map(|r| r.findings).collect();
    let mut keys: Vec<Key> = runs_b
        .iter()
        .chain(&runs_a)
        .flat_map(|m| m.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let series = |runs: &[BTreeMap<Key, Fig>], k: &Key, f: &dyn Fn(&Fig) -> f64| -> Vec<f64> {
        runs.iter().map(|m| m.get(k).map_or(0.0, f)).collect()
    };
    let rows = keys
        .into_iter()
        .map(|k| {
            let change = |f: &dyn Fn(&Fig) -> f64| {
                Change::of(&series(&runs_b, &k, f), &series(&runs_a, &k, f))
            };
            Row {
                writes: change(&|f| f.count as f64),
                wait_ns: change(&|f| f.wait.sum as f64),
                mean_wait_ns: change(&mean),
                p99_wait_ns: change(&p99),
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
        before: Side {
            file: before.0.to_string(),
            runs: runs_b.len(),
        },
        after: Side {
            file: after.0.to_string(),
            runs: runs_a.len(),
        },
        rows,
        findings: compare_findings::changes(&findings_b, &findings_a, study),
    })
}

/// `1 run`, `2 runs`.
pub fn runs_label(n: usize) -> String {
    format!("{n} run{}", if n == 1 { "" } else { "s" })
}

/// A figure as the table shows it: a duration, or a count.
pub fn value(x: f64, ns: bool) -> String {
    if ns {
        fmt_ns(x.round() as u64)
    } else {
        format!("{}", x.round() as u64)
    }
}

fn show(c: &Change, ns: bool) -> String {
    let v = |x: f64| value(x, ns);
    let ratio = c.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
    format!(
        "{:>9} {:>9} {:>7}",
        v(c.before.mean),
        v(c.after.mean),
        ratio
    )
}

/// `compare`'s view for people.
pub struct CompareText;

impl Output<Comparison> for CompareText {
    fn emit(&mut self, c: &Comparison, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        out.write_all(to_text(c).as_bytes())
    }
}

/// The comparison as a table for people.
pub fn to_text(c: &Comparison) -> String {
    let mut out = format!(
        "mmaplock-prof compare: {} ({}) -> {} ({})\n",
        c.before.file,
        runs_label(c.before.runs),
        c.after.file,
        runs_label(c.after.runs),
    );
    if let Some(note) = crate::output::text::mode_note(c.mode) {
        out.push_str(&format!("  ({note})\n"));
    }
    out.push_str(&format!(
        "\n  {:<28} {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {}\n",
        "process / role / cause",
        "writes", "after", "ratio",
        "wait", "after", "ratio",
        "mean", "after", "ratio",
        "p99", "after", "ratio",
        "verdict: writes / wait"
    ));
    for r in &c.rows {
        let label = match r.group {
            "all" => r.process.clone(),
            g => format!("  {g} {}", r.key),
        };
        let label = fit(&label, 28);
        let figures = r.figures().map(|(c, ns)| show(c, ns)).join("  ");
        out.push_str(&format!(
            "  {label:<28} {figures}  {} / {}\n",
            r.writes.verdict, r.wait_ns.verdict
        ));
    }
    out.push_str(&compare_findings::to_text(&c.findings));
    if c.before.runs < 2 || c.after.runs < 2 {
        out.push_str(
            "\n  One run per side: run-to-run noise cannot be judged. Concatenate the NDJSON of\n  several runs per side (each ends with its summary) to have it judged.\n",
        );
    }
    out
}

#[cfg(test)]
mod tests;
