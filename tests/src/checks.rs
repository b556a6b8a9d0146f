//! Checks of a report against the contract (docs/report-format.md) and against what a
//! workload did: the STATS and `lost` objects, mmap-churn's write counts, roles.js's roles,
//! and sampled stacks.

use serde_json::Value;

use crate::{find, stats};

/// In `roles.js`'s process entry (`pid`): its main thread is `main`, each of its `workers`
/// `worker` (whatever else each test checks of them).
pub fn assert_main_and_workers(p: &Value, pid: u32, workers: &[u64]) {
    let role_of = |tid: u64| find(p, "threads", "tid", tid).map(|t| t["role"].clone());
    assert_eq!(role_of(u64::from(pid)), Some("main".into()));
    for tid in workers {
        assert_eq!(
            role_of(*tid),
            Some("worker".into()),
            "Worker {tid}: {}",
            p["threads"]
        );
    }
}

/// Write acquisitions a mmap-churn process adds to its 2*T*N once the work starts: the
/// process's own exit (exit_mmap takes the lock for write once), and glibc trimming the
/// threads' malloc arenas and freeing thread stacks as they exit (0 to 2 per thread, seen
/// 1 + 0 to 4 for T = 4 here). Generous enough for other glibc versions, small against 2*T*N.
pub fn churn_slack(threads: u64) -> u64 {
    4 + 2 * threads
}

/// Checks a mmap-churn process's entry (`t` threads x `n` iterations, `pid`) against what it
/// did: its writes are 2*T*N plus at most [`churn_slack`], each worker thread made exactly 2N
/// (+ its exit's clean-up) and is `other` (started by Rust's std::thread, none of Node's),
/// and the main thread is `main`. Returns the process's write count.
pub fn check_churn_writes(p: &Value, pid: u32, t: u64, n: u64, what: &str) -> u64 {
    let (writes, _) = stats(p, "write");
    assert_churn_total(writes, t, n, what, "");
    let threads = p["threads"].as_array().unwrap();
    let busy: Vec<&Value> = threads
        .iter()
        .filter(|th| th["write"]["count"].as_u64().unwrap() >= 2 * n)
        .collect();
    assert_eq!(busy.len(), t as usize, "{what}: {threads:?}");
    for th in &busy {
        assert!(th["write"]["count"].as_u64().unwrap() <= 2 * n + 2, "{th}");
        assert_eq!(th["role"], "other", "{th}");
        assert_ne!(th["tid"], pid, "{th}");
    }
    let main = threads.iter().find(|th| th["tid"] == pid).expect("main");
    assert_eq!(main["role"], "main");
    writes
}

/// The write count of a mmap-churn process of `t` threads x `n` iterations (all its
/// threads', or those `what` names) against what it did: 2*T*N plus at most [`churn_slack`].
/// `context` follows the failure's message.
pub fn assert_churn_total(writes: u64, t: u64, n: u64, what: &str, context: &str) {
    let expected = 2 * t * n;
    let most = expected + churn_slack(t);
    eprintln!(
        "{what}: writes {writes}, expected {expected} + at most {}",
        churn_slack(t)
    );
    assert!(
        (expected..=most).contains(&writes),
        "{what}: writes {writes} not in {expected}..={most}{context}"
    );
}

/// Checks one STATS object of the contract, field by field.
pub fn check_stats(s: &Value, what: &str) {
    assert!(s["count"].is_u64(), "{what}.count: {s}");
    assert!(s["failed_trylocks"].is_u64(), "{what}.failed_trylocks");
    for d in ["wait_ns", "hold_ns"] {
        let h = &s[d];
        for f in ["sum", "max", "p50", "p90", "p99", "p999"] {
            assert!(h[f].is_u64(), "{what}.{d}.{f}: {h}");
        }
        assert!(h["mean"].is_number(), "{what}.{d}.mean");
        let buckets = h["buckets"].as_array().expect("buckets");
        let mut total = 0;
        let mut prev = 0;
        for b in buckets {
            let (ub, n) = (b[0].as_u64().unwrap(), b[1].as_u64().unwrap());
            assert!(
                ub.is_power_of_two() && ub > prev && n > 0,
                "{what}.{d}: {b}"
            );
            prev = ub;
            total += n;
        }
        assert_eq!(
            total,
            s["count"].as_u64().unwrap(),
            "{what}.{d} bucket total"
        );
        let (p50, p99, max) = (h["p50"].as_u64(), h["p99"].as_u64(), h["max"].as_u64());
        assert!(p50 <= p99 && p99 <= max, "{what}.{d} percentiles ordered");
    }
}

/// The reasons an acquisition can be lost, each counted in `lost` (docs/report-format.md);
/// `lost.events` is their sum. `map_full`, `stacks` and `skipped` (program runs the kernel
/// skipped, where tracepoint programs can be preempted) are counted apart.
pub const LOST_EVENT_REASONS: [&str; 5] = [
    "nested",
    "no_state",
    "ring_full",
    "exit_flush",
    "exit_pending",
];

/// Checks a report line's `lost` object and returns `lost.events`. `exit_pending` (threads
/// still exiting when the run ended) is a summary figure: an interval line may omit it.
pub fn check_lost(report: &Value) -> u64 {
    let lost = &report["lost"];
    let summary = report["type"] == "summary";
    for k in ["events", "map_full", "stacks", "skipped"]
        .iter()
        .chain(LOST_EVENT_REASONS.iter())
    {
        let optional = *k == "exit_pending" && !summary && lost[*k].is_null();
        assert!(lost[*k].is_u64() || optional, "lost.{k}: {lost}");
    }
    let events = lost["events"].as_u64().unwrap();
    let sum: u64 = LOST_EVENT_REASONS
        .iter()
        .map(|k| lost[*k].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(events, sum, "lost.events is the sum of its reasons: {lost}");
    events
}

/// In folded stacks: at least `min` sampled `mmap` writes, nine in ten or more of them through
/// a frame containing `needle`. `min` is what makes nine in ten mean something (20), not how
/// many the workload makes: a slow host loses more of a process's first stacks to the
/// profiler's cold start (counted in `lost.stacks`; 84 of a hundred-odd kept once with the
/// host slowed).
pub fn assert_mmaps_named(folded: &str, needle: &str, min: u64, what: &str) {
    let (sampled, named) = mmap_samples(folded, needle);
    eprintln!("{what}: {sampled} sampled mmaps, {named} through {needle}");
    assert!(sampled >= min, "{sampled} sampled mmaps");
    assert!(
        named * 10 >= sampled * 9,
        "{needle} in {named} of {sampled} sampled mmaps"
    );
}

/// In folded stacks (`--stacks`): sampled `mmap` writes (innermost frame mmap), and how many of them have `needle`.
pub fn mmap_samples(folded: &str, needle: &str) -> (u64, u64) {
    let mut all = (0, 0);
    for l in folded.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        let innermost = stack.rsplit(';').next().unwrap_or("");
        if innermost.contains("mmap") && !innermost.contains("munmap") {
            all.0 += n;
            if stack.contains(needle) {
                all.1 += n;
            }
        }
    }
    all
}

/// How many of `expected`'s events `got` misses under their own key (counted nowhere, or
/// under another key: a role, a cause); None when it counts more in all. A profile may fall
/// short of the ground truth only by lock events the kernel skipped (`lost.skipped`, on
/// kernels that run tracepoint programs preemptible), never count more. Under another key:
/// seen once on Linux 7.3, 5 of a short process's exec-time writes under its Worker's role
/// in a run where 15 program runs were skipped.
pub fn shortfall<K: Ord>(
    expected: &std::collections::BTreeMap<K, u64>,
    got: &std::collections::BTreeMap<K, u64>,
) -> Option<u64> {
    if got.values().sum::<u64>() > expected.values().sum::<u64>() {
        return None;
    }
    Some(
        expected
            .iter()
            .map(|(k, &e)| e.saturating_sub(got.get(k).copied().unwrap_or(0)))
            .sum(),
    )
}

/// Sampled writes kept in a process's `dsos` (every sampled stack kept is charged to one DSO).
pub fn sampled_writes(p: &Value) -> u64 {
    p["dsos"]
        .as_array()
        .expect("dsos with stack sampling")
        .iter()
        .map(|d| d["write"]["count"].as_u64().unwrap())
        .sum()
}

#[cfg(test)]
mod shortfall_tests {
    use super::shortfall;
    use std::collections::BTreeMap;

    #[test]
    fn short_or_moved_counts_what_is_missing_under_its_own_key() {
        let m = |v: &[(&'static str, u64)]| v.iter().copied().collect::<BTreeMap<_, _>>();
        let expected = m(&[("main", 10), ("worker", 5)]);
        assert_eq!(shortfall(&expected, &expected), Some(0));
        assert_eq!(
            shortfall(&expected, &m(&[("main", 8), ("worker", 5)])),
            Some(2)
        );
        // Moved: 5 of main's under the worker's key, and under a key of its own.
        assert_eq!(
            shortfall(&expected, &m(&[("main", 5), ("worker", 10)])),
            Some(5)
        );
        assert_eq!(
            shortfall(&expected, &m(&[("main", 5), ("worker", 5), ("x", 5)])),
            Some(5)
        );
        // More in all: never.
        assert_eq!(
            shortfall(&expected, &m(&[("main", 11), ("worker", 5)])),
            None
        );
    }
}
