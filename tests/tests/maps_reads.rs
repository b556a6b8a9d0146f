//! ROOT-ONLY: what the profiler reads of a Node process that starts 250 Workers in waves, as
//! a test runner does (`waves.js`: each Worker a new isolate, new code, new mappings), as the
//! summary counts it (`read_by_profiler`): its memory map read whole at most once per reader
//! (thread roles, stack unwinding; one read may serve both), then only as the documented token buckets allow over the run's
//! duration (docs/report-format.md), a mapping looked up alone with `PROCMAP_QUERY` where the
//! kernel has it; and the sampled stacks still named. No time is asserted: the bounds are
//! counts, derived from the buckets' burst and period and the run's own `duration_s`. The
//! profiler's hold of the lock over the process's wait (issue 34: at most 1%) is printed as a
//! figure; `cargo xtask bench` measures it over rounds.
//!
//! 250 Workers, not fewer: the case, and each wave maps code the map read at first
//! did not have, so the lookups are exercised throughout the run, not only at its start.
//!
//! Not in the kernel matrix: under TCG every hold is lengthened by the emulated tracing, and a
//! one-vCPU guest's threads rarely wait on each other. Run by hand in the matrix's 6.1 guest
//! with 24 Workers (2026-11-29, three runs each): 0.73-0.90% of the process's wait, 850-1,149
//! acquisitions (the map read whole 6-7 times; 576-1,096 V8 objects copied at the samples);
//! 0.72-1.08% before the copies (921-1,266 acquisitions). The rest are V8 heap reads, which
//! take the lock on every kernel: the names of each new isolate's functions.

use std::{path::Path, process::Command};

use integration_tests::{
    Profiler, Workload, bpf_test, fixture, kernel_features, process, profile_until_done,
};
use serde_json::Value;

/// The readers of a process's map: thread roles and stack unwinding, each reading it whole
/// once at first (`registry::procmaps::live`).
const READERS: u64 = 2;
/// The whole map read again: a burst, then one per period (`REREAD_BURST`, `REREAD_EVERY`).
const REREAD_BURST: u64 = 2;
const REREAD_EVERY_MS: u64 = 1_000;
/// A mapping asked for alone (`QUERY_BURST`, `QUERY_EVERY`).
const QUERY_BURST: u64 = 16;
const QUERY_EVERY_MS: u64 = 50;

/// Hidden switch: the profiler behaves as on a kernel without `PROCMAP_QUERY`.
const NO_QUERY_ENV: &str = "MMAPLOCK_PROF_NO_PROCMAP_QUERY";

fn sum(v: &Value, side: &str, field: &str) -> u64 {
    v[side][field]["sum"].as_u64().unwrap_or(0)
}

fn count(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// A run of `waves.js` profiled with stacks sampled as by default (one write in 64 per
/// thread: their unwinding and naming are what read the process), the profiler's
/// environment given `env`: the node process's entry and the run's duration, ms (printed:
/// what it read, and the 1% figure).
fn profile_waves(dir: &Path, env: &[(&str, &str)]) -> (Value, u64) {
    // 250 Workers, 4 at a time (a test runner's pool on a small host), each reading a
    // 64 KiB file 200 times.
    let (workers, wave, iterations) = (250u32, 4u32, 200u32);
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(fixture("waves.js"))
        .args([workers, wave, iterations].map(|n| n.to_string()))
        .arg(&file);
    let mut w = Workload::spawn(cmd);
    let pid = w.pid.to_string();
    let mut prof = Command::new(integration_tests::profiler_bin());
    prof.args(["--format", "json", "-p", &pid, "-i", "0"])
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null());
    let out = profile_until_done(&mut w, Profiler::start_command(prof));
    let s = out.summary();
    let p = process(s, w.pid).expect("node in the summary").clone();
    let duration_ms = (s["duration_s"].as_f64().expect("duration_s") * 1e3) as u64;

    let wait = sum(&p, "write", "wait_ns") + sum(&p, "read", "wait_ns");
    // Absent when the profiler took the lock not once.
    let ours = &p["profiler"];
    let (acquired, holds) = (
        ours["read"]["count"].as_u64().unwrap_or(0),
        sum(ours, "read", "hold_ns") + sum(ours, "write", "hold_ns"),
    );
    eprintln!(
        "{workers} Workers, {:.1} s{}: the process waited {:.1} ms on its lock; the profiler \
         took it {acquired} times for read, holding it {:.2} ms ({:.2}% of that wait); it \
         read {}; stack work {}",
        duration_ms as f64 / 1e3,
        if env.is_empty() { "" } else { " (no query)" },
        wait as f64 / 1e6,
        holds as f64 / 1e6,
        100.0 * holds as f64 / wait.max(1) as f64,
        p["read_by_profiler"],
        s["stack_work"],
    );
    assert!(wait > 0, "the Workers waited on the lock: {p}");
    (p, duration_ms)
}

/// The most whole reads of the map in `duration_ms`: once per reader at first, then as the
/// bucket of each of `rereaders` allows.
fn most_whole_reads(rereaders: u64, duration_ms: u64) -> u64 {
    READERS + rereaders * (REREAD_BURST + duration_ms / REREAD_EVERY_MS)
}

#[test]
fn the_map_is_read_whole_once_per_reader_then_looked_up_as_the_buckets_allow() {
    let Some(dir) = bpf_test() else { return };
    let query = kernel_features().procmap_query();
    let (p, duration_ms) = profile_waves(dir.path(), &[]);
    let read = &p["read_by_profiler"];
    let (maps, queries) = (count(read, "maps"), count(read, "map_queries"));
    if query {
        // Unwinding never reads the whole map again where it can ask; thread roles do,
        // after a query finds file-backed code (a library loaded since), as their bucket
        // allows.
        let most = most_whole_reads(1, duration_ms);
        assert!(
            (1..=most).contains(&maps),
            "the map read whole {maps} times in {duration_ms} ms, at most {most}: {read}"
        );
        // Each Worker's isolate maps code the map read at first does not have: a sampled
        // stack through it asks for its mapping.
        let most = READERS * (QUERY_BURST + duration_ms / QUERY_EVERY_MS);
        assert!(
            (1..=most).contains(&queries),
            "{queries} mappings asked for in {duration_ms} ms, at least one, at most \
             {most}: {read}"
        );
    } else {
        let most = most_whole_reads(READERS, duration_ms);
        assert!(maps <= most, "{maps} whole reads, at most {most}: {read}");
        assert_eq!(queries, 0, "no query on this kernel: {read}");
    }
    // V8's heap was read to name JavaScript frames. Each range read takes the lock for read
    // (the kernel pins its pages under it), as the kernel counted the profiler's
    // acquisitions: at least as many, more where reading the map or asking it takes the lock
    // too (before 6.17).
    let ranges = count(read, "memory_ranges");
    assert!(count(read, "memory") > 0, "{read}");
    assert!(ranges >= count(read, "memory"), "{read}");
    let acquired = p["profiler"]["read"]["count"].as_u64().unwrap_or(0);
    assert!(
        acquired >= ranges,
        "the profiler took the lock {acquired} times, for {ranges} ranges read: {read}"
    );

    // Still named: the sampled writes are charged to known code, their stacks end at a known
    // mapping, and JavaScript functions are named (node's own modules', or the fixture's).
    let dsos = p["dsos"].as_array().expect("dsos");
    let sampled: u64 = dsos
        .iter()
        .map(|d| d["write"]["count"].as_u64().unwrap())
        .sum();
    let unknown: u64 = dsos
        .iter()
        .filter(|d| d["dso"] == "[unknown]")
        .map(|d| d["write"]["count"].as_u64().unwrap())
        .sum();
    assert!(sampled > 0, "stacks were sampled: {dsos:?}");
    assert!(
        unknown * 20 <= sampled,
        "{unknown} of {sampled} samples [unknown]"
    );
    let ends = p["stack_ends"].as_object().expect("stack_ends");
    let unmapped = ends
        .get("unknown_mapping")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    assert!(
        unmapped * 20 <= sampled,
        "{unmapped} of {sampled} stacks end outside the mappings known: {ends:?}"
    );
    let js = p["js_functions"].as_array().expect("js_functions");
    assert!(
        js.iter().any(|f| {
            let file = f["file"].as_str().unwrap_or("");
            file.starts_with("node:") || file.contains("waves.js")
        }),
        "no JavaScript function named: {js:?}"
    );
}

/// As on a kernel without `PROCMAP_QUERY` (before 6.11; turned off here): never a query,
/// and the whole map read again by both readers, each as its bucket allows.
#[test]
fn without_the_query_the_map_is_read_again_as_the_bucket_allows() {
    let Some(dir) = bpf_test() else { return };
    let (p, duration_ms) = profile_waves(dir.path(), &[(NO_QUERY_ENV, "1")]);
    let read = &p["read_by_profiler"];
    let (maps, queries) = (count(read, "maps"), count(read, "map_queries"));
    assert_eq!(queries, 0, "{read}");
    let most = most_whole_reads(READERS, duration_ms);
    assert!(
        (1..=most).contains(&maps),
        "the map read whole {maps} times in {duration_ms} ms, at most {most}: {read}"
    );
    assert!(p["dsos"].as_array().is_some_and(|d| !d.is_empty()), "{p}");
}
