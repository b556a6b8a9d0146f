use super::*;
use crate::{aggregation::SideStats, output::report::Report};

fn run(scenario: &str, mode: &'static str, k: u32, repeat: u32, ops: f64, writes: u64) -> StudyRun {
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
    assert!(text.contains("`pool-256k`") && text.contains("0.40x its writes, over 1 run: agrees"));
    assert!(text.contains("`arena-1`: the investigation found a marginal effect; not measured"));
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
