//! ROOT-ONLY: the quiet cases, in both modes. A busy process whose lock is taken but never
//! contended gets a verdict, "not this process's bottleneck", also in contention mode where
//! it never waited (zero waits is a result, not an absence); native worker threads growing
//! glibc's arenas through posix_memalign are named so, with the arena's advice, whether
//! their writes made anyone wait or not; and no finding sizes itself on acquisitions that
//! waited behind no one.

use std::process::Command;

use integration_tests::{
    Finished, Profiler, Workload, bpf_test, fixture,
    lanes::{build_lanes_addon, build_lanes_addon_without_unwind_tables},
    process,
};
use serde_json::Value;

/// `arenas.js`: `threads` threads of the addon's own, each `rounds` rounds of `count`
/// posix_memalign(4096, 96 KiB) kept and freed (about 66 MiB a round: a thread arena's heap
/// of 64 MiB is outgrown, a second one mapped and grown, and given back at the frees), and
/// `spin_us` of computing after each; on the CPUs `cpus` (`taskset -c`), or any.
fn arenas(
    addon: &std::path::Path,
    threads: u64,
    rounds: u64,
    spin_us: u64,
    cpus: Option<&str>,
) -> Workload {
    arenas_of(addon, threads, rounds, 700, spin_us, cpus)
}

/// [`arenas`] with `count` blocks a round.
fn arenas_of(
    addon: &std::path::Path,
    threads: u64,
    rounds: u64,
    count: u64,
    spin_us: u64,
    cpus: Option<&str>,
) -> Workload {
    let mut cmd = match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", c, "node"]);
            cmd
        }
        None => Command::new("node"),
    };
    cmd.arg(fixture("addon/arenas.js"))
        .arg(addon)
        .args([threads, rounds, count, 96 * 1024, spin_us].map(|n| n.to_string()));
    Workload::spawn(cmd)
}

/// Profiles `w` from "go" to "done" with `args`: the profiler's output.
fn profile(w: &mut Workload, args: &[&str]) -> Finished {
    let pid = w.pid.to_string();
    let mut all = vec!["-p", pid.as_str(), "-i", "0"];
    all.extend_from_slice(args);
    let prof = Profiler::start(&all);
    w.send("go");
    assert_eq!(w.read_line(), "done");
    prof.signal(libc::SIGINT);
    let out = prof.finish_ok();
    w.send("exit");
    assert!(w.wait().success());
    integration_tests::keep_output(&out, "quiet", &format!("args {args:?}\n"));
    out
}

fn findings(out: &Finished) -> Vec<Value> {
    out.summary()["findings"]
        .as_array()
        .expect("findings")
        .clone()
}

fn texts(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The arena finding: glibc's arenas under the addon's code, on its own threads, with the
/// arena cap and jemalloc first in its advice (never the addon "mapping memory itself").
fn assert_arena_finding(f: &Value, mode: &str) {
    eprintln!("{mode}: {}", serde_json::to_string_pretty(f).unwrap());
    let title = f["title"].as_str().unwrap();
    assert!(
        title.starts_with(
            "glibc's malloc arenas grow and shrink under arena_rounds (lanes.node) (addon threads)"
        ),
        "{mode}: {title}"
    );
    let advice = texts(&f["advice"]);
    assert!(
        advice.starts_with("Cap glibc's malloc arenas: MALLOC_ARENA_MAX=2"),
        "{advice}"
    );
    assert!(advice.contains("jemalloc"), "{advice}");
    assert!(
        !advice.contains("maps and unmaps memory itself"),
        "{advice}"
    );
    // Arenas are made by mmap, grown by mprotect, given back by munmap (and madvise). Full
    // mode sees every write, and the growth dominates; contention mode sees only the writes
    // that waited, and which did is the scheduler's doing: a run here saw only the seven
    // threads' first arena mmaps wait. Either way, only the arenas' syscalls are causes.
    let causes = f["evidence"]["causes"].as_array().expect("causes");
    assert!(!causes.is_empty(), "{mode}: no cause");
    for c in causes {
        let c = c.as_str().unwrap();
        assert!(
            ["mmap", "mprotect", "munmap", "madvise"].contains(&c),
            "{mode}: {c} is not an arena's syscall"
        );
    }
    if mode == "full" {
        assert!(causes.iter().any(|c| c == "mprotect"), "full: {causes:?}");
    }
}

/// A busy process (one native thread computing, its arena grown and given back between)
/// whose writes never wait: full mode says it is not this process's bottleneck, and names
/// the arena's writes as what is there (info: no one waited for them), with the arena's
/// advice; contention mode, which sees no wait at all, gives the same verdict with what it
/// watched. No finding's wait is made of acquisitions that waited behind no one.
#[test]
fn a_busy_process_whose_lock_is_never_contended_is_not_its_bottleneck_in_both_modes() {
    let Some(dir) = bpf_test() else { return };
    let addon = build_lanes_addon(dir.path());
    for (mode, args) in [
        ("full", &["--stack-sample", "4"][..]),
        (
            "contention",
            &["--mode", "contention", "--stack-sample", "1"][..],
        ),
    ] {
        let mut w = arenas(&addon, 1, 40, 50_000, None);
        let pid = w.pid;
        let out = profile(&mut w, args);
        let all = findings(&out);
        let first = all.first().unwrap_or_else(|| panic!("{mode}: no verdict"));
        eprintln!("{mode}: {}", serde_json::to_string_pretty(&all).unwrap());
        assert_eq!(first["id"], "not-your-bottleneck", "{mode}: {first}");
        assert_eq!(first["pid"], pid);
        let p = process(out.summary(), pid).expect("the process is in the summary");
        let share = &p["time_share"];
        assert!(share["wall"].as_f64().unwrap() < 0.01, "{mode}: {share}");
        for f in &all {
            assert_eq!(f["severity"], "info", "{mode}: {f}");
            // Uncontended acquisitions size no finding: none claims a tenth of a wait that
            // is made of them.
            if f["id"] != "not-your-bottleneck" && f["id"] != "profiler-presence" {
                assert!(f["wait_ns"].as_u64().unwrap() < 10_000_000, "{mode}: {f}");
            }
        }
        match mode {
            "full" => {
                let a = all
                    .iter()
                    .find(|f| f["id"] == "arena-growth")
                    .unwrap_or_else(|| panic!("full: no arena finding in {all:?}"));
                assert_arena_finding(a, mode);
                // No one waited, or too little to matter, said so.
                let t = a["title"].as_str().unwrap();
                assert!(
                    t.ends_with("no one waited for them") || t.contains(" waited only "),
                    "{a}"
                );
            }
            _ => {
                let t = first["title"].as_str().unwrap();
                assert!(t.contains("threads watched in"), "{t}");
                let facts = texts(&first["evidence"]["facts"]);
                assert!(facts.starts_with("watched "), "{facts}");
            }
        }
    }
}

/// Native worker threads of an addon (eight, its own, on one CPU) growing glibc's arenas
/// through posix_memalign at once: preempted with the lock held, their writes make each other
/// wait, and the finding says glibc's arenas, under the addon's code, with the arena cap and
/// jemalloc. In contention mode when their writes waited (the waits full mode charges are
/// short: runs of this shape had at times no contended wait at all, and then the verdict is
/// that nothing waited).
/// Whether a process waited materially as docs/findings.md says: 10 ms in all, and not under
/// 1% of its threads' time alive and CPU time with no role of its own over 2% (a process at
/// 0.99% whose addon threads waited 3% of theirs waited materially).
fn waited_materially(p: &Value) -> bool {
    let sum = |side: &str| p[side]["wait_ns"]["sum"].as_u64().unwrap_or(0);
    let ts = &p["time_share"];
    let small = ts["wall"].as_f64().is_some_and(|w| w < 0.01)
        && ts["cpu"].as_f64().is_none_or(|c| c < 0.01)
        && (p["time_share_by_role"].as_array().into_iter().flatten()).all(|r| {
            r["role"] == "foreign" || r["role"] == "profiler" || r["wall"].as_f64() < Some(0.02)
        });
    sum("write") + sum("read") >= 10_000_000 && !small
}

#[test]
fn native_threads_growing_glibcs_arenas_get_the_arenas_advice_in_both_modes() {
    let Some(dir) = bpf_test() else { return };
    let addon = build_lanes_addon(dir.path());
    for (mode, args) in [
        ("full", &["--blockers", "--stack-sample", "4"][..]),
        (
            "contention",
            &["--mode", "contention", "--stack-sample", "1"][..],
        ),
    ] {
        let mut w = arenas(&addon, 8, 20, 0, Some("0"));
        let pid = w.pid;
        let out = profile(&mut w, args);
        let all = findings(&out);
        // Which writes wait is the scheduler's doing: contention mode, which sees only
        // those, may see none; then its verdict says so.
        let waited = process(out.summary(), pid).map_or(0, |p| {
            p["write"]["count"].as_u64().unwrap_or(0) + p["read"]["count"].as_u64().unwrap_or(0)
        });
        // (Its verdict needs a second of the threads' time watched: a short run has none.)
        // With few waits, a mechanism is claimed only on its minimum of sampled stacks (the
        // waiters' and their holders': 7 contended writes made 14 in a run here), and it is
        // then the arenas'.
        if mode == "contention"
            && waited < 10
            && all.iter().all(|f| f["id"] == "not-your-bottleneck")
        {
            eprintln!("contention: {waited} contended waits in this run: its verdict only");
            continue;
        }
        let a = all
            .iter()
            .find(|f| f["id"] == "arena-growth")
            .unwrap_or_else(|| panic!("{mode}: no arena finding in {all:#?}"));
        assert_arena_finding(a, mode);
        assert_eq!(texts(&a["evidence"]["roles"]), "addon", "{mode}");
        // Their writes made the others wait; how much is the scheduler's doing: a finding
        // that matters (10 ms and 1% of the threads' time, docs/findings.md) above info, one
        // that does not info, saying how little.
        let victims = a["evidence"]["victims"].as_array().expect("victims");
        assert!(
            victims.iter().any(|v| v["wait_ns"].as_u64().unwrap() > 0),
            "{mode}: they waited: {a}"
        );
        let material = waited_materially(process(out.summary(), pid).expect("the process"));
        if !material {
            assert!(
                a["title"].as_str().unwrap().contains(" waited only "),
                "{mode}: {a}"
            );
        }
    }
}

/// Native threads growing glibc's arenas in a library built without unwind tables (as
/// sharp's prebuilt libvips): their stacks stop in the library, yet hold the frames that tell
/// the mechanism, so the arena finding names the library's function; and the report says
/// whose stacks stop, why and in which file.
#[test]
fn arena_writes_in_a_library_without_unwind_tables_are_named_and_their_stacks_cut_said() {
    let Some(dir) = bpf_test() else { return };
    let addon = build_lanes_addon_without_unwind_tables(dir.path());
    // The busy process's shape: one thread, 40 rounds of 700 blocks (66 MiB: a heap
    // outgrown, a new one mapped and given back).
    let mut w = arenas(&addon, 1, 40, 50_000, None);
    let pid = w.pid;
    let out = profile(&mut w, &["--stack-sample", "4"]);
    let p = process(out.summary(), pid).expect("the process");
    let all = findings(&out);
    let a = all
        .iter()
        .find(|f| f["id"] == "arena-growth")
        .unwrap_or_else(|| panic!("no arena finding in {all:#?}"));
    assert!(
        a["title"].as_str().unwrap().starts_with(
            "glibc's malloc arenas grow and shrink under arena_rounds (lanes-nounwind.node) (addon threads)"
        ),
        "{a}"
    );
    let addon_samples: u64 = (p["samples"]["stacks"].as_array().into_iter().flatten())
        .filter(|s| s["role"] == "addon")
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    // Whose stacks stop, and where: in the library, on its threads.
    let cuts = p["stack_cuts"].as_array().expect("stack_cuts");
    let stopped: u64 = (cuts.iter())
        .filter(|c| c["role"] == "addon" && c["stops_in"] == "lanes-nounwind.node")
        .map(|c| c["stacks"].as_u64().unwrap())
        .sum();
    assert!(stopped * 2 >= addon_samples, "{addon_samples}: {cuts:?}");
    let text = integration_tests::report_text(&out, &dir.path().join("run.ndjson"));
    assert!(
        text.contains("in lanes-nounwind.node on addon threads"),
        "{text}"
    );
}

/// Sampling by time as well as by count: a process that writes ten times a second for ten
/// seconds (a map and an unmap every 100 ms, python's mmap: exactly those writes) has a
/// stack sampled about once a second at the default sampling, where one in 64 alone would
/// sample 3 of its 200 writes.
#[test]
fn a_process_writing_rarely_has_a_write_sampled_each_second_at_the_default_rate() {
    if bpf_test().is_none() {
        return;
    }
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "import mmap, sys, time\n\
         print('ready', flush=True); sys.stdin.readline()\n\
         for i in range(100):\n    m = mmap.mmap(-1, 1 << 20); m[0] = 1; m.close(); time.sleep(0.1)\n\
         print('done', flush=True); sys.stdin.readline()\n",
    ]);
    let mut w = Workload::spawn(cmd);
    let pid = w.pid;
    let out = profile(&mut w, &[]);
    let p = process(out.summary(), pid).expect("the process");
    let writes = p["write"]["count"].as_u64().unwrap();
    let sampled: u64 = (p["samples"]["stacks"].as_array().into_iter().flatten())
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    eprintln!("{writes} writes, {sampled} sampled");
    assert!(writes >= 200, "{writes}");
    // About one a second over 10 s (the first at once), against 3 of one in 64.
    assert!(
        sampled >= 7 && sampled * 64 > writes * 2,
        "{sampled} sampled of {writes} writes"
    );
}
