//! The study's tables and ranking: each scenario against `default` in the same mode, k and
//! file size, and the investigation's claims checked against this machine's numbers.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{StudyRun, size_name};
use crate::output::text::fmt_ns;

/// A scenario's effect with Worker threads at one file size, over the k measured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Ranked {
    pub file_kib: f64,
    pub scenario: String,
    /// Throughput against `default` (mean over k of the per-k ratios).
    pub throughput_ratio: f64,
    /// Write acquisitions against `default` (mean over k).
    pub writes_ratio: f64,
}

fn find<'a>(runs: &'a [StudyRun], r: &StudyRun, scenario: &str) -> Option<&'a StudyRun> {
    runs.iter().find(|o| {
        o.scenario == scenario && o.mode == r.mode && o.k == r.k && o.file_kib == r.file_kib
    })
}

/// Per file size, the scenarios with Worker threads (the case the investigation is about)
/// from the best throughput gain over `default` down.
pub fn rank(runs: &[StudyRun]) -> Vec<Ranked> {
    let mut acc: BTreeMap<(u64, String), (f64, f64, u32)> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.mode == "workers") {
        let Some(d) = find(runs, r, "default") else {
            continue;
        };
        if d.ops_per_s <= 0.0 {
            continue;
        }
        let e = acc
            .entry(((r.file_kib * 1000.0) as u64, r.scenario.clone()))
            .or_default();
        e.0 += r.ops_per_s / d.ops_per_s;
        e.1 += r.write.count as f64 / (d.write.count.max(1)) as f64;
        e.2 += 1;
    }
    let mut out: Vec<Ranked> = acc
        .into_iter()
        .map(|((kib, scenario), (t, w, n))| Ranked {
            file_kib: kib as f64 / 1000.0,
            scenario,
            throughput_ratio: t / n as f64,
            writes_ratio: w / n as f64,
        })
        .collect();
    out.sort_by(|a, b| {
        a.file_kib
            .total_cmp(&b.file_kib)
            .then(b.throughput_ratio.total_cmp(&a.throughput_ratio))
    });
    out
}

/// The investigation's claims (its table), checked on this machine's numbers at 64 KiB.
fn claims(ranking: &[Ranked]) -> Vec<String> {
    let at = |s: &str| {
        ranking
            .iter()
            .find(|r| r.scenario == s && (r.file_kib - 64.0).abs() < 1e-9)
    };
    let verdict = |ok: bool| if ok { "agrees" } else { "disagrees" };
    let mut out = Vec::new();
    let mut claim = |s: &str, text: &str, test: &dyn Fn(&Ranked) -> bool| {
        out.push(match at(s) {
            Some(r) => format!(
                "- `{s}`: the investigation found {text}; here {:.2}x the throughput of `default` and {:.2}x its writes: {}",
                r.throughput_ratio,
                r.writes_ratio,
                verdict(test(r))
            ),
            None => format!("- `{s}`: the investigation found {text}; not measured here at 64 KiB"),
        });
    };
    claim("reuse", "it up to 5x faster", &|r| {
        r.throughput_ratio >= 1.5
    });
    claim("pool-256k", "+32% throughput and 2.5x fewer writes", &|r| {
        r.throughput_ratio >= 1.1 && r.writes_ratio <= 0.6
    });
    claim("async", "no fix", &|r| r.throughput_ratio < 1.1);
    claim("arena-1", "a marginal effect", &|r| {
        (0.85..=1.2).contains(&r.throughput_ratio)
    });
    out
}

/// The ranking as text (also in results.json, for the page).
pub fn ranking_text(ranking: &[Ranked]) -> String {
    let mut out = String::new();
    let mut last = f64::NAN;
    for r in ranking {
        if r.file_kib != last {
            last = r.file_kib;
            let _ = writeln!(out, "Worker threads, {} files:", size_name(r.file_kib));
        }
        let _ = writeln!(
            out,
            "  {:<18} {:>6.2}x throughput  {:>6.2}x writes",
            r.scenario, r.throughput_ratio, r.writes_ratio
        );
    }
    out.push_str("\nAgainst the investigation (64 KiB, Worker threads):\n");
    for c in claims(ranking) {
        out.push_str(&c);
        out.push('\n');
    }
    out
}

/// results.md: a table per file size, then the ranking and the claims.
pub fn markdown(runs: &[StudyRun], ranking: &[Ranked]) -> String {
    let mut out = String::from("# mmaplock-prof study: mitigations of mmap_lock contention\n");
    let mut sizes: Vec<f64> = runs.iter().map(|r| r.file_kib).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    for kib in sizes {
        let _ = write!(
            out,
            "\n## {} files\n\n| scenario | mode | k | reads/s | vs default | writes | vs default | mean write wait | p99 write wait | total write wait |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            size_name(kib)
        );
        for r in runs.iter().filter(|r| r.file_kib == kib) {
            let d = find(runs, r, "default");
            let vs = |a: f64, b: Option<f64>| {
                b.filter(|b| *b > 0.0)
                    .map_or("-".into(), |b| format!("{:.2}x", a / b))
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
                r.scenario,
                r.mode,
                r.k,
                r.ops_per_s,
                vs(r.ops_per_s, d.map(|d| d.ops_per_s)),
                r.write.count,
                vs(r.write.count as f64, d.map(|d| d.write.count as f64)),
                fmt_ns(r.write.wait_ns.mean as u64),
                fmt_ns(r.write.wait_ns.p99),
                fmt_ns(r.write.wait_ns.sum),
            );
        }
    }
    out.push_str("\n## Ranking on this machine\n\n```\n");
    out.push_str(&ranking_text(ranking));
    out.push_str("```\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregation::SideStats, output::report::Report};

    fn run(scenario: &str, mode: &'static str, k: u32, ops: f64, writes: u64) -> StudyRun {
        let s = SideStats {
            count: writes,
            ..SideStats::default()
        };
        StudyRun {
            scenario: scenario.into(),
            mode,
            k,
            file_kib: 64.0,
            ops_per_s: ops,
            write: crate::output::report::Stats::new(&s),
            report: Report::empty_for_tests(),
        }
    }

    #[test]
    fn scenarios_rank_by_throughput_against_default_and_claims_are_judged() {
        let runs = vec![
            run("default", "workers", 2, 100.0, 1000),
            run("default", "workers", 4, 100.0, 2000),
            run("reuse", "workers", 2, 400.0, 100),
            run("reuse", "workers", 4, 600.0, 200),
            run("pool-256k", "workers", 2, 130.0, 400),
            run("pool-256k", "workers", 4, 140.0, 800),
            run("async", "workers", 2, 50.0, 900),
            // Processes are not ranked (the investigation's case is Worker threads).
            run("reuse", "processes", 2, 1.0, 1),
        ];
        let r = rank(&runs);
        let order: Vec<&str> = r.iter().map(|x| x.scenario.as_str()).collect();
        assert_eq!(order, ["reuse", "pool-256k", "default", "async"]);
        assert!((r[0].throughput_ratio - 5.0).abs() < 1e-9);
        assert!((r[0].writes_ratio - 0.1).abs() < 1e-9);
        let text = ranking_text(&r);
        assert!(text.contains("`reuse`: the investigation found it up to 5x faster; here 5.00x"));
        assert!(text.contains("`pool-256k`") && text.contains("0.40x its writes: agrees"));
        assert!(
            text.contains("`arena-1`: the investigation found a marginal effect; not measured")
        );
        let md = markdown(&runs, &r);
        assert!(
            md.contains("| reuse | workers | 4 | 600 | 6.00x | 200 | 0.10x |"),
            "{md}"
        );
    }
}
