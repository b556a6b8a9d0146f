//! ROOT-ONLY: what contention mode shows besides its counts: side by side with full mode, the
//! share of the wait it captures; the writer a wait began behind (no `--blockers`); the
//! contended writes' sampled stacks and JavaScript names; the agent's dashboard and rules on a
//! real Prometheus; the one-shot's word on kernels that format memcg paths, and how the
//! agent's captures run there; a bad `--mode`.

use std::{process::Command, time::Duration};

use integration_tests::{
    Profiler, Workload, bpf_test,
    bpftrace::{
        assert_contention_summary, contention_ready, reported_waits, require_contention_tracepoints,
    },
    finding, process, profile_workload, require_root_and_tracepoints, roles_workload_sized,
    scrape::Agent,
};
use serde_json::Value;

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
        let full = full.finish_ok();
        let cont = cont.finish_ok();
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
        for ((_, _), wait) in reported_waits(pc) {
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
/// are charged the most of any thread, with their cause, and the finding names that thread.
/// A wait that began behind a reader-owned lock (the churners' first touches fault under it)
/// is charged to "readers", not a thread, even if most of it was then spent behind the
/// holder queued ahead: in one clean-clone run that row came first (784 ms against the
/// holder's 690 ms), so the holder is looked for among threads.
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
    let top = blockers
        .iter()
        .find(|b| b["role"] != "readers")
        .expect("a thread among the blockers");
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
    // Every rate() its two samples after the work, every rule a few evaluations (both every
    // second of Prometheus's clock): counted by its own `up` series, not by ours.
    let scrapes = "sum(count_over_time(up[1h]))";
    let seen = prom.value(scrapes).unwrap_or(0.0);
    prom.wait_for(
        scrapes,
        Duration::from_secs(10),
        |v| v >= seen + 4.0,
        "4 more scrapes",
    );
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
/// one for one (a stack the profiler could not keep is counted in `lost.stacks`), and the
/// Workers' own function is named, with its script.
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
    // One sample per contended write (the profiler's own are never its process's), or a
    // stack counted as lost (only node is profiled, so every lost stack is its own): a
    // burst of contended writes, every one sampled, can fill the ring faster than a debug
    // build unwinds (some 600 stacks of 16 KiB fit; up to half were lost in 1 run in 3).
    let sampled = integration_tests::sampled_writes(p);
    let lost = s["lost"]["stacks"].as_u64().unwrap();
    assert_eq!(sampled + lost, writes, "lost {}: {}", s["lost"], p["dsos"]);
    assert!(
        sampled >= writes.min(100),
        "{sampled} sampled: {}",
        s["lost"]
    );
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
    // The agent's triggered captures avoid full mode there (docs/agent.md, "Triggered
    // captures"), and say so as they start.
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Command::new(integration_tests::profiler_bin())
        .args(["agent", "--listen", "127.0.0.1:0", "--escalate-dir"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the agent");
    let stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut plan = None;
    // It serves or ends (stderr then closes): no bound on how long attaching takes.
    for l in std::io::BufRead::lines(stderr).map_while(Result::ok) {
        if let Some(p) = l.split_once("escalation on: ").map(|(_, p)| p.to_string()) {
            plan = Some(p);
        }
        if l.contains("serving") {
            break;
        }
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let plan = plan.expect("the agent says how it captures");
    let contention = plan.contains("contention mode: in full mode this kernel's mmap_lock");
    let full = plan.contains("in full mode with --blockers");
    assert_eq!(
        (contention, full),
        (formats_paths, !formats_paths),
        "memcg_path: {formats_paths}; {plan}"
    );
}
