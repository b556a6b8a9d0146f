//! `mmaplock-prof compare BEFORE AFTER`: did a fix remove the contention? Per process name,
//! and within it per thread role and per write cause: writes, total, mean and p99 write wait
//! before and after, with the ratio. A file may hold several runs (each ending with its
//! summary line): then each figure is the mean over the runs with its range, and a difference
//! whose ranges overlap is called within run-to-run noise rather than claimed.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::output::{html::RunLines, report::SCHEMA_VERSION, text::fmt_ns};

/// One figure over the runs of one side.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
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
    pub findings: Vec<super::compare_findings::FindingChange>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub file: String,
    pub runs: usize,
}

/// Write figures of one group in one run: count, wait sum, and the merged wait buckets.
#[derive(Clone, Debug, Default)]
struct Fig {
    count: u64,
    wait: u64,
    buckets: BTreeMap<u64, u64>,
}

impl Fig {
    fn add(&mut self, stats: &Value) {
        self.count += stats["count"].as_u64().unwrap_or(0);
        self.wait += stats["wait_ns"]["sum"].as_u64().unwrap_or(0);
        for b in stats["wait_ns"]["buckets"].as_array().into_iter().flatten() {
            if let (Some(ub), Some(n)) = (b[0].as_u64(), b[1].as_u64()) {
                *self.buckets.entry(ub).or_default() += n;
            }
        }
    }

    fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.wait as f64 / self.count as f64
        }
    }

    /// The 99th percentile at bucket resolution: the upper bound of the bucket it falls in.
    fn p99(&self) -> f64 {
        let total: u64 = self.buckets.values().sum();
        let want = (total as f64 * 0.99).ceil() as u64;
        let mut seen = 0;
        for (&ub, &n) in &self.buckets {
            seen += n;
            if seen >= want && n > 0 {
                return ub as f64;
            }
        }
        0.0
    }
}

type Key = (String, &'static str, String);

/// A run's figures per (process name, group, key): processes with one name are pooled.
fn figures(summary: &Value) -> BTreeMap<Key, Fig> {
    let mut m: BTreeMap<Key, Fig> = BTreeMap::new();
    for p in summary["processes"].as_array().into_iter().flatten() {
        let name = p["comm"].as_str().unwrap_or("?").to_string();
        m.entry((name.clone(), "all", "all".into()))
            .or_default()
            .add(&p["write"]);
        for t in p["threads"].as_array().into_iter().flatten() {
            let role = t["role"].as_str().unwrap_or("other").to_string();
            m.entry((name.clone(), "role", role))
                .or_default()
                .add(&t["write"]);
        }
        for c in p["causes"].as_array().into_iter().flatten() {
            let cause = c["cause"].as_str().unwrap_or("other").to_string();
            m.entry((name.clone(), "cause", cause))
                .or_default()
                .add(&c["write"]);
        }
    }
    m
}

/// Compares the runs of two files (with a study of the host, the findings quote its
/// measured effects).
pub fn compare(
    before: (&str, &RunLines),
    after: (&str, &RunLines),
    study: Option<&super::findings::StudyEffects>,
) -> Comparison {
    let (summaries_b, summaries_a) = (before.1.run_summaries(), after.1.run_summaries());
    let runs_b: Vec<BTreeMap<Key, Fig>> = summaries_b.iter().map(figures).collect();
    let runs_a: Vec<BTreeMap<Key, Fig>> = summaries_a.iter().map(figures).collect();
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
                wait_ns: change(&|f| f.wait as f64),
                mean_wait_ns: change(&|f| f.mean()),
                p99_wait_ns: change(&|f| f.p99()),
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
        findings: super::compare_findings::changes(&summaries_b, &summaries_a, study),
    }
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

/// The comparison as a table for people.
pub fn to_text(c: &Comparison) -> String {
    let mut out = format!(
        "mmaplock-prof compare: {} ({} run{}) -> {} ({} run{})\n",
        c.before.file,
        c.before.runs,
        if c.before.runs == 1 { "" } else { "s" },
        c.after.file,
        c.after.runs,
        if c.after.runs == 1 { "" } else { "s" },
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
        out.push_str(&format!(
            "  {:<28} {}  {}  {}  {}  {} / {}\n",
            label,
            show(&r.writes, false),
            show(&r.wait_ns, true),
            show(&r.mean_wait_ns, true),
            show(&r.p99_wait_ns, true),
            r.writes.verdict,
            r.wait_ns.verdict
        ));
    }
    out.push_str(&super::compare_findings::to_text(&c.findings));
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

    fn summary(comm: &str, writes: u64, wait: u64) -> Value {
        serde_json::json!({"type":"summary","processes":[{"pid":1,"comm":comm,
            "write":{"count":writes,"wait_ns":{"sum":wait,"buckets":[[1024, writes]]}},
            "threads":[{"role":"worker","write":{"count":writes,"wait_ns":{"sum":wait,"buckets":[]}}}],
            "causes":[{"cause":"mmap","write":{"count":writes,"wait_ns":{"sum":wait,"buckets":[]}}}]}]})
    }

    fn runs(v: &[(u64, u64)]) -> RunLines {
        RunLines {
            summaries: v.iter().map(|&(w, t)| summary("node", w, t)).collect(),
            ..RunLines::default()
        }
    }

    #[test]
    fn ratios_and_noise_verdicts() {
        let before = runs(&[(1000, 5000), (1100, 5200)]);
        let after = runs(&[(400, 900), (420, 1000)]);
        let c = compare(("b", &before), ("a", &after), None);
        let all = c.rows.iter().find(|r| r.group == "all").unwrap();
        assert_eq!(all.writes.before.mean, 1050.0);
        assert_eq!(all.writes.verdict, "changed");
        assert!((all.writes.ratio.unwrap() - 410.0 / 1050.0).abs() < 1e-9);
        assert_eq!(all.p99_wait_ns.before.mean, 1024.0);
        // Overlapping ranges: noise.
        let same = compare(
            ("b", &before),
            ("a", &runs(&[(1050, 5100), (990, 4900)])),
            None,
        );
        assert_eq!(same.rows[0].writes.verdict, "within noise");
        // One run each: not judged.
        let one = compare(("b", &runs(&[(10, 1)])), ("a", &runs(&[(20, 1)])), None);
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
        let proc = |pid: u64, comm: &str, writes: u64, bucket: u64| {
            serde_json::json!({"pid": pid, "comm": comm,
                "write": {"count": writes, "wait_ns": {"sum": writes * 10, "buckets": [[bucket, writes]]}},
                "threads": [{"role": "worker", "write": {"count": writes, "wait_ns": {"sum": 0}}},
                            {"role": "main", "write": {"count": 1, "wait_ns": {"sum": 0}}}]})
        };
        let before = RunLines {
            summaries: vec![serde_json::json!({"type": "summary", "processes": [
                proc(1, "node", 100, 1024), proc(2, "node", 300, 1 << 20), proc(3, "gone", 5, 64)]})],
            ..RunLines::default()
        };
        let after = RunLines {
            summaries: vec![serde_json::json!({"type": "summary", "processes": [
                proc(4, "node", 40, 1024), proc(5, "new", 7, 64)]})],
            ..RunLines::default()
        };
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
        // The pooled buckets: 300 of 400 waits in the 1 MiB bucket, so the p99 is there.
        assert_eq!(node.p99_wait_ns.before.mean, (1u64 << 20) as f64);
        assert_eq!(node.p99_wait_ns.after.mean, 1024.0);
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
            s["type"] = "interval".into();
            s
        };
        let cut = RunLines {
            intervals: vec![line(30), line(20)],
            ..RunLines::default()
        };
        let c = compare(("cut", &cut), ("a", &runs(&[(100, 1)])), None);
        assert_eq!(c.before.runs, 1);
        assert_eq!(c.rows[0].writes.before.mean, 50.0);
        assert_eq!(c.rows[0].writes.ratio, Some(2.0));
    }
}
