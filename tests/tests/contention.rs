//! ROOT-ONLY: contention mode (`--mode contention`) against an independent count of the
//! same events: bpftrace on `lock:contention_begin/end`, on each process's own mmap_lock
//! (`integration_tests::bpftrace`), run beside the profiler. Per process and per thread, the
//! contended waits are the same (within 1%), on a write-heavy helper, Node.js Workers, a
//! process forking under contention, and 300 short processes under the agent, whose default
//! this mode is; and another process waiting on a profiled lock is counted as `foreign`.

use std::{collections::BTreeMap, process::Command, time::Duration};

use integration_tests::{
    Profiler, Workload, bpf_test,
    bpftrace::{
        ContentionCount, Wait, assert_contention_summary, assert_same_waits, contention_ready,
        counted_of, reported_waits, require_contention_tracepoints, within,
    },
    churn_bin, process, profile_workload, roles_workload_sized,
    scrape::Agent,
    thread, wait_until,
};
use serde_json::Value;

#[test]
fn contended_waits_match_bpftrace_per_thread_on_the_write_heavy_helper() {
    if !contention_ready() {
        return;
    }
    // (Emulated, in the kernel matrix's guests: a tenth of the work, the same assertions.)
    let n = if integration_tests::in_matrix_guest() {
        4_000
    } else {
        40_000
    };
    let mut w = Workload::churn(4, n, None);
    let Some(count) = ContentionCount::start(&format!("pid == {}", w.pid)) else {
        return;
    };
    let out = profile_workload(&mut w, &["--mode", "contention", "-i", "0"]);
    let mut tally = count.stop();
    let counted = tally.waits;
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("the helper in the summary");
    let total = assert_same_waits(
        &reported_waits(p),
        &counted_of(&counted, w.pid),
        &mut tally.missed,
    );
    // Four threads churning on two cores contend: thousands of times, not a handful.
    let least = if integration_tests::in_matrix_guest() {
        5
    } else {
        50
    };
    assert!(
        total >= least,
        "{total} contended waits: the helper did not contend"
    );
    // The process's figures are its threads'.
    let writes: u64 = counted_of(&counted, w.pid)
        .iter()
        .filter(|((_, op), _)| *op == 4)
        .map(|(_, w)| w.count)
        .sum();
    assert!(
        within(p["write"]["count"].as_u64().unwrap(), writes, 1.0),
        "{}",
        p["write"]
    );
    // Its writes are mmaps and munmaps, by cause.
    let causes: Vec<&str> = p["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cause"].as_str().unwrap())
        .collect();
    assert!(
        causes.contains(&"mmap") && causes.contains(&"munmap"),
        "{causes:?}"
    );
}

#[test]
fn contended_waits_match_bpftrace_per_thread_on_node_workers() {
    let Some(dir) = bpf_test() else { return };
    if !require_contention_tracepoints() {
        return;
    }
    // 8 Workers reading a file of 1 MiB: each read is a fresh Buffer above glibc's mmap
    // threshold (an mmap, a munmap) and page faults copying into it.
    let (mut w, workers) = roles_workload_sized(dir.path(), 8, 400, 1 << 20);
    let Some(count) = ContentionCount::start(&format!("pid == {}", w.pid)) else {
        return;
    };
    let out = profile_workload(&mut w, &["--mode", "contention", "-i", "0"]);
    let mut tally = count.stop();
    let counted = tally.waits;
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("node in the summary");
    let total = assert_same_waits(
        &reported_waits(p),
        &counted_of(&counted, w.pid),
        &mut tally.missed,
    );
    assert!(
        total >= 20,
        "{total} contended waits: the Workers did not contend"
    );
    // The Workers' waits are the Workers' (their role told with no node flag).
    let by_workers: u64 = workers
        .iter()
        .filter_map(|&t| {
            p["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["tid"] == t)
        })
        .map(|t| {
            assert_eq!(t["role"], "worker", "{t}");
            t["write"]["count"].as_u64().unwrap() + t["read"]["count"].as_u64().unwrap()
        })
        .sum();
    assert!(
        by_workers * 2 > total,
        "{by_workers} of {total} waits by the Workers"
    );
}

#[test]
fn contended_waits_match_bpftrace_in_a_process_that_forks() {
    if !contention_ready() {
        return;
    }
    // The main thread forks 300 times (dup_mmap takes its lock for write) while 3 threads
    // churn: the forks wait behind the churners' writes, and the churners behind the forks.
    let mut w = Workload::helper("fork-churn", [300, 3, 20_000]);
    let Some(count) = ContentionCount::start(&format!("pid == {}", w.pid)) else {
        return;
    };
    let out = profile_workload(&mut w, &["--mode", "contention", "-i", "0"]);
    let mut tally = count.stop();
    let counted = tally.waits;
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("the helper in the summary");
    let total = assert_same_waits(
        &reported_waits(p),
        &counted_of(&counted, w.pid),
        &mut tally.missed,
    );
    // Enough waits for their sums to be compared (`assert_same_waits`); how many more come
    // is the host's scheduling (70 on a loaded host, hundreds on an idle one).
    assert!(total >= 20, "{total} contended waits");
    // The main thread's contended writes are its forks'; the children's own locks are theirs.
    let main = thread(p, u64::from(w.pid));
    let forks: u64 = main["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cause"] == "fork")
        .map(|c| c["write"]["count"].as_u64().unwrap())
        .sum();
    assert!(forks > 0, "no contended fork: {main}");
    assert!(
        s["processes"].as_array().unwrap().len() == 1,
        "the children are not profiled: {}",
        s["processes"]
    );
}

/// The agent, in contention mode by default, over 300 processes that each live a few tens of
/// milliseconds: every one's contended waits, from its NDJSON interval lines, are bpftrace's.
#[test]
fn the_agent_counts_every_short_process_contended_waits() {
    let Some(dir) = bpf_test() else { return };
    if !require_contention_tracepoints() {
        return;
    }
    let name = "cont-churn";
    let Some(count) = ContentionCount::start(&format!("comm == \"{name}\"")) else {
        return;
    };
    let ndjson = dir.path().join("agent.jsonl");
    let agent = Agent::start_in_its_default_mode(&[
        "--comm",
        name,
        "-i",
        "0.2",
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    let metrics = agent.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("mmaplock_build_info{") && l.contains(r#"mode="contention""#)),
        "the agent's default mode is contention here:\n{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l == "mmaplock_mode_fallback 0"),
        "{metrics}"
    );
    let mut pids = Vec::new();
    for _ in 0..75 {
        // Four at a time, each 4 threads x 300 (mmap; touch; munmap), started at once.
        let mut batch: Vec<Workload> = (0..4)
            .map(|_| {
                let mut cmd = Command::new(churn_bin());
                cmd.args(["4", "300", "65536", name]);
                Workload::spawn(cmd)
            })
            .collect();
        for w in &mut batch {
            pids.push(w.pid);
            w.go();
        }
        for w in &mut batch {
            assert!(w.wait().success());
        }
    }
    // Every process gone and read one last time (nothing tracked any more), then the agent
    // stopped: its last interval line is written.
    wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
        let m = agent.metrics();
        match integration_tests::metric_gauge(&m, "mmaplock_tracked_processes") {
            0 => Ok(()),
            n => Err(format!("{n} processes still tracked")),
        }
    });
    agent.stop();
    let mut tally = count.stop();
    let counted = std::mem::take(&mut tally.waits);
    let mut by_pid: BTreeMap<u32, BTreeMap<(u32, u32), Wait>> = BTreeMap::new();
    for line in integration_tests::read_lines(&ndjson) {
        assert_eq!(line["mode"], "contention", "{line}");
        for p in line["processes"].as_array().unwrap() {
            let e = by_pid.entry(p["pid"].as_u64().unwrap() as u32).or_default();
            for (k, w) in reported_waits(p) {
                let x = e.entry(k).or_default();
                x.count += w.count;
                x.wait_ns += w.wait_ns;
            }
        }
        assert_eq!(line["lost"]["events"], 0, "{line}");
    }
    let mut total = 0;
    for &pid in &pids {
        let empty = BTreeMap::new();
        let got = by_pid.get(&pid).unwrap_or(&empty);
        total += assert_same_waits(got, &counted_of(&counted, pid), &mut tally.missed);
    }
    assert!(
        total >= 300,
        "{total} contended waits over {} processes",
        pids.len()
    );
    assert!(
        by_pid.keys().all(|p| pids.contains(p)),
        "only the selected processes: {:?}",
        by_pid.keys()
    );
}

/// Another process's waits on a profiled lock (a monitoring agent reading /proc/PID/maps
/// while the process's writers hold it for milliseconds) are counted as the process's, with
/// role `foreign` and the reader's pid: contention mode knows a profiled lock by its address
/// when a task other than its own waits for it.
#[test]
fn a_foreign_reader_waiting_on_a_profiled_lock_is_counted() {
    if !contention_ready() {
        return;
    }
    let mut w = Workload::helper("long-holder", [40, 3]);
    let pid = w.pid;
    let prof = Profiler::start(&["-p", &pid.to_string(), "-i", "0", "--mode", "contention"]);
    w.go();
    // This test's own thread reads the helper's maps in a loop while it runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if std::fs::read(format!("/proc/{pid}/maps")).is_err() {
                    break;
                }
                reads += 1;
            }
            reads
        })
    };
    assert!(w.wait().success());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    let out = prof.finish_ok();
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, pid).expect("the helper in the summary");
    let ours = std::process::id() as u64;
    let foreign: Vec<&Value> = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "foreign")
        .collect();
    assert!(
        foreign
            .iter()
            .any(|t| t["pid"] == ours && t["read"]["count"].as_u64().unwrap() > 0),
        "{reads} reads of /proc/{pid}/maps by pid {ours}: {:?}",
        p["threads"]
    );
}
