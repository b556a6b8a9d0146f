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
mod tests {
    use super::*;
    use crate::{aggregation::SideStats, output::report::Report};

    fn run(
        scenario: &str,
        mode: &'static str,
        k: u32,
        repeat: u32,
        ops: f64,
        writes: u64,
    ) -> StudyRun {
        let s = SideStats {
            count: writes,
            ..SideStats::default()
        };
        StudyRun {
            scenario: scenario.into(),
            mode,
            k,
            file_kib: 64.0,
            repeat,
            ops_per_s: ops,
            write: crate::output::report::Stats::new(&s),
            report: Report::empty_for_tests(),
        }
    }

    #[test]
    fn scenarios_rank_by_throughput_against_default_and_claims_are_judged() {
        let runs = vec![
            run("default", "workers", 2, 0, 100.0, 1000),
            run("default", "workers", 4, 0, 100.0, 2000),
            run("reuse", "workers", 2, 0, 400.0, 100),
            run("reuse", "workers", 4, 0, 600.0, 200),
            run("pool-256k", "workers", 2, 0, 130.0, 400),
            run("pool-256k", "workers", 4, 0, 140.0, 800),
            run("async", "workers", 2, 0, 50.0, 900),
            // Processes are not ranked (the investigation's case is Worker threads).
            run("reuse", "processes", 2, 0, 1.0, 1),
        ];
        let r = rank(&runs);
        let order: Vec<&str> = r.iter().map(|x| x.scenario.as_str()).collect();
        assert_eq!(order, ["reuse", "pool-256k", "default", "async"]);
        assert!((r[0].throughput_ratio - 5.0).abs() < 1e-9);
        assert!((r[0].writes_ratio - 0.1).abs() < 1e-9);
        assert_eq!(r[0].throughput_verdict, "one run");
        let c = claims(&r);
        let text = ranking_text(&r, &c);
        assert!(text.contains("`reuse`: the investigation found it up to 5x faster; here 5.00x"));
        assert!(
            text.contains("`pool-256k`") && text.contains("0.40x its writes, over 1 run: agrees")
        );
        assert!(
            text.contains("`arena-1`: the investigation found a marginal effect; not measured")
        );
        let md = markdown(&runs, &r, &c);
        assert!(
            md.contains("| reuse | workers | 4 | 1 | 600 | 600-600 | 6.00x | 200 | 0.10x |"),
            "{md}"
        );
    }

    /// Three repeats of `default` and `arena-1` whose throughputs are drawn around the same
    /// ratios as the project's full run (1.24x) and a quick run (1.1x), which alone said
    /// "disagrees" and "agrees" with "a marginal effect": with their spread, one says
    /// "within noise".
    #[test]
    fn verdicts_over_repeats_say_within_noise_rather_than_flip() {
        let study = |default: [f64; 3], arena: [f64; 3]| {
            let mut runs = Vec::new();
            for r in 0..3 {
                runs.push(run("default", "workers", 4, r, default[r as usize], 2700));
                runs.push(run("arena-1", "workers", 4, r, arena[r as usize], 1000));
                runs.push(run(
                    "reuse",
                    "workers",
                    4,
                    r,
                    3.2 * default[r as usize],
                    400,
                ));
            }
            let ranking = rank(&runs);
            let c = claims(&ranking);
            let of = |s: &str| c.iter().find(|c| c.scenario == s).unwrap().verdict;
            (of("arena-1"), of("reuse"), ranking)
        };
        // A noisy machine: default's own runs spread by a fifth.
        let (full, reuse_full, ranking) = study(
            [80_000.0, 95_000.0, 70_000.0],
            [99_000.0, 104_000.0, 92_000.0],
        );
        let (quick, reuse_quick, _) = study(
            [90_000.0, 75_000.0, 88_000.0],
            [88_000.0, 99_000.0, 94_000.0],
        );
        // The full run's range straddles "marginal" (1.13-1.27x): within noise; the quick
        // run's lies inside it (1.04-1.17x): agrees. Never agrees here and disagrees there.
        assert_eq!(full, "within noise", "{ranking:?}");
        assert_eq!(quick, "agrees");
        // An effect far beyond the noise is called the same both times.
        assert_eq!((reuse_full, reuse_quick), ("agrees", "agrees"));
        let arena = ranking.iter().find(|r| r.scenario == "arena-1").unwrap();
        assert_eq!(arena.throughput.runs, 3);
        assert!(arena.throughput.min < arena.throughput.max);
        assert_eq!(arena.throughput_verdict, "within noise");
        assert_eq!(arena.writes_verdict, "changed");
        // A quiet machine: arena-1 beyond noise and beyond "marginal": disagrees.
        let (quiet, _, _) = study(
            [80_000.0, 81_000.0, 79_500.0],
            [99_000.0, 100_000.0, 98_500.0],
        );
        assert_eq!(quiet, "disagrees");
        // ... and within "marginal": agrees.
        let (marginal, _, _) = study(
            [80_000.0, 81_000.0, 79_500.0],
            [84_000.0, 85_000.0, 83_500.0],
        );
        assert_eq!(marginal, "agrees");
    }
}
