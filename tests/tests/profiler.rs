//! ROOT-ONLY: end-to-end tests that load the real eBPF programs and check what they report
//! against workloads of known behaviour. Run with `sudo -E cargo xtask test` (CI runs as root).

use std::{process::Command, time::Duration};

use integration_tests::{
    Finished, Profiler, Workload, assert_churn_total, assert_main_and_workers, bpf_test,
    cause_counts, check_churn_writes, check_lost, check_stats, churn_slack, finding,
    helper_threads, nodes, process, profile_workload, require_root_and_tracepoints, run_profiler,
    stats, strings, thread, thread_writes,
};
use serde_json::Value;

/// Profiles one mmap-churn run of `threads` x `iterations` and returns the summary.
fn profile_churn(threads: u32, iterations: u32, extra: &[&str]) -> (u32, Finished) {
    let mut w = Workload::churn(threads, iterations, None);
    let mut args = vec!["--interval", "0"];
    args.extend_from_slice(extra);
    (w.pid, profile_workload(&mut w, &args))
}

#[test]
fn write_count_matches_ground_truth_exactly_up_to_exit() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (t, n) = (4u64, 2000u64);
    let (pid, out) = profile_churn(t as u32, n as u32, &[]);
    let s = out.summary();
    let p = process(s, pid).expect("the target is in the summary");
    let writes = check_churn_writes(p, pid, t, n, "mmap-churn");
    let threads = p["threads"].as_array().unwrap();
    // Process totals are the sum of its threads.
    let sum: u64 = threads
        .iter()
        .map(|th| th["write"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, writes);
    assert_eq!(s["lost"]["map_full"], 0);
}

#[test]
fn four_contending_threads_wait_far_longer_than_one() {
    if !require_root_and_tracepoints() {
        return;
    }
    // The same number of writes, from one thread or from four sharing the lock.
    let (pid1, out1) = profile_churn(1, 16_000, &[]);
    let (pid4, out4) = profile_churn(4, 4_000, &[]);
    let (w1, wait1) = stats(process(out1.summary(), pid1).unwrap(), "write");
    let (w4, wait4) = stats(process(out4.summary(), pid4).unwrap(), "write");
    eprintln!("T=1: {w1} writes, {wait1} ns waited; T=4: {w4} writes, {wait4} ns waited");
    assert!(w1 >= 32_000 && w4 >= 32_000);
    assert!(
        wait4 > 5 * wait1.max(1),
        "T=4 waited {wait4} ns, T=1 {wait1} ns"
    );
}

#[test]
fn pid_filter_excludes_a_concurrent_process() {
    if !require_root_and_tracepoints() {
        return;
    }
    let mut a = Workload::churn(2, 1000, None);
    let mut b = Workload::churn(2, 1000, None);
    let pid = a.pid.to_string();
    let prof = Profiler::start(&["-p", &pid, "-i", "0"]);
    a.go();
    b.go();
    assert!(a.wait().success() && b.wait().success());
    let out = prof.finish();
    let s = out.summary();
    let pids: Vec<u64> = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        pids,
        vec![a.pid as u64],
        "only the --pid target is profiled"
    );
    assert!(stats(process(s, a.pid).unwrap(), "write").0 >= 4000);
}

#[test]
fn comm_filter_selects_processes_by_name() {
    if !require_root_and_tracepoints() {
        return;
    }
    let name = "mlp-comm-test";
    let mut a = Workload::churn(1, 500, Some(name));
    let mut b = Workload::churn(1, 500, None);
    let prof = Profiler::start(&["--comm", name, "-i", "0", "--all-processes"]);
    a.go();
    b.go();
    assert!(a.wait().success() && b.wait().success());
    prof.signal(libc::SIGINT);
    let out = prof.finish();
    assert!(out.status.success());
    let s = out.summary();
    let p = process(s, a.pid).expect("the named process is profiled");
    assert_eq!(p["comm"], name);
    assert!(stats(p, "write").0 >= 1000);
    assert!(process(s, b.pid).is_none(), "the other process is not");
    for p in s["processes"].as_array().unwrap() {
        assert_eq!(p["comm"], name);
    }
}

/// Thread ids of a live process.
fn task_ids(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Every thread of `roles.js` on Node `major` gets its role, from its name (Node 24 and later
/// name their threads) or its start routine, read from a process that was running before the
/// attach.
fn node_thread_roles_are_recognised_on_a_running_process(major: u32) {
    let Some(dir) = bpf_test() else { return };
    let Some(node) = nodes::node_or_skip(major) else {
        return;
    };
    let (mut w, workers) = node.roles_workload(dir.path());
    assert_eq!(workers.len(), 3);
    // Threads that exist before the work starts: main, V8's platform threads, the Workers.
    // libuv starts its threadpool lazily, on the first deflate: every thread that appears
    // after "go" is a libuv threadpool thread.
    let before = task_ids(w.pid);
    // Attach to the running process.
    let out = profile_workload(&mut w, &["-i", "0"]);
    let s = out.summary();
    let p = process(s, w.pid).expect("node is in the summary");
    assert_main_and_workers(p, w.pid, &workers);
    for tid in &workers {
        assert!(thread_writes(p, *tid) > 0, "{}", thread(p, *tid));
    }
    let threads = p["threads"].as_array().unwrap();
    let roles: Vec<String> = threads
        .iter()
        .map(|t| format!("{} {} {}", t["tid"], t["comm"], t["role"]))
        .collect();
    eprintln!("node {major}: {}", roles.join(", "));
    let libuv: Vec<u64> = threads
        .iter()
        .filter(|t| t["role"] == "libuv")
        .map(|t| t["tid"].as_u64().unwrap())
        .collect();
    assert_eq!(libuv.len(), 2, "UV_THREADPOOL_SIZE=2: {threads:?}");
    for tid in &libuv {
        assert!(!before.contains(tid), "libuv threads start after go: {tid}");
    }
    for t in threads {
        let tid = t["tid"].as_u64().unwrap();
        let role = t["role"].as_str().unwrap();
        match role {
            "main" => assert_eq!(tid, w.pid as u64),
            "worker" => assert!(workers.contains(&tid)),
            "libuv" => assert!(libuv.contains(&tid)),
            // --v8-pool-size=2 platform workers and the delayed-task scheduler.
            "v8" => assert!(before.contains(&tid) && !workers.contains(&tid)),
            // Node's debug signal thread (SIGUSR1 starts the inspector), started at start-up;
            // it may be the one that runs the process's exit.
            "inspector" => assert!(before.contains(&tid), "{t}"),
            "foreign" => assert_ne!(t["pid"], w.pid),
            // mmaplock-prof's own reads (the threads' start routines, the process's maps).
            "profiler" => assert_ne!(t["pid"], w.pid),
            // A thread that took the lock only at the process's exit, too late for its start
            // routine to be read; nothing else is unclassified.
            "other" => {
                let causes = strings(t, "causes", "cause");
                assert!(causes.iter().all(|c| *c == "exit"), "unclassified {t}");
            }
            r => panic!("unexpected role {r} for {t}"),
        }
    }
    let v8 = threads.iter().filter(|t| t["role"] == "v8").count();
    assert!((1..=3).contains(&v8), "{threads:?}");
}

#[test]
fn node22_thread_roles_are_recognised_on_a_running_process() {
    node_thread_roles_are_recognised_on_a_running_process(22);
}

#[test]
fn node24_thread_roles_are_recognised_on_a_running_process() {
    node_thread_roles_are_recognised_on_a_running_process(24);
}

#[test]
fn node26_thread_roles_are_recognised_on_a_running_process() {
    node_thread_roles_are_recognised_on_a_running_process(26);
}

fn check_report(r: &Value) {
    assert_eq!(r["schema_version"], 1);
    let kind = r["type"].as_str().expect("type");
    assert!(kind == "interval" || kind == "summary");
    assert!(r["start"].is_string() && r["end"].is_string());
    if kind == "interval" {
        assert!(r["interval_s"].is_number());
    } else {
        assert!(r["duration_s"].is_number());
    }
    assert!(r["lost"]["events"].is_u64() && r["lost"]["map_full"].is_u64());
    for p in r["processes"].as_array().expect("processes") {
        assert!(p["pid"].is_u64() && p["comm"].is_string());
        check_stats(&p["write"], "process.write");
        check_stats(&p["read"], "process.read");
        for t in p["threads"].as_array().expect("threads") {
            assert!(t["tid"].is_u64());
            let role = t["role"].as_str().expect("role");
            assert!(
                [
                    "main",
                    "worker",
                    "libuv",
                    "v8",
                    "inspector",
                    "addon",
                    "other",
                    "foreign",
                    "profiler"
                ]
                .contains(&role),
                "{role}"
            );
            check_stats(&t["write"], "thread.write");
            check_stats(&t["read"], "thread.read");
        }
    }
}

/// The fields issue 7 adds to the contract: `downgrade` STATS per process and thread (its wait
/// is always 0), `lost` by reason (`events` their sum), and the summary's `uncounted`.
fn check_report_additions(r: &Value) {
    check_lost(r);
    if r["type"] == "summary" {
        assert!(r["uncounted"]["fork_child"].is_u64(), "{}", r["uncounted"]);
    }
    for p in r["processes"].as_array().expect("processes") {
        check_stats(&p["downgrade"], "process.downgrade");
        assert_eq!(
            p["downgrade"]["wait_ns"]["sum"], 0,
            "a downgrade never waits"
        );
        for t in p["threads"].as_array().expect("threads") {
            check_stats(&t["downgrade"], "thread.downgrade");
        }
    }
}

#[test]
fn every_json_line_follows_the_contract() {
    if !require_root_and_tracepoints() {
        return;
    }
    let mut w = Workload::churn(2, 3000, None);
    let out = profile_workload(&mut w, &["-i", "0.05"]);
    assert!(out.lines.len() >= 2, "intervals and a summary");
    for l in &out.lines {
        check_report(l);
        check_report_additions(l);
    }
    let (last, intervals) = out.lines.split_last().unwrap();
    assert_eq!(last["type"], "summary");
    assert!(intervals.iter().all(|l| l["type"] == "interval"));
    // Intervals partition the run: their counts add up to the summary's.
    let sum: u64 = intervals
        .iter()
        .filter_map(|l| process(l, w.pid))
        .map(|p| p["write"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, stats(process(last, w.pid).unwrap(), "write").0);
}

#[test]
fn sigterm_and_sigint_end_with_a_complete_summary() {
    if !require_root_and_tracepoints() {
        return;
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // System-wide, no duration: only the signal ends it.
        // Every process listed: the workload may not be among those that waited longest.
        let prof = Profiler::start(&["-i", "0.2", "--all-processes"]);
        let mut w = Workload::churn(1, 500, None);
        w.go();
        assert!(w.wait().success());
        // Not a bound: the signal comes at some moment after the work, and the summary must
        // be complete whenever it does.
        std::thread::sleep(Duration::from_millis(300));
        prof.signal(sig);
        let out = prof.finish();
        assert!(out.status.success(), "signal {sig}: {:?}", out.status);
        for l in &out.lines {
            check_report(l);
        }
        let s = out.summary();
        // The workload ran while we were attached, system-wide: it is in the summary.
        assert!(stats(process(s, w.pid).unwrap(), "write").0 >= 1000);
    }
}

#[test]
fn duration_ends_the_run() {
    if !require_root_and_tracepoints() {
        return;
    }
    let prof = Profiler::start(&["-d", "0.5", "-i", "0"]);
    let out = prof.finish();
    assert!(out.status.success());
    assert_eq!(out.lines.len(), 1);
    let d = out.summary()["duration_s"].as_f64().unwrap();
    assert!((0.4..5.0).contains(&d), "duration_s {d}");
}

fn one_line_error(out: &std::process::Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_usage_exits_2_with_one_line() {
    let refused: [(&[&str], &str); 14] = [
        (&["--pid", "abc"], "abc"),
        (&["--pid", "0"], "\"0\""),
        (&["--bogus"], "--bogus"),
        (&["-f", "xml"], "xml"),
        (&["-d", "-1"], "-1"),
        // Beyond pid_max: cannot exist.
        (&["--pid", "2000000000"], "no process with pid 2000000000"),
        (
            &["-o", "/nonexistent-dir/x.json", "-d", "1"],
            "/nonexistent-dir/x.json",
        ),
        (
            &["--stacks", "/nonexistent-dir/s.folded", "-d", "1"],
            "/nonexistent-dir/s.folded",
        ),
        (&["--stack-sample", "abc"], "--stack-sample"),
        // Empty names and paths: nothing could match or be written (an empty --comm used to
        // run until killed, profiling nothing; with -d, were one accepted, the test would not
        // hang).
        (&["--comm", "", "-d", "1"], "--comm"),
        (&["-o", "", "-d", "1"], "--output"),
        (&["--stacks", "", "-d", "1"], "--stacks"),
        (&["-i", "0.0000001", "-d", "1"], "0.0000001"),
        (
            &["--comm", "a-name-longer-than-15", "-d", "1"],
            "longer than",
        ),
    ];
    for (args, needle) in refused {
        one_line_error(&run_profiler(args), 2, needle);
    }
}

#[test]
fn without_privilege_exits_1_saying_what_to_do() {
    let Some(dir) = bpf_test() else { return };
    // A copy that user nobody can execute whatever the checkout's permissions.
    let bin = dir.path().join("mmaplock-prof");
    std::fs::copy(integration_tests::profiler_bin(), &bin).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Drop to nobody, without capabilities, and try to load.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&bin)
        .args(["-d", "1"])
        .output()
        .expect("setpriv (util-linux)");
    one_line_error(&out, 1, "root");
}

#[test]
fn write_causes_match_the_syscalls_made() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (mmaps, munmaps, mprotects, madvises, brks) = (300u64, 200u64, 400u64, 250u64, 100u64);
    let mut cmd = Command::new(integration_tests::lock_ops_bin());
    for n in [mmaps, munmaps, mprotects, madvises, brks] {
        cmd.arg(n.to_string());
    }
    let mut w = Workload::spawn(cmd);
    let out = profile_workload(&mut w, &["-i", "0"]);
    let s = out.summary();
    let p = process(s, w.pid).expect("target in summary");
    let got = cause_counts(p);
    eprintln!("causes: {got:?}");
    // What the helper did, its startup having happened before we attached. The margin: the
    // runtime may map or unmap a buffer of its own on the way out (measured here: one
    // munmap, nothing else). Process exit adds one write to cause "exit" (exit_mmap).
    const MARGIN: u64 = 2;
    for (cause, n) in [
        ("mmap", mmaps),
        ("munmap", munmaps),
        ("mprotect", mprotects),
        ("madvise", madvises),
        ("brk", brks),
    ] {
        let c = got.get(cause).copied().unwrap_or(0);
        assert!(
            (n..=n + MARGIN).contains(&c),
            "{cause}: {c} not in {n}..={}: {got:?}",
            n + MARGIN
        );
    }
    let exit = got.get("exit").copied().unwrap_or(0);
    assert!((1..=2).contains(&exit), "exit: {got:?}");
    let other: u64 = got
        .iter()
        .filter(|(c, _)| {
            !["mmap", "munmap", "mprotect", "madvise", "brk", "exit"].contains(&c.as_str())
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(other, 0, "{got:?}");
    // The per-thread causes of the main thread say the same.
    let main = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == w.pid)
        .unwrap();
    assert_eq!(cause_counts(main)["mprotect"], mprotects);
    // Causes partition the writes.
    let total: u64 = got.values().sum();
    assert_eq!(total, p["write"]["count"].as_u64().unwrap());
}

#[test]
fn addon_writes_are_charged_to_the_addon_and_its_thread_is_an_addon_thread() {
    let Some(dir) = bpf_test() else { return };
    let (workers, n) = (3u64, 150u64);
    let mut w = Workload::churn_addon(dir.path(), "addon/addon.js", workers, n);
    let folded = dir.path().join("folded.txt");
    let out = profile_workload(&mut w, &["-i", "0", "--stacks", folded.to_str().unwrap()]);
    let s = out.summary();
    assert_eq!(s["stack_sample"], 1);
    // A profiler that falls behind drops sampled stacks, counted: the charge is judged on
    // those that arrived, and most must have.
    let lost = s["lost"]["stacks"].as_u64().expect("lost.stacks");
    let p = process(s, w.pid).expect("node in the summary");
    // The addon did (mmap + munmap) x n on each Worker and on its own thread, and created
    // that thread (pthread_create maps its stack and protects its guard page: 2 writes,
    // charged to the addon, which called it).
    let all_addon_writes = 2 * n * (workers + 1) + 2;
    assert!(lost * 2 < all_addon_writes, "{lost} sampled stacks lost");
    let addon_writes = all_addon_writes - lost;
    let dsos = p["dsos"].as_array().expect("dsos");
    let charged = dsos
        .iter()
        .find(|d| d["dso"].as_str().unwrap().ends_with("/churn.node"))
        .unwrap_or_else(|| panic!("no writes charged to churn.node: {dsos:?}"));
    let c = charged["write"]["count"].as_u64().unwrap();
    eprintln!("charged to churn.node: {c} of {addon_writes} sampled ({lost} lost)");
    assert!(
        c * 100 >= 95 * addon_writes && c <= all_addon_writes,
        "{c} of {addon_writes} addon writes charged to it"
    );
    // The stacks name the addon's function, called from its thread's start routine.
    let stacks = p["stacks"].as_array().unwrap();
    assert!(
        stacks.iter().any(|st| st["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().starts_with("churn (churn.node)"))),
        "{stacks:?}"
    );
    let text = std::fs::read_to_string(&folded).unwrap();
    assert!(text.contains("churn_(churn.node)"), "folded stacks: {text}");
    // Named by the process's command name, which it no longer has a /proc entry to tell
    // when the file is written (it exited before the run ended).
    let head = format!("node-{};", w.pid);
    assert!(
        text.lines().all(|l| l.starts_with(&head)),
        "folded stacks not all of {head}: {text}"
    );
    // Its own thread: role addon.
    let addon_threads: Vec<&Value> = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "addon")
        .collect();
    assert_eq!(addon_threads.len(), 1, "{:?}", p["threads"]);
    assert_eq!(addon_threads[0]["write"]["count"].as_u64().unwrap(), 2 * n);
    // The finding follows the writes: the addon's own calls (no mechanism of the C runtime
    // between them and the system call), its code named, on its thread and the Workers'.
    let finding = finding(s, "own-mappings", w.pid);
    assert!(
        finding["title"]
            .as_str()
            .unwrap()
            .starts_with("churn (churn.node) maps and unmaps memory itself ("),
        "{finding}"
    );
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        strings(&finding["evidence"]["code"]),
        ["churn (churn.node)"],
        "{finding}"
    );
    let roles = strings(&finding["evidence"]["roles"]);
    assert!(
        roles.contains(&"addon".to_string()) && roles.contains(&"worker".to_string()),
        "{finding}"
    );
    assert!(
        finding["writes"].as_u64().unwrap() >= 2 * n * workers,
        "{finding}"
    );
}

#[test]
fn writes_only_counts_every_write_and_no_read() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (t, n) = (2u64, 1500u64);
    let (pid, out) = profile_churn(t as u32, n as u32, &["--writes-only"]);
    let p = process(out.summary(), pid).expect("target");
    assert_churn_total(stats(p, "write").0, t, n, "--writes-only", "");
    assert_eq!(p["read"]["count"], 0);
    let munmap = cause_counts(p)["munmap"];
    assert!(
        (t * n..=t * n + churn_slack(t)).contains(&munmap),
        "munmap {munmap}"
    );
}

#[test]
fn exited_threads_free_their_entries_and_stay_in_the_summary() {
    if !require_root_and_tracepoints() {
        return;
    }
    // Room for 4 threads at a time; 3 waves of 4 threads come and go.
    let (waves, threads, n) = (3u64, 4u64, 20u64);
    let mut w = Workload::helper("thread-waves", [waves, threads, n, 1600]);
    let out = profile_workload(&mut w, &["-i", "0", "--max-threads", "5"]);
    let s = out.summary();
    assert_eq!(
        s["lost"]["map_full"], 0,
        "exited threads' entries were freed"
    );
    let p = process(s, w.pid).expect("target");
    let workers = helper_threads(p, w.pid);
    assert_eq!(workers.len() as u64, waves * threads, "{workers:?}");
    for t in workers {
        let c = t["write"]["count"].as_u64().unwrap();
        // mmap + munmap per iteration and nothing else: the helper's threads are plain
        // pthreads on cached stacks that never allocate (see thread_waves.rs).
        assert_eq!(c, 2 * n, "{t}");
    }
}
