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

/// One run as `compare` keeps it: its figures and its findings.
#[derive(Clone)]
struct Run {
    figures: BTreeMap<Key, Fig>,
    findings: RunFindings,
}

impl Run {
    fn of(summary: &Report) -> Run {
        Run {
            figures: figures(summary),
            findings: compare_findings::per_run(summary),
        }
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
) -> Comparison {
    let (b, a) = (before.1.runs(), after.1.runs());
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
    Comparison {
        kind: "compare",
        schema_version: SCHEMA_VERSION,
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
    }
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
mod tests {
    use super::*;
    use crate::output::{
        fixtures::{self, stats},
        report::{CauseReport, Kind},
    };

    /// A summary of one process `comm` whose `writes` writes (all by a worker, all mmap)
    /// waited `wait` in all, each in [512, 1024) ns.
    fn summary(comm: &str, writes: u64, wait: u64) -> Report {
        let s = stats(writes, wait, 1000, &[(1024, writes)]);
        let mut p = fixtures::process(1, comm, wait, false);
        p.lock.write = s.clone();
        p.threads.truncate(1);
        p.threads[0].role = crate::registry::roles::Role::Worker;
        p.threads[0].lock.write = s.clone();
        p.lock.causes = vec![CauseReport {
            cause: "mmap".into(),
            write: s,
        }];
        fixtures::summary(vec![p])
    }

    fn runs(lines: impl IntoIterator<Item = Line>) -> Runs {
        let mut r = Runs::default();
        lines.into_iter().for_each(|l| r.add(l));
        r
    }

    fn summaries(v: &[(u64, u64)]) -> Runs {
        runs(v.iter().map(|&(w, t)| Line::Summary(summary("node", w, t))))
    }

    #[test]
    fn ratios_and_noise_verdicts() {
        let before = summaries(&[(1000, 5000), (1100, 5200)]);
        let after = summaries(&[(400, 900), (420, 1000)]);
        let c = compare(("b", &before), ("a", &after), None);
        let all = c.rows.iter().find(|r| r.group == "all").unwrap();
        assert_eq!(all.writes.before.mean, 1050.0);
        assert_eq!(all.writes.verdict, "changed");
        assert!((all.writes.ratio.unwrap() - 410.0 / 1050.0).abs() < 1e-9);
        // In the [512, 1024) bucket, as the summary has it.
        let p99 = summary("node", 1000, 5000).processes[0]
            .lock
            .write
            .wait_ns
            .p99;
        assert!((512..1000).contains(&p99), "{p99}");
        assert_eq!(all.p99_wait_ns.before.mean, p99 as f64);
        // Overlapping ranges: noise.
        let same = compare(
            ("b", &before),
            ("a", &summaries(&[(1050, 5100), (990, 4900)])),
            None,
        );
        assert_eq!(same.rows[0].writes.verdict, "within noise");
        // One run each: not judged.
        let one = compare(
            ("b", &summaries(&[(10, 1)])),
            ("a", &summaries(&[(20, 1)])),
            None,
        );
        assert_eq!(one.rows[0].writes.verdict, "one run");
        assert!(to_text(&one).contains("cannot be judged"));
        // Roles and causes are rows of their own.
        assert!(
            c.rows
                .iter()
                .any(|r| r.group == "role" && r.key == "worker")
        );
        assert!(c.rows.iter().any(|r| r.group == "cause" && r.key == "mmap"));
    }

    #[test]
    fn processes_of_one_name_are_pooled_and_a_missing_one_counts_zero() {
        let proc = |pid: u32, comm: &str, writes: u64, bucket: u64| {
            let mut p = fixtures::process(pid, comm, writes * 10, false);
            p.lock.write = stats(writes, writes * 10, bucket - 1, &[(bucket, writes)]);
            p.threads[0].lock.write = stats(1, 0, 0, &[(1, 1)]);
            p.threads[1].lock.write = stats(writes, 0, 0, &[(1, writes)]);
            p
        };
        let before = runs([Line::Summary(fixtures::summary(vec![
            proc(1, "node", 100, 1024),
            proc(2, "node", 300, 1 << 20),
            proc(3, "gone", 5, 64),
        ]))]);
        let after = runs([Line::Summary(fixtures::summary(vec![
            proc(4, "node", 40, 1024),
            proc(5, "new", 7, 64),
        ]))]);
        let c = compare(("b", &before), ("a", &after), None);
        let row = |p: &str, g: &str, k: &str| {
            c.rows
                .iter()
                .find(|r| r.process == p && r.group == g && r.key == k)
                .unwrap_or_else(|| panic!("{p} {g} {k}"))
        };
        let node = row("node", "all", "all");
        assert_eq!(
            (node.writes.before.mean, node.writes.after.mean),
            (400.0, 40.0)
        );
        assert_eq!(node.writes.ratio, Some(0.1));
        assert_eq!(node.mean_wait_ns.before.mean, 10.0);
        // The pooled buckets: 300 of 400 waits in the 1 MiB bucket, so the p99 is there (its
        // middle), and below the maximum; as the summary of the pooled waits has it.
        let pooled = crate::aggregation::DurationHist::from_upper_bounds(
            0,
            (1 << 20) - 1,
            [(1024, 100), (1 << 20, 300)],
        );
        let p99 = pooled.quantiles([0.99])[0];
        assert!(((1 << 19) + (1 << 18)..(1 << 20)).contains(&p99), "{p99}");
        assert_eq!(node.p99_wait_ns.before.mean, p99 as f64);
        assert_eq!(
            node.p99_wait_ns.after.mean,
            stats(1, 0, 1023, &[(1024, 1)]).wait_ns.p99 as f64
        );
        // Threads pooled by role across the processes.
        assert_eq!(row("node", "role", "main").writes.before.mean, 2.0);
        assert_eq!(row("node", "role", "worker").writes.before.mean, 400.0);
        // A process on one side only: zero on the other, no ratio from zero.
        assert_eq!(row("gone", "all", "all").writes.after.mean, 0.0);
        assert_eq!(row("gone", "all", "all").writes.ratio, Some(0.0));
        assert_eq!(row("new", "all", "all").writes.ratio, None);
        let text = to_text(&c);
        assert!(text.contains("0.10x") && text.contains("b (1 run) -> a (1 run)"));
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["type"], "compare");
        assert_eq!(json["rows"][0]["writes"]["before"]["runs"], 1);
    }

    #[test]
    fn a_file_without_summary_is_one_run_of_its_interval_lines() {
        let line = |writes: u64| {
            let mut s = summary("node", writes, writes);
            s.kind = Kind::Interval;
            Line::Interval(s)
        };
        let cut = runs([line(30), line(20)]);
        let c = compare(("cut", &cut), ("a", &summaries(&[(100, 1)])), None);
        assert_eq!(c.before.runs, 1);
        assert_eq!(c.rows[0].writes.before.mean, 50.0);
        assert_eq!(c.rows[0].writes.ratio, Some(2.0));
        // Once a run's summary came, interval lines are that run's, already in it.
        let both = runs([line(30), Line::Summary(summary("node", 30, 30)), line(7)]);
        let c = compare(("b", &both), ("a", &summaries(&[(60, 1)])), None);
        assert_eq!((c.before.runs, c.rows[0].writes.before.mean), (1, 30.0));
    }
}
