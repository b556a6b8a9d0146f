//! ROOT-ONLY: `mmaplock-prof study --quick` end to end: every scenario as Worker threads and
//! as processes at 64 KiB with k = 2 and 4, profiled; its results show what the mechanisms
//! guarantee (reading into one reused Buffer removes most writes; Buffer's 256 KiB pool cuts
//! the Workers' writes at 64 KiB), and its page renders.

use std::process::Command;

use integration_tests::{
    assert_self_contained, charts, profiler_bin, rendered_dom, require_root_and_tracepoints,
};
use serde_json::Value;

const SCENARIOS: [&str; 8] = [
    "default",
    "pool-256k",
    "reuse",
    "async",
    "arena-1",
    "finalization-pool",
    "slab",
    "dispose",
];

#[test]
fn the_quick_study_runs_every_scenario_and_shows_what_the_mechanisms_guarantee() {
    if !require_root_and_tracepoints() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(profiler_bin())
        .args(["study", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    assert_eq!(results["type"], "study");
    let runs = results["runs"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        SCENARIOS.len() * 2 * 2,
        "8 scenarios x 2 modes x 2 k"
    );
    let run = |scenario: &str, mode: &str, k: u64| {
        runs.iter()
            .find(|r| r["scenario"] == scenario && r["mode"] == mode && r["k"] == k)
            .unwrap_or_else(|| panic!("no run {scenario} {mode} k={k}"))
    };
    let writes = |r: &Value| r["write"]["count"].as_u64().unwrap();
    for s in SCENARIOS {
        for mode in ["workers", "processes"] {
            for k in [2, 4] {
                let r = run(s, mode, k);
                assert_eq!(r["file_kib"], 64.0);
                assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{s} {mode} {k}");
                assert_eq!(r["report"]["type"], "summary");
            }
        }
    }
    for k in [2, 4] {
        for mode in ["workers", "processes"] {
            let (d, reuse) = (
                writes(run("default", mode, k)),
                writes(run("reuse", mode, k)),
            );
            // One Buffer for every read: the reads' allocations are gone, what is left is V8's
            // own (measured 0.13-0.23x with runs of ~10,000 reads).
            assert!(
                reuse * 3 < d,
                "reuse {reuse} against default {d} ({mode}, k={k})"
            );
        }
        // 64 KiB Buffers come from the 256 KiB pool: fewer allocations in the Workers' shared
        // heap (measured 0.61-0.76x). Not for processes: there each pool's 256 KiB often is an
        // mmap and munmap of its own (measured 1.3-1.7x).
        let (d, pool) = (
            writes(run("default", "workers", k)),
            writes(run("pool-256k", "workers", k)),
        );
        assert!(pool < d, "pool-256k {pool} against default {d} (k={k})");
    }
    let md = std::fs::read_to_string(dir.path().join("results.md")).unwrap();
    for s in SCENARIOS {
        assert!(md.contains(&format!("| {s} |")), "{s} not in results.md");
    }
    assert!(md.contains("Ranking on this machine") && md.contains("the investigation found"));
    let page = dir.path().join("report.html");
    let Some(dom) = rendered_dom(&page, None) else {
        return;
    };
    assert_self_contained(&dom);
    let found = charts(&dom);
    for want in [
        "throughput-64000-2",
        "writes-64000-4",
        "mean-wait-64000-2",
        "p99-wait-64000-4",
    ] {
        assert!(found.iter().any(|c| c == want), "no {want} in {found:?}");
    }
    assert!(found.iter().any(|c| c.starts_with("wait-histogram-reuse-")));
}
