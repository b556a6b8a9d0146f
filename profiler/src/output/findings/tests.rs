//! The patterns on synthetic summaries: each recognised from its evidence, and not from
//! look-alikes.

use serde_json::{Value, json};

use super::{Severity, StudyEffects, find, to_text};

const S: u64 = 1_000_000_000;

fn stats(count: u64, wait: u64) -> Value {
    json!({"count": count, "wait_ns": {"sum": wait, "max": wait, "mean": 0.0},
           "hold_ns": {"sum": 0, "max": 0, "mean": 0.0}})
}

fn holds(count: u64, wait: u64, hold_sum: u64, hold_max: u64) -> Value {
    let mut s = stats(count, wait);
    s["hold_ns"] =
        json!({"sum": hold_sum, "max": hold_max, "mean": hold_sum as f64 / count as f64});
    s
}

fn thread(tid: u64, role: &str, causes: &[(&str, Value)], read: Value) -> Value {
    let count: u64 = causes.iter().map(|c| c.1["count"].as_u64().unwrap()).sum();
    let wait: u64 = causes
        .iter()
        .map(|c| c.1["wait_ns"]["sum"].as_u64().unwrap())
        .sum();
    json!({"tid": tid, "role": role, "comm": "node", "write": stats(count, wait), "read": read,
           "causes": causes.iter().map(|(c, s)| json!({"cause": c, "write": s})).collect::<Vec<_>>()})
}

/// A process of these threads, each alive `alive` ns, with its time share by role.
fn process(pid: u64, threads: Vec<Value>, alive: u64) -> Value {
    let mut roles: std::collections::BTreeMap<String, (u64, u64, u64)> = Default::default();
    let (mut w, mut r) = (0, 0);
    for t in &threads {
        let (tw, tr) = (
            t["write"]["wait_ns"]["sum"].as_u64().unwrap(),
            t["read"]["wait_ns"]["sum"].as_u64().unwrap(),
        );
        w += tw;
        r += tr;
        let e = roles
            .entry(t["role"].as_str().unwrap().to_string())
            .or_default();
        e.0 += tw + tr;
        e.1 += alive;
        e.2 += 1;
    }
    let own: (u64, u64, u64) = roles
        .iter()
        .filter(|(r, _)| *r != "foreign")
        .fold((0, 0, 0), |a, (_, e)| (a.0 + e.0, a.1 + e.1, a.2 + e.2));
    json!({"pid": pid, "comm": "node", "write": stats(0, w), "read": stats(0, r), "threads": threads,
        "time_share": {"wait_ns": own.0, "alive_ns": own.1, "wall": own.0 as f64 / own.1 as f64, "threads": own.2},
        "time_share_by_role": roles.iter().map(|(role, e)| json!({"role": role, "wait_ns": e.0,
            "alive_ns": e.1, "wall": e.0 as f64 / e.1 as f64, "threads": e.2})).collect::<Vec<_>>()})
}

fn summary(processes: Vec<Value>) -> Value {
    json!({"type": "summary", "duration_s": 4.0, "processes": processes})
}

fn ids(findings: &[super::Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.id.as_str()).collect()
}

fn workers_growing_arenas(mprotect_wait: u64) -> Value {
    process(
        1,
        vec![
            thread(1, "main", &[("brk", stats(10, 1000))], stats(5, 10)),
            thread(
                2,
                "worker",
                &[("mprotect", stats(500, mprotect_wait))],
                stats(100, 1000),
            ),
            thread(
                3,
                "worker",
                &[("mprotect", stats(500, mprotect_wait))],
                stats(100, 1000),
            ),
        ],
        4 * S,
    )
}

#[test]
fn arena_growth_is_the_workers_mprotects_and_its_severity_their_share_of_time() {
    // 2 x 0.3 s of 2 x 4 s: 7.5% of the Workers' time.
    let f = find(&summary(vec![workers_growing_arenas(300_000_000)]), None);
    assert_eq!(ids(&f), ["arena-growth"]);
    let a = &f[0];
    assert_eq!(a.severity, Severity::Medium);
    assert_eq!(a.time_share, Some(0.075));
    assert_eq!(a.evidence.roles, ["worker"]);
    assert!(a.evidence.facts[0].starts_with("mprotect writes by thread role: worker 1000"));
    assert!(a.advice[0].contains("MALLOC_ARENA_MAX=2"));
    assert_eq!(a.source, "docs/findings.md#arena-growth");
    // The same as a report of an older build (no time share): a lower bound from the run.
    let mut old = summary(vec![workers_growing_arenas(300_000_000)]);
    for k in ["time_share", "time_share_by_role"] {
        old["processes"][0].as_object_mut().unwrap().remove(k);
    }
    let f = find(&old, None);
    assert_eq!(
        (f[0].time_share, f[0].time_share_bound),
        (None, Some(0.075))
    );
    // Sampled stacks that say it is not malloc (V8 changing its code's protection).
    let mut jit = summary(vec![workers_growing_arenas(300_000_000)]);
    jit["processes"][0]["flame"] = json!([
        {"stack": "start;v8::internal::Isolate::Init (node);v8::base::OS::SetPermissions (node);mprotect (libc.so.6)", "count": 30}]);
    assert!(!ids(&find(&jit, None)).contains(&"arena-growth"));
    // ... and stacks that confirm it, naming the code that called malloc.
    jit["processes"][0]["flame"] = json!([
        {"stack": "start;node::NodeArrayBufferAllocator::Allocate(unsigned long) (node);malloc (libc.so.6);0x7f00 (libc.so.6);__mprotect (libc.so.6)", "count": 30}]);
    let f = find(&jit, None);
    assert_eq!(
        f[0].evidence.code,
        ["node::NodeArrayBufferAllocator::Allocate (node)"]
    );
}

#[test]
fn a_process_that_hardly_waits_is_not_bottlenecked_and_says_so_first() {
    // 1 ms of wait in 8 s of the threads' time.
    let quiet = process(
        7,
        vec![
            thread(
                7,
                "main",
                &[("mmap", stats(30, 500_000))],
                stats(10, 500_000),
            ),
            thread(8, "other", &[], stats(1, 10)),
        ],
        4 * S,
    );
    let f = find(
        &summary(vec![quiet, workers_growing_arenas(300_000_000)]),
        None,
    );
    // The busier process's findings first; the quiet one's verdict heads its own.
    assert_eq!(ids(&f), ["arena-growth", "not-your-bottleneck"]);
    assert_eq!(f[1].pid, 7);
    assert_eq!(f[1].severity, Severity::Info);
    assert!(
        f[1].title.contains("waited 0.013% of their time"),
        "{}",
        f[1].title
    );
    // One role waiting a lot is not "not a bottleneck", whatever the process's mean.
    // (A libuv thread waiting 2.5% of its time among 11 idle threads: 0.2% for the process.)
    let mut threads: Vec<Value> = (11..22)
        .map(|t| thread(t, "v8", &[], stats(1, 10)))
        .collect();
    threads.push(thread(
        10,
        "libuv",
        &[("munmap", stats(10, S))],
        stats(1, 10),
    ));
    let busy_role = process(9, threads, 40 * S);
    assert!(busy_role["time_share"]["wall"].as_f64().unwrap() < 0.01);
    assert!(!ids(&find(&summary(vec![busy_role]), None)).contains(&"not-your-bottleneck"));
}

#[test]
fn long_holds_name_the_call_and_the_holder_with_or_without_blockers() {
    let mut p = process(
        20,
        vec![
            thread(20, "main", &[], stats(1, 10)),
            thread(
                21,
                "other",
                &[("fork", holds(40, 1000, 280_000_000, 9_000_000))],
                stats(1, 10),
            ),
            thread(
                22,
                "worker",
                &[("mmap", stats(3000, 250_000_000))],
                stats(1, 10),
            ),
        ],
        4 * S,
    );
    let f = find(&summary(vec![p.clone()]), None);
    let l = f.iter().find(|f| f.id == "long-holds").expect("long-holds");
    assert!(
        l.title
            .starts_with("thread 21 (node, other) holds mmap_lock for write in fork for 7.00ms"),
        "{}",
        l.title
    );
    assert_eq!(l.evidence.threads[0].cause, "fork");
    assert!(l.evidence.facts[1].starts_with("without --blockers"));
    // With blockers: what was charged to it.
    p["blockers"] = json!([{"tid": 21, "pid": 20, "role": "other", "comm": "node", "cause": "fork",
                            "waits": 900, "wait_ns": 200_000_000u64, "write_wait_ns": 200_000_000u64}]);
    let f = find(&summary(vec![p.clone()]), None);
    let l = f.iter().find(|f| f.id == "long-holds").unwrap();
    assert_eq!(l.wait_ns, 200_000_000);
    assert!(l.evidence.facts[1].contains("(900 waits) is charged to its holds"));
    // Short holds, however many, are not long holds.
    p["threads"][1] = thread(
        21,
        "other",
        &[("fork", holds(40_000, 1000, 280_000_000, 90_000))],
        stats(1, 10),
    );
    assert!(!ids(&find(&summary(vec![p]), None)).contains(&"long-holds"));
}

#[test]
fn an_addons_threads_and_file_are_named() {
    let mut p = process(
        30,
        vec![
            thread(30, "main", &[], stats(1, 10)),
            thread(
                31,
                "addon",
                &[("mmap", stats(150, 1000)), ("munmap", stats(150, 1000))],
                stats(0, 0),
            ),
        ],
        4 * S,
    );
    p["dsos"] = json!([{"dso": "/srv/app/node_modules/x/build/Release/churn.node", "write": stats(400, 3000)},
                       {"dso": "/usr/bin/node", "write": stats(20, 100)}]);
    let s = json!({"type": "summary", "duration_s": 4.0, "stack_sample": 1, "processes": [p]});
    let f = find(&s, None);
    let a = f
        .iter()
        .find(|f| f.id == "addon-threads")
        .expect("addon-threads");
    assert!(
        a.title
            .starts_with("churn.node takes the lock for write itself: 300 writes"),
        "{}",
        a.title
    );
    assert_eq!(
        a.evidence.code,
        ["/srv/app/node_modules/x/build/Release/churn.node"]
    );
    assert_eq!(a.evidence.causes, ["mmap", "munmap"]);
}

#[test]
fn fault_reads_v8_unmaps_and_the_profiler_itself() {
    let mut p = process(
        40,
        vec![
            thread(40, "main", &[], stats(1, 10)),
            thread(
                41,
                "worker",
                &[("mprotect", stats(100, 100_000_000))],
                stats(5000, 50_000_000),
            ),
            thread(
                42,
                "v8",
                &[("munmap", stats(300, 60_000_000))],
                stats(1, 10),
            ),
            json!({"tid": 99, "role": "foreign", "comm": "mmaplock-prof", "write": stats(0, 0),
                   "read": holds(30, 1000, 20_000_000, 3_000_000), "causes": []}),
        ],
        4 * S,
    );
    p["blocked_by_role"] = json!([
        {"waiter_role": "worker", "holder_role": "worker", "cause": "read", "wait_ns": 70_000_000u64, "write_wait_ns": 70_000_000u64},
        {"waiter_role": "worker", "holder_role": "v8", "cause": "downgrade", "wait_ns": 10_000_000u64, "write_wait_ns": 10_000_000u64}]);
    p["blockers"] = json!([{"tid": 99, "pid": 99, "role": "foreign", "comm": "mmaplock-prof", "cause": "read",
                            "waits": 10, "wait_ns": 5_000_000u64, "write_wait_ns": 5_000_000u64}]);
    let f = find(&summary(vec![p]), None);
    let found = ids(&f);
    for id in [
        "arena-growth",
        "fault-reads",
        "v8-gc-unmap",
        "profiler-presence",
    ] {
        assert!(found.contains(&id), "{id} not in {found:?}");
    }
    let v8 = f.iter().find(|f| f.id == "v8-gc-unmap").unwrap();
    assert_eq!(
        v8.wait_ns, 70_000_000,
        "its munmaps' wait and the wait charged to them"
    );
    let ours = f.iter().find(|f| f.id == "profiler-presence").unwrap();
    assert_eq!(ours.wait_ns, 5_000_000);
    assert_eq!(ours.evidence.roles, ["foreign"]);
    // Info findings keep to their title and cost in the text.
    let text = to_text(&f);
    assert!(text.contains("the profiler's own reads"), "{text}");
    assert!(!text.contains("sample fewer stacks"), "{text}");
}

#[test]
fn a_study_adds_the_measured_effect_of_the_advice() {
    let study = StudyEffects::from_study(&json!({"type": "study",
        "machine": {"kernel": "6.18.0", "node": "v20.20.2", "cpus": 2},
        "ranking": [{"file_kib": 64.0, "scenario": "jemalloc", "throughput_ratio": 1.3, "writes_ratio": 0.3,
                     "throughput": {"mean": 1.3, "min": 1.2, "max": 1.4, "runs": 3},
                     "writes": {"mean": 0.3, "min": 0.25, "max": 0.35, "runs": 3}, "throughput_verdict": "changed"},
                    {"file_kib": 64.0, "scenario": "arena-1", "throughput_ratio": 1.24, "writes_ratio": 0.46}]}))
    .unwrap();
    let f = find(
        &summary(vec![workers_growing_arenas(300_000_000)]),
        Some(&study),
    );
    let m: Vec<&str> = f[0].measured.iter().map(|e| e.scenario.as_str()).collect();
    assert_eq!(m, ["arena-1", "jemalloc"], "in the pattern's order");
    assert_eq!(
        f[0].measured_on.as_deref(),
        Some("Linux 6.18.0, Node.js v20.20.2, 2 CPUs")
    );
    let text = to_text(&f);
    assert!(text.contains("measured here: jemalloc at 64 KiB: 1.30x throughput (1.20-1.40, 3 runs, changed), 0.30x writes"), "{text}");
    assert!(text.contains("measured here: arena-1 at 64 KiB: 1.24x throughput, 0.46x writes"));
}
