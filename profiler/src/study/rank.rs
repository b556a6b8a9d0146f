//! The study's tables, ranking and verdicts: each scenario against `default` in the same
//! mode, k and file size, over the repeated runs, with their spread; a difference the runs'
//! ranges do not separate is within noise (as `compare` judges), and so is a claim of the
//! investigation that the spread neither confirms nor refutes.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{StudyRun, size_name};
use crate::output::{
    compare::{Change, Spread},
    text::fmt_ns,
};

/// A scenario's effect with Worker threads at one file size, over the k and repeats measured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Ranked {
    pub file_kib: f64,
    pub scenario: String,
    /// Throughput against `default`: the mean of `throughput`.
    pub throughput_ratio: f64,
    /// Write acquisitions against `default`: the mean of `writes`.
    pub writes_ratio: f64,
    /// Over the repeats: each repeat's runs (one per k) against `default`'s mean in the same
    /// k, averaged over k.
    pub throughput: Spread,
    pub writes: Spread,
    /// Against `default`'s own repeats, as `compare` judges: `changed`, `within noise`, or
    /// `one run`; `baseline` for `default`.
    pub throughput_verdict: &'static str,
    pub writes_verdict: &'static str,
}

fn find<'a>(runs: &'a [StudyRun], r: &StudyRun, scenario: &str) -> Vec<&'a StudyRun> {
    runs.iter()
        .filter(|o| {
            o.scenario == scenario && o.mode == r.mode && o.k == r.k && o.file_kib == r.file_kib
        })
        .collect()
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0u32), |a, x| (a.0 + x, a.1 + 1));
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

fn size_key(kib: f64) -> u64 {
    (kib * 1000.0) as u64
}

/// Per file size, the scenarios with Worker threads (the case the investigation is about)
/// from the best throughput gain over `default` down.
pub fn rank(runs: &[StudyRun]) -> Vec<Ranked> {
    let workers: Vec<&StudyRun> = runs.iter().filter(|r| r.mode == "workers").collect();
    // `default`'s mean throughput and writes per (size, k).
    let mut base: BTreeMap<(u64, u32), (f64, f64)> = BTreeMap::new();
    for r in workers.iter().filter(|r| r.scenario == "default") {
        let d = find(runs, r, "default");
        base.insert(
            (size_key(r.file_kib), r.k),
            (
                mean(d.iter().map(|d| d.ops_per_s)),
                mean(d.iter().map(|d| d.write.count as f64)),
            ),
        );
    }
    // Per (size, scenario), per repeat: the runs' ratios to that mean, summed over k.
    type PerRepeat = BTreeMap<u32, (f64, f64, u32)>;
    let mut norm: BTreeMap<(u64, String), PerRepeat> = BTreeMap::new();
    for r in &workers {
        let Some(&(t, w)) = base.get(&(size_key(r.file_kib), r.k)) else {
            continue;
        };
        if t <= 0.0 {
            continue;
        }
        let e = norm
            .entry((size_key(r.file_kib), r.scenario.clone()))
            .or_default()
            .entry(r.repeat)
            .or_default();
        e.0 += r.ops_per_s / t;
        e.1 += r.write.count as f64 / w.max(1.0);
        e.2 += 1;
    }
    let series = |m: &PerRepeat| -> (Vec<f64>, Vec<f64>) {
        m.values()
            .map(|&(t, w, n)| (t / f64::from(n), w / f64::from(n)))
            .unzip()
    };
    let mut out: Vec<Ranked> = norm
        .iter()
        .map(|((kib, scenario), m)| {
            let (t, w) = series(m);
            let (dt, dw) = norm
                .get(&(*kib, "default".to_string()))
                .map(series)
                .unwrap_or_default();
            let verdict = |d: &[f64], x: &[f64]| {
                if scenario == "default" {
                    "baseline"
                } else {
                    Change::of(d, x).verdict
                }
            };
            let (throughput, writes) = (Spread::of(&t), Spread::of(&w));
            Ranked {
                file_kib: *kib as f64 / 1000.0,
                scenario: scenario.clone(),
                throughput_ratio: throughput.mean,
                writes_ratio: writes.mean,
                throughput_verdict: verdict(&dt, &t),
                writes_verdict: verdict(&dw, &w),
                throughput,
                writes,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        a.file_kib
            .total_cmp(&b.file_kib)
            .then(b.throughput_ratio.total_cmp(&a.throughput_ratio))
    });
    out
}

/// One of the investigation's claims, judged on this machine's runs.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClaimVerdict {
    pub scenario: &'static str,
    /// What the investigation found.
    pub claim: &'static str,
    /// `agrees`, `disagrees`, `within noise` (the runs' spread neither confirms nor refutes
    /// it), or `not measured`.
    pub verdict: &'static str,
    pub throughput: Option<Spread>,
    pub writes: Option<Spread>,
}

struct Claim {
    scenario: &'static str,
    found: &'static str,
    /// On (throughput ratio, writes ratio).
    test: fn(f64, f64) -> bool,
    /// The claim is of an effect: it holds only when the scenario differs from `default`
    /// beyond noise.
    effect: bool,
}

/// The investigation's table.
const CLAIMS: &[Claim] = &[
    Claim {
        scenario: "reuse",
        found: "it up to 5x faster",
        test: |t, _| t >= 1.5,
        effect: true,
    },
    Claim {
        scenario: "pool-256k",
        found: "+32% throughput and 2.5x fewer writes",
        test: |t, w| t >= 1.1 && w <= 0.6,
        effect: true,
    },
    Claim {
        scenario: "async",
        found: "no fix",
        test: |t, _| t < 1.1,
        effect: false,
    },
    Claim {
        scenario: "arena-1",
        found: "a marginal effect",
        test: |t, _| (0.85..=1.2).contains(&t),
        effect: false,
    },
];

/// A claim holds if it holds over the whole spread of the runs (every corner of the
/// throughput and writes ranges), fails if it fails over all of it, and is within noise
/// otherwise; with one run a side, the mean decides.
fn judge(c: &Claim, r: &Ranked) -> &'static str {
    let (t, w) = (&r.throughput, &r.writes);
    if t.runs < 2 {
        return if (c.test)(t.mean, w.mean) {
            "agrees"
        } else {
            "disagrees"
        };
    }
    let corners = [
        (t.min, w.min),
        (t.min, w.max),
        (t.max, w.min),
        (t.max, w.max),
    ];
    let holds = corners.iter().filter(|(t, w)| (c.test)(*t, *w)).count();
    let changed = r.throughput_verdict == "changed";
    match holds {
        4 if !c.effect || changed => "agrees",
        // No effect claimed, and none told apart from default's own spread.
        0 if c.effect || changed => "disagrees",
        _ => "within noise",
    }
}

/// The investigation's claims, checked on this machine's runs at 64 KiB.
pub fn claims(ranking: &[Ranked]) -> Vec<ClaimVerdict> {
    CLAIMS
        .iter()
        .map(|c| {
            let r = ranking
                .iter()
                .find(|r| r.scenario == c.scenario && (r.file_kib - 64.0).abs() < 1e-9);
            ClaimVerdict {
                scenario: c.scenario,
                claim: c.found,
                verdict: r.map_or("not measured", |r| judge(c, r)),
                throughput: r.map(|r| r.throughput),
                writes: r.map(|r| r.writes),
            }
        })
        .collect()
}

/// `1.24x (1.10-1.31)`: a ratio and its range over the runs.
fn spread(s: &Spread) -> String {
    if s.runs > 1 {
        format!("{:.2}x ({:.2}-{:.2})", s.mean, s.min, s.max)
    } else {
        format!("{:.2}x", s.mean)
    }
}

fn claim_text(c: &ClaimVerdict) -> String {
    match (&c.throughput, &c.writes) {
        (Some(t), Some(w)) => format!(
            "- `{}`: the investigation found {}; here {} the throughput of `default` and {} its writes, over {} run{}: {}",
            c.scenario,
            c.claim,
            spread(t),
            spread(w),
            t.runs,
            if t.runs == 1 { "" } else { "s" },
            c.verdict
        ),
        _ => format!(
            "- `{}`: the investigation found {}; not measured here at 64 KiB",
            c.scenario, c.claim
        ),
    }
}

/// The ranking as text (also in results.json).
pub fn ranking_text(ranking: &[Ranked], claims: &[ClaimVerdict]) -> String {
    let mut out = String::new();
    let mut last = f64::NAN;
    for r in ranking {
        if r.file_kib != last {
            last = r.file_kib;
            let _ = writeln!(out, "Worker threads, {} files:", size_name(r.file_kib));
        }
        let _ = writeln!(
            out,
            "  {:<18} {:>20} throughput {:<13} {:>20} writes {}",
            r.scenario,
            spread(&r.throughput),
            r.throughput_verdict,
            spread(&r.writes),
            r.writes_verdict
        );
    }
    out.push_str("\nAgainst the investigation (64 KiB, Worker threads):\n");
    for c in claims {
        out.push_str(&claim_text(c));
        out.push('\n');
    }
    out
}

/// results.md: a table per file size (each cell's runs pooled), then the ranking and the
/// claims.
pub fn markdown(runs: &[StudyRun], ranking: &[Ranked], claims: &[ClaimVerdict]) -> String {
    let mut out = String::from("# mmaplock-prof study: mitigations of mmap_lock contention\n");
    let mut sizes: Vec<f64> = runs.iter().map(|r| r.file_kib).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    for kib in sizes {
        let _ = write!(
            out,
            "\n## {} files\n\nEach row: the mean of its runs (reads/s with their range).\n\n| scenario | mode | k | runs | reads/s | range | vs default | writes | vs default | mean write wait | p99 write wait | total write wait |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            size_name(kib)
        );
        let mut done: Vec<(&str, &str, u32)> = Vec::new();
        for r in runs.iter().filter(|r| r.file_kib == kib) {
            if done.contains(&(r.scenario.as_str(), r.mode, r.k)) {
                continue;
            }
            done.push((&r.scenario, r.mode, r.k));
            let cell = find(runs, r, &r.scenario);
            let d = find(runs, r, "default");
            let m = |f: &dyn Fn(&StudyRun) -> f64| mean(cell.iter().map(|x| f(x)));
            let dm = |f: &dyn Fn(&StudyRun) -> f64| mean(d.iter().map(|x| f(x)));
            let vs = |a: f64, b: f64| {
                if d.is_empty() || b <= 0.0 {
                    "-".into()
                } else {
                    format!("{:.2}x", a / b)
                }
            };
            let ops = Spread::of(&cell.iter().map(|x| x.ops_per_s).collect::<Vec<_>>());
            let writes = |x: &StudyRun| x.write.count as f64;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {:.0}-{:.0} | {} | {:.0} | {} | {} | {} | {} |",
                r.scenario,
                r.mode,
                r.k,
                cell.len(),
                ops.mean,
                ops.min,
                ops.max,
                vs(ops.mean, dm(&|x| x.ops_per_s)),
                m(&writes),
                vs(m(&writes), dm(&writes)),
                fmt_ns(m(&|x| x.write.wait_ns.mean) as u64),
                fmt_ns(m(&|x| x.write.wait_ns.p99 as f64) as u64),
                fmt_ns(m(&|x| x.write.wait_ns.sum as f64) as u64),
            );
        }
    }
    out.push_str("\n## Ranking on this machine\n\n```\n");
    out.push_str(&ranking_text(ranking, claims));
    out.push_str("```\n");
    out
}

#[cfg(test)]
#[path = "rank_tests.rs"]
mod tests;
