//! ROOT-ONLY: the time share is over the whole process. A process whose threads mostly never
//! take its lock (`time-share bystanders`: a holder and a waiter behind it, and spinning
//! threads named `libuv-worker` that touch no lock, not even at their end) still spends
//! their time: the report counts every thread alive and all their CPU, in both modes, with the
//! role their names tell, and lists none of them among the threads that took the lock.

use integration_tests::{
    Profiler, Workload, bpftrace::contention_ready, process, require_root_and_tracepoints,
};
use serde_json::Value;

/// Spinning threads, and how long the workload and the profile last (s).
const SPINNERS: usize = 4;
const WORKLOAD_S: &str = "8";
const PROFILE_S: &str = "3";

/// A thread's CPU time so far (ns), as the scheduler keeps it.
fn cpu_ns(pid: u32, tid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .unwrap_or_else(|e| panic!("thread {tid}: {e}"));
    s.split_whitespace().next().unwrap().parse().unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn whole_process_in(mode: &str) {
    let mut w = Workload::helper(
        "time-share",
        ["bystanders", WORKLOAD_S, &SPINNERS.to_string()],
    );
    w.go();
    let line: Value = serde_json::from_str(&w.read_line()).unwrap();
    let spinners: Vec<u32> = line["spinners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(t) as u32)
        .collect();
    assert_eq!(spinners.len(), SPINNERS);
    let pid = w.pid.to_string();
    let prof = Profiler::start(&["--pid", &pid, "-d", PROFILE_S, "-i", "0.25", "--mode", mode]);
    // Attached: their CPU from now to the profile's end bounds what it can count of them.
    let before: u64 = spinners.iter().map(|&t| cpu_ns(w.pid, t)).sum();
    let out = prof.finish_ok();
    let after: u64 = spinners.iter().map(|&t| cpu_ns(w.pid, t)).sum();
    integration_tests::keep_output(&out, "bystanders", &format!("mode {mode}\n"));
    let summary = out.summary();
    let p = process(summary, w.pid).expect("the workload is in the summary");
    // None of the spinners took the lock: no thread row of theirs.
    let listed: Vec<u64> = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(&t["tid"]))
        .collect();
    assert!(
        spinners.iter().all(|s| !listed.contains(&u64::from(*s))),
        "{mode}: a spinner took the lock: {listed:?}"
    );
    // Every thread counted: the spinners, the holder, the waiter and the idle main thread.
    let share = &p["time_share"];
    assert_eq!(u(&share["threads"]), SPINNERS as u64 + 3, "{mode}: {share}");
    let libuv = p["time_share_by_role"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "libuv")
        .unwrap_or_else(|| panic!("{mode}: no libuv role: {}", p["time_share_by_role"]));
    assert_eq!(u(&libuv["threads"]), SPINNERS as u64, "{mode}: {libuv}");
    // Their lives: the whole run each (within 5%: the run's first and last readings).
    let duration_ns = summary["duration_s"].as_f64().unwrap() * 1e9;
    let alive = u(&libuv["alive_ns"]) as f64;
    let lives = SPINNERS as f64 * duration_ns;
    assert!(
        (0.95 * lives..=1.02 * lives).contains(&alive),
        "{mode}: alive {alive} against {lives}"
    );
    // Their CPU: what they ran while the profile lasted, but for what they ran before its
    // first reading reported them (a quarter of a second at most, of three), and what ran
    // between its attaching and its saying so.
    let ran = (after - before) as f64;
    let cpu = u(&libuv["cpu_ns"]) as f64;
    assert!(
        (0.8 * ran..=1.1 * ran).contains(&cpu),
        "{mode}: {cpu} ns of CPU counted, {ran} ns ran while the profile lasted"
    );
    // The process's CPU has theirs in it.
    assert!(u(&share["cpu_ns"]) as f64 >= cpu, "{mode}: {share}");
    eprintln!(
        "{mode}: {} threads, {:.2} s of CPU ({:.2} s by the spinners, which ran {:.2} s); \
         {:.3}% of their time waiting",
        share["threads"],
        u(&share["cpu_ns"]) as f64 / 1e9,
        cpu / 1e9,
        ran / 1e9,
        share["wall"].as_f64().unwrap() * 100.0
    );
    assert!(w.wait().success());
}

#[test]
fn the_time_share_counts_every_thread_in_full_mode() {
    if require_root_and_tracepoints() {
        whole_process_in("full");
    }
}

#[test]
fn the_time_share_counts_every_thread_in_contention_mode() {
    if contention_ready() {
        whole_process_in("contention");
    }
}
