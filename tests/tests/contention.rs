//! ROOT-ONLY: contention mode (`--mode contention`) against an independent count of the
//! same events: bpftrace on `lock:contention_begin/end`, on each process's own mmap_lock
//! (`integration_tests::bpftrace`), run beside the profiler. Per process and per thread, the
//! contended waits are the same (within 1%), on a write-heavy helper, Node.js Workers, a
//! process forking under contention, and 300 short processes under the agent, whose default
//! this mode is. Side by side with full mode, it captures nearly all of the wait that matters
//! (acquisitions that waited over 2 us), and it names the writer a wait waited behind.

use std::{collections::BTreeMap, process::Command, time::Duration};

use integration_tests::{
    Profiler, Workload, bpf_test,
    bpftrace::{ContentionCount, Counted, Wait, require_contention_tracepoints},
    check_lost, churn_bin, finding, process, profile_workload, require_root_and_tracepoints,
    roles_workload_sized,
    scrape::Agent,
    thread, wait_until,
};
use serde_json::Value;

/// Both counts' ops: the tracepoint's flags and the report's side.
const OPS: [(u32, &str); 2] = [(2, "read"), (4, "write")];

/// `a` is `b` within 1% (the same count, unless a wait began as the programs attached).
fn within(a: u64, b: u64, pct: f64) -> bool {
    (a as f64 - b as f64).abs() <= b as f64 * pct / 100.0
}

/// The process's own threads' contended waits in a contention-mode report (the profiler's
/// reads and foreign takers apart, as bpftrace's count of its own threads has them), by
/// (tid, op).
fn reported(p: &Value) -> BTreeMap<(u32, u32), Wait> {
    let mut m = BTreeMap::new();
    for t in p["threads"].as_array().unwrap() {
        if t["role"] == "foreign" || t["role"] == "profiler" {
            continue;
        }
        for (op, side) in OPS {
            let count = t[side]["count"].as_u64().unwrap();
            if count > 0 {
                let w = Wait {
                    count,
                    wait_ns: t[side]["wait_ns"]["sum"].as_u64().unwrap(),
                };
                m.insert((t["tid"].as_u64().unwrap() as u32, op), w);
            }
        }
    }
    m
}

/// bpftrace's count of process `pid`, by (tid, op).
fn counted_of(counted: &Counted, pid: u32) -> BTreeMap<(u32, u32), Wait> {
    counted
        .iter()
        .filter(|((p, ..), _)| *p == pid)
        .map(|(&(_, tid, op), &w)| ((tid, op), w))
        .collect()
}

/// Every thread's contended waits, per op, as bpftrace counted them: the same count within
/// 1%, and no thread in one count missing from the other; the process's wait in all within
/// 2% and 50 us a wait (each times the same waits from its own program, and the other's may
/// run between its two clock reads: a thread's first wait inserts its map entries). Returns
/// the total count.
fn assert_same_waits(report: &BTreeMap<(u32, u32), Wait>, bpf: &BTreeMap<(u32, u32), Wait>) -> u64 {
    let keys: std::collections::BTreeSet<_> = report.keys().chain(bpf.keys()).collect();
    let (mut total, mut waited, mut timed) = (0, 0, 0);
    for k in keys {
        let (r, b) = (
            report.get(k).copied().unwrap_or_default(),
            bpf.get(k).copied().unwrap_or_default(),
        );
        assert!(
            within(r.count, b.count, 1.0),
            "thread {} op {}: {} contended waits reported, {} counted by bpftrace",
            k.0,
            k.1,
            r.count,
            b.count
        );
        total += b.count;
        waited += b.wait_ns;
        timed += r.wait_ns;
    }
    assert!(
        timed.abs_diff(waited) as f64 <= waited as f64 * 0.02 + 50_000.0 * total as f64,
        "{timed} ns of wait reported, {waited} ns timed by bpftrace, in {total} waits"
    );
    total
}

/// A contention-mode summary is said to be one, has no hold, and lost nothing.
fn assert_contention_summary(s: &Value) {
    assert_eq!(s["mode"], "contention", "{s}");
    assert!(!s.to_string().contains("hold_ns"), "no hold is measured");
    assert_eq!(check_lost(s), 0, "{}", s["lost"]);
}

fn contention_ready() -> bool {
    require_root_and_tracepoints() && require_contention_tracepoints()
}

#[test]
fn contended_waits_match_bpftrace_per_thread_on_the_write_heavy_helper() {
    if !contention_ready() {
        return;
    }
    let mut w = Workload::churn(4, 40_000, None);
    let Some(count) = ContentionCount::start(&format!("pid == {}", w.pid)) else {
        return;
    };
    let out = profile_workload(&mut w, &["--mode", "contention", "-i", "0"]);
    let counted = count.stop();
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("the helper in the summary");
    let total = assert_same_waits(&reported(p), &counted_of(&counted, w.pid));
    // Four threads churning on two cores contend: thousands of times, not a handful.
    assert!(
        total >= 500,
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
    let counted = count.stop();
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("node in the summary");
    let total = assert_same_waits(&reported(p), &counted_of(&counted, w.pid));
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
    let counted = count.stop();
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("the helper in the summary");
    let total = assert_same_waits(&reported(p), &counted_of(&counted, w.pid));
    assert!(total >= 100, "{total} contended waits");
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
    std::thread::sleep(Duration::from_millis(500));
    agent.stop();
    let counted = count.stop();
    let mut by_pid: BTreeMap<u32, BTreeMap<(u32, u32), Wait>> = BTreeMap::new();
    for line in integration_tests::read_lines(&ndjson) {
        assert_eq!(line["mode"], "contention", "{line}");
        for p in line["processes"].as_array().unwrap() {
            let e = by_pid.entry(p["pid"].as_u64().unwrap() as u32).or_default();
            for (k, w) in reported(p) {
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
        total += assert_same_waits(got, &counted_of(&counted, pid));
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

/// Both modes on one process at once: contention mode's waits are at least 85% of the wait
/// full mode measures in acquisitions that waited over 2 us (the rest: spinning before a
/// writer sleeps, a reader stealing the lock), on the write-heavy helper and 8 Node Workers.
#[test]
fn contention_mode_captures_the_wait_that_matters_side_by_side_with_full_mode() {
    let Some(dir) = bpf_test() else { return };
    if !require_contention_tracepoints() {
        return;
    }
    for (what, mut w) in [
        ("helper", Workload::churn(4, 40_000, None)),
        (
            "node",
            roles_workload_sized(dir.path(), 8, 2000, 64 * 1024).0,
        ),
    ] {
        let pid = w.pid.to_string();
        let full = Profiler::start(&["-p", &pid, "-i", "0", "--mode", "full"]);
        let cont = Profiler::start(&["-p", &pid, "-i", "0", "--mode", "contention"]);
        w.go();
        assert!(w.wait().success());
        let full = full.finish_ok(Duration::from_secs(60));
        let cont = cont.finish_ok(Duration::from_secs(60));
        let (pf, pc) = (
            process(full.summary(), w.pid).unwrap(),
            process(cont.summary(), w.pid).unwrap(),
        );
        let (mut over_2us, mut captured) = (0u64, 0u64);
        for t in pf["threads"].as_array().unwrap() {
            if t["role"] == "foreign" || t["role"] == "profiler" {
                continue;
            }
            for side in ["write", "read"] {
                over_2us += wait_over_2us(&t[side]["wait_ns"]);
            }
        }
        for ((_, _), wait) in reported(pc) {
            captured += wait.wait_ns;
        }
        eprintln!(
            "{what}: contention mode {captured} ns of the {over_2us} ns full mode measured in \
             waits over 2 us ({:.1}%)",
            100.0 * captured as f64 / over_2us as f64
        );
        assert!(
            over_2us > 1_000_000,
            "{what}: no wait to speak of ({over_2us} ns)"
        );
        assert!(
            captured as f64 >= 0.85 * over_2us as f64,
            "{what}: {captured} of {over_2us} ns"
        );
    }
}

/// The most of the wait in a distribution's waits over 2 us: its sum less the least its
/// buckets under 2.048 us can hold (each of their waits at its bucket's lower bound).
fn wait_over_2us(d: &Value) -> u64 {
    let under: u64 = d["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b[0].as_u64().unwrap(), b[1].as_u64().unwrap()))
        .filter(|&(upper, _)| upper <= 2048)
        .map(|(upper, n)| upper / 2 * n)
        .sum();
    d["sum"].as_u64().unwrap().saturating_sub(under)
}

/// Who made whom wait, with no `--blockers` and no hold timed: the rwsem's owner names the
/// writer each wait began behind. On the blockers' ground truth, one thread's long mprotects
/// are charged the most, with their cause, and the finding names that thread.
#[test]
fn the_writer_a_wait_began_behind_is_its_blocker() {
    if !contention_ready() {
        return;
    }
    let mut w = Workload::helper("long-holder", [40, 3]);
    let out = profile_workload(&mut w, &["--mode", "contention", "-i", "0"]);
    let did = w.report();
    let holder = did["holder_tid"].as_u64().unwrap();
    let s = out.summary();
    assert_contention_summary(s);
    let p = process(s, w.pid).expect("the helper in the summary");
    let blockers = p["blockers"]
        .as_array()
        .expect("blockers, always in contention mode");
    let top = &blockers[0];
    eprintln!(
        "blockers: {}",
        serde_json::to_string_pretty(&blockers[..3.min(blockers.len())]).unwrap()
    );
    assert_eq!(top["tid"], holder, "{top}");
    assert_eq!(top["cause"], "mprotect", "{top}");
    assert_eq!(top["comm"], "long-holder", "{top}");
    assert_eq!(top["pid"], w.pid, "{top}");
    // What is charged is what was waited, no more.
    let waited: u64 = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["write"]["wait_ns"]["sum"].as_u64().unwrap()
                + t["read"]["wait_ns"]["sum"].as_u64().unwrap()
        })
        .sum();
    let charged = p["blocked_wait_ns"].as_u64().unwrap();
    assert!(charged <= waited, "{charged} > {waited}");
    assert!(
        top["wait_ns"].as_u64().unwrap() * 2 > charged,
        "{top}: of {charged}"
    );
    let long = finding(s, "long-holds", w.pid);
    assert_eq!(long["evidence"]["threads"][0]["tid"], holder, "{long}");
    assert_eq!(
        long["evidence"]["threads"][0]["cause"], "mprotect",
        "{long}"
    );
}

/// `--mode contention` where the kernel lacks what it needs, or a bad mode: one line, exit 2
/// for a mode that does not exist.
#[test]
fn a_mode_that_does_not_exist_is_a_usage_error() {
    let out = integration_tests::run_profiler(&["--mode", "sometimes", "-d", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("sometimes") && err.contains("contention"),
        "{err}"
    );
}

/// The agent in contention mode, scraped by a real Prometheus with the shipped rules: every
/// dashboard panel that contention mode can fill has data, the hold panels (marked "Full
/// mode only") have none, every recording rule has data, and each series says its mode.
#[test]
fn every_dashboard_panel_and_rule_has_data_in_contention_mode() {
    if !contention_ready() {
        return;
    }
    let Some(prom_bin) = integration_tests::installed_or_skip(
        integration_tests::scrape::prometheus_bin(),
        "prometheus",
    ) else {
        return;
    };
    let mut w = Workload::churn(4, 40_000, None);
    let pid = w.pid.to_string();
    let agent = Agent::start(&[
        "--mode",
        "contention",
        "--pid",
        &pid,
        "-i",
        "0.5",
        "--bpf-stats",
    ]);
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/mmaplock-rules.yml")
        .canonicalize()
        .unwrap();
    let prom = integration_tests::scrape::Prometheus::start_scraping(
        &prom_bin,
        &format!(
            "  - job_name: mmaplock\n    static_configs:\n      - targets: ['127.0.0.1:{}']\nrule_files:\n  - {}\n",
            agent.port,
            rules.display()
        ),
        &[],
    );
    w.go();
    assert!(w.wait().success());
    prom.wait_for(
        "sum(mmaplock_acquisitions_total{op=\"write\",mode=\"contention\"})",
        Duration::from_secs(30),
        |v| v > 0.0,
        "contended writes",
    );
    // Every rate() its two samples after the work, every rule a few evaluations.
    std::thread::sleep(Duration::from_secs(4));
    let panels = integration_tests::scrape::dashboard_panels();
    assert!(
        panels.iter().any(|q| q.full_mode_only),
        "hold panels are marked"
    );
    for q in &panels {
        let r = prom.query(&q.expr);
        if q.full_mode_only {
            assert!(r.is_empty(), "a full-mode-only panel has data: {}", q.expr);
        } else if !q.optional {
            assert!(!r.is_empty(), "no data in contention mode: {}", q.expr);
        }
    }
    let text = std::fs::read_to_string(&rules).unwrap();
    let recorded: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .collect();
    assert!(recorded.len() >= 30, "{recorded:?}");
    for r in recorded {
        // The native-histogram forms are empty where Prometheus ingests classic buckets.
        if r.ends_with(":mmaplock_write_wait_seconds:rate5m") {
            continue;
        }
        let v = prom.query(r);
        assert!(!v.is_empty(), "no data for {r}");
        if r.starts_with("instance_cgroup_process") || r.starts_with("job:mmaplock_write") {
            assert!(
                v.iter().all(|s| s["metric"]["mode"] == "contention"),
                "{r} keeps its mode: {v:?}"
            );
        }
    }
    drop(agent);
}

/// The sampled stacks of contended writes, with their JavaScript names and no node flag:
/// every contended write sampled (`--stack-sample 1`), the samples are the contended writes,
/// one for one, and the Workers' own function is named, with its script.
#[test]
fn contended_writes_are_sampled_and_named_by_their_javascript_function() {
    if !contention_ready() {
        return;
    }
    let mut cmd = Command::new("node");
    // A fixed mmap threshold: glibc's own rises past 1 MiB after the first free, and the
    // Buffers would then come from the arenas, with few writes.
    cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
        .arg(integration_tests::fixture("contended.js"))
        .args(["4", "2000"]);
    let mut w = Workload::spawn(cmd);
    let out = profile_workload(
        &mut w,
        &["--mode", "contention", "-i", "0", "--stack-sample", "1"],
    );
    let s = out.summary();
    assert_contention_summary(s);
    assert_eq!(s["stack_sample"], 1, "{}", s["stack_sample"]);
    let p = process(s, w.pid).expect("node in the summary");
    let writes = p["write"]["count"].as_u64().unwrap();
    assert!(
        writes >= 10,
        "{writes} contended writes: the Workers did not contend"
    );
    // One sample per contended write (the profiler's own are never its process's).
    let sampled: u64 = p["dsos"]
        .as_array()
        .expect("dsos with stack sampling")
        .iter()
        .map(|d| d["write"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sampled, writes, "{}", p["dsos"]);
    let js = p["js_functions"].as_array().expect("js_functions");
    let f = js
        .iter()
        .find(|f| f["function"] == "allocateInWorker")
        .unwrap_or_else(|| {
            panic!(
                "allocateInWorker not named: {js:?}; js_frames {}, stack_ends {}, stacks {}",
                p["js_frames"], p["stack_ends"], p["stacks"]
            )
        });
    assert!(f["file"].as_str().unwrap().contains("contended.js"), "{f}");
    assert!(f["writes"].as_u64().unwrap() > 0, "{f}");
}

/// Full mode says, at attach, when the kernel formats the memory cgroup's path for every
/// mmap_lock event (the tracepoints carry `memcg_path` before Linux 6.14), with contention
/// mode as the cheap choice; never where it does not, nor in contention mode. The
/// expectation comes from the tracepoint's own format file, not from the version.
#[test]
fn full_mode_says_when_the_kernel_formats_memcg_paths() {
    if !require_root_and_tracepoints() {
        return;
    }
    let format = std::fs::read_to_string(
        "/sys/kernel/tracing/events/mmap_lock/mmap_lock_acquire_returned/format",
    )
    .expect("tracefs is mounted (cargo xtask test mounts it)");
    let formats_paths = format.contains("memcg_path");
    let said = |mode: &str| {
        let mut w = Workload::churn(1, 10, None);
        let out = profile_workload(&mut w, &["--mode", mode, "-i", "0"]);
        out.stderr.contains("--mode contention is the cheap choice")
    };
    assert_eq!(
        said("full"),
        formats_paths,
        "full mode, memcg_path: {formats_paths}"
    );
    if require_contention_tracepoints() {
        assert!(!said("contention"));
    }
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
    let out = prof.finish_ok(Duration::from_secs(60));
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
