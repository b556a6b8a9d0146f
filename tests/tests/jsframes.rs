//! ROOT-ONLY: JavaScript frames in sampled write stacks. A Worker's function `hotAllocator`
//! allocates 256 KiB Buffers (V8 takes the lock for write through node's allocator and the
//! `Builtins_...` trampolines, which have no unwind entries): the sampled writes are charged to
//! `hotAllocator` by name, with node's perf map on, and without it, from V8's heap.

use std::process::Command;

use integration_tests::{
    Profiler, Workload, assert_mmaps_named, cause_stats, fixture, process,
    require_root_and_tracepoints, thread, thread_writes,
};
use serde_json::Value;

/// Runs the fixture under `node NODE_FLAGS`, profiled with one write's stack in `sample`
/// (`--stacks`); returns the summary's entry for node, the Worker's tid and the folded stacks.
fn profile(node_flags: &[&str], sample: u32, rounds: u32) -> (Value, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("node");
    // V8 writes its isolate logs beside the perf map, in the working directory.
    cmd.current_dir(dir.path());
    // A fixed mmap threshold: glibc's would rise after the first free, and the Buffers would
    // then come from the heap. So each Buffer is one mmap, by the Worker: 50 x 64 of them.
    cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
        .env("JSFRAMES_LINGER_MS", linger_ms())
        .args(node_flags)
        .arg(fixture("jsframes.js"))
        .arg(rounds.to_string());
    let mut w = Workload::spawn(cmd);
    let ids: Value = serde_json::from_str(&w.preamble[0]).expect("the worker's tid");
    let worker = ids["worker"].as_u64().unwrap();
    let folded = dir.path().join("stacks.folded");
    let prof = Profiler::start_with_stacks(w.pid, sample, &folded);
    w.go();
    assert!(w.wait().success());
    let out = prof.finish();
    let p = process(out.summary(), w.pid)
        .expect("node is in the summary")
        .clone();
    let folded = std::fs::read_to_string(&folded).expect("the folded stacks");
    (p, worker, folded)
}

/// Sampled writes (folded lines' counts) whose stack has a frame containing `needle`.
fn samples_with(folded: &str, needle: &str) -> u64 {
    folded
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_workers_js_function_is_named_in_most_of_its_sampled_writes() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (p, worker, folded) = profile(&["--perf-basic-prof"], 4, 50);
    // Ground truth: the Worker's 50 x 64 Buffers, one mmap each (its other writes are a
    // scavenge's pages and, as it ends, its heap's teardown).
    let mmaps = cause_stats(thread(&p, worker), "mmap").map_or(0, |c| c["count"].as_u64().unwrap());
    assert!(
        (50 * 64..=50 * 64 + 200).contains(&mmaps),
        "the Worker's mmaps: {mmaps} for 3200 Buffers"
    );
    let what = format!(
        "worker {worker}: {mmaps} mmaps ({} writes)",
        thread_writes(&p, worker)
    );
    assert_mmaps_named(&folded, "hotAllocator_(", 20, &what);
    let js = p["js_functions"].as_array().expect("js_functions");
    let top = &js[0];
    assert_eq!(top["function"], "hotAllocator", "{js:?}");
    assert!(
        top["file"].as_str().unwrap().contains("jsframes.js:"),
        "{top}"
    );
    assert!(
        p.get("js_hint").is_none(),
        "a perf map was there: {}",
        p["js_hint"]
    );
}

#[test]
fn without_a_perf_map_the_function_is_named_from_v8s_heap() {
    if !require_root_and_tracepoints() {
        return;
    }
    // The default rate (one write in 64) on 200 x 64 Buffers: the heap is read soon after
    // each sample (a backlog of samples, at a high rate, lets the scavenger move the Worker's
    // young functions first, which are then `[js unknown]`).
    let (p, worker, folded) = profile(&[], 64, 200);
    assert_mmaps_named(&folded, "hotAllocator_(", 20, &format!("worker {worker}"));
    assert_eq!(p["js_functions"][0]["function"], "hotAllocator");
    assert_eq!(p["js_frames"]["perf_map"], 0, "{}", p["js_frames"]);
    // Something named the frames: no hint to restart node.
    assert!(p.get("js_hint").is_none(), "{}", p["js_hint"]);
    assert_eq!(
        samples_with(&folded, "[jit]"),
        0,
        "unnamed JIT frames:\n{folded}"
    );
}

/// How long the fixture's Worker outlives its samples, for the profiler to name them: half a
/// second on the reference machine.
fn linger_ms() -> String {
    integration_tests::scaled(std::time::Duration::from_millis(500))
        .as_millis()
        .to_string()
}
