//! The patterns on synthetic summaries, built through the report's own types: each
//! recognised from its evidence, and not from look-alikes.

use std::collections::BTreeMap;

use super::{Severity, StudyEffects, find, to_text};
use crate::{
    aggregation::{DurationHist, SideStats},
    output::{
        fixtures::time_share as share,
        report::{
            BlockerReport, CauseReport, DsoReport, FlameStack, HolderFunctionReport, LockReport,
            ProcessReport, ProfilerShare, Report, RoleBlock, Stats, ThreadReport,
        },
        share::RoleShare,
    },
    registry::roles::Role,
};

pub(super) const S: u64 = 1_000_000_000;

/// `count` durations summing to `sum`, the longest `max`, all in the bucket of `max`.
pub(super) fn hist(sum: u64, max: u64, count: u64) -> DurationHist {
    let upper = (max + 1).next_power_of_two().min(1 << 39);
    DurationHist::from_upper_bounds(sum, max, (count > 0).then_some((upper, count)))
}

pub(super) fn side(count: u64, wait: u64) -> SideStats {
    SideStats {
        count,
        failed: 0,
        wait: hist(wait, wait, count),
        hold: DurationHist::default(),
    }
}

pub(super) fn stats(count: u64, wait: u64) -> Stats {
    Stats::new(&side(count, wait))
}

/// Writes that held the lock `hold_sum` in all, `hold_max` the longest.
pub(super) fn holds(count: u64, wait: u64, hold_sum: u64, hold_max: u64) -> Stats {
    Stats::new(&SideStats {
        hold: hist(hold_sum, hold_max, count),
        ..side(count, wait)
    })
}

pub(super) fn thread(
    tid: u32,
    role: Role,
    causes: &[(&'static str, Stats)],
    read: Stats,
) -> ThreadReport {
    let mut write = SideStats::default();
    for (_, s) in causes {
        write.merge(&s.side());
    }
    ThreadReport {
        tid,
        role,
        comm: "node".into(),
        pid: matches!(role, Role::Foreign | Role::Profiler).then_some(99),
        role_addon: None,
        role_library: None,
        lock: LockReport {
            write: Stats::new(&write),
            read,
            downgrade: Stats::default(),
            causes: causes
                .iter()
                .map(|(c, s)| CauseReport {
                    cause: (*c).into(),
                    write: s.clone(),
                })
                .collect(),
        },
        blocked_by: None,
        time_share: None,
    }
}

/// A process of these threads, each alive `alive` ns, with its time share by role (the
/// profiler's threads in none, foreign takers in their role but not the process's).
pub(super) fn process(pid: u32, threads: Vec<ThreadReport>, alive: u64) -> ProcessReport {
    let mut roles: BTreeMap<Role, (u64, u64, u64)> = BTreeMap::new();
    let (mut write, mut read) = (SideStats::default(), SideStats::default());
    for t in threads.iter().filter(|t| t.role != Role::Profiler) {
        write.merge(&t.lock.write.side());
        read.merge(&t.lock.read.side());
        let e = roles.entry(t.role).or_default();
        e.0 += t.lock.write.wait_ns.sum + t.lock.read.wait_ns.sum;
        e.1 += alive;
        e.2 += 1;
    }
    let own = roles
        .iter()
        .filter(|(r, _)| **r != Role::Foreign)
        .fold((0, 0, 0), |a, (_, e)| (a.0 + e.0, a.1 + e.1, a.2 + e.2));
    ProcessReport {
        time_share: Some(share(own.0, own.1, own.2)),
        time_share_by_role: Some(
            roles
                .iter()
                .map(|(&role, e)| RoleShare {
                    role,
                    share: share(e.0, e.1, e.2),
                })
                .collect(),
        ),
        threads,
        lock: LockReport {
            write: Stats::new(&write),
            read: Stats::new(&read),
            ..LockReport::default()
        },
        ..crate::output::fixtures::process(pid, "node", 0, false)
    }
}

pub(super) fn summary(processes: Vec<ProcessReport>) -> Report {
    Report {
        duration_s: Some(4.0),
        ..crate::output::fixtures::summary(processes)
    }
}

pub(super) fn ids(findings: &[super::Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.id.as_str()).collect()
}

/// Whether the finding `id` is in `report`.
pub(super) fn finds(report: &Report, id: &str) -> bool {
    ids(&find(report, None)).contains(&id)
}

/// A thread that wrote for these causes and read once.
pub(super) fn writer(tid: u32, role: Role, causes: &[(&'static str, Stats)]) -> ThreadReport {
    thread(tid, role, causes, stats(1, 10))
}

/// Process `pid`, alive 4 s: its main thread, idle, and `others`.
pub(super) fn with_main(pid: u32, others: Vec<ThreadReport>) -> ProcessReport {
    let mut threads = vec![idle(pid, Role::Main)];
    threads.extend(others);
    process(pid, threads, 4 * S)
}

/// A thread that only read once.
pub(super) fn idle(tid: u32, role: Role) -> ThreadReport {
    writer(tid, role, &[])
}

fn workers_growing_arenas(mprotect_wait: u64) -> ProcessReport {
    let mut p = process(
        1,
        vec![
            thread(1, Role::Main, &[("brk", stats(10, 1000))], stats(5, 10)),
            thread(
                2,
                Role::Worker,
                &[("mprotect", stats(500, mprotect_wait))],
                stats(100, 1000),
            ),
            thread(
                3,
                Role::Worker,
                &[("mprotect", stats(500, mprotect_wait))],
                stats(100, 1000),
            ),
        ],
        4 * S,
    );
    p.lock.causes = Vec::new();
    p
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
    old.processes[0].time_share = None;
    old.processes[0].time_share_by_role = None;
    let f = find(&old, None);
    assert_eq!(
        (f[0].time_share, f[0].time_share_bound),
        (None, Some(0.075))
    );
    // Sampled stacks that say it is not malloc (V8 changing its code's protection).
    let mut jit = summary(vec![workers_growing_arenas(300_000_000)]);
    let flame = |stack: &str| {
        Some(vec![FlameStack {
            stack: stack.into(),
            count: 30,
        }])
    };
    jit.processes[0].flame = flame(
        "start;v8::internal::Isolate::Init (node);v8::base::OS::SetPermissions (node);mprotect (libc.so.6)",
    );
    assert!(!finds(&jit, "arena-growth"));
    // ... and stacks that confirm it, naming the code that called malloc.
    jit.processes[0].flame = flame(
        "start;node::NodeArrayBufferAllocator::Allocate(unsigned long) (node);malloc (libc.so.6);0x7f00 (libc.so.6);__mprotect (libc.so.6)",
    );
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
                Role::Main,
                &[("mmap", stats(30, 500_000))],
                stats(10, 500_000),
            ),
            idle(8, Role::Other),
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
    let mut threads: Vec<ThreadReport> = (11..22).map(|t| idle(t, Role::V8)).collect();
    threads.push(writer(10, Role::Libuv, &[("munmap", stats(10, S))]));
    let busy_role = process(9, threads, 40 * S);
    assert!(busy_role.time_share.as_ref().unwrap().wall < 0.01);
    assert!(!finds(&summary(vec![busy_role]), "not-your-bottleneck"));
}

/// Contention mode watched a process whose threads never waited: zero waits is a result, the
/// same verdict full mode gives, with what was watched; a moment's watch says nothing.
#[test]
fn contention_mode_says_not_your_bottleneck_when_nothing_waited() {
    let watched = |alive| {
        let mut p = process(7, vec![idle(7, Role::Main), idle(8, Role::Libuv)], alive);
        p.lock = LockReport::default();
        for t in &mut p.threads {
            t.lock = LockReport::default();
        }
        p
    };
    let contention = |p| Report {
        mode: crate::vocab::Mode::Contention,
        duration_s: Some(25.0),
        ..summary(vec![p])
    };
    let f = find(&contention(watched(25 * S)), None);
    assert_eq!(ids(&f), ["not-your-bottleneck"]);
    assert_eq!(
        f[0].title,
        "mmap_lock is not this process's bottleneck: its 2 threads watched in 25.0 s, no contended wait"
    );
    assert!(
        f[0].evidence.facts[0].starts_with(
            "watched 2 threads for 50.00s of their time alive in 25.0 s: 0 contended waits"
        ),
        "{:?}",
        f[0].evidence.facts
    );
    assert!(to_text(&f).contains("no contended wait"));
    // Under a second of the threads' time: nothing to say.
    assert!(find(&contention(watched(S / 4)), None).is_empty());
    // Full mode's verdict still rests on 20 writes.
    assert!(find(&summary(vec![watched(25 * S)]), None).is_empty());
}

#[test]
fn long_holds_name_the_call_and_the_holder_with_or_without_blockers() {
    let mut p = with_main(
        20,
        vec![
            writer(
                21,
                Role::Other,
                &[("fork", holds(40, 1000, 280_000_000, 9_000_000))],
            ),
            writer(22, Role::Worker, &[("mmap", stats(3000, 250_000_000))]),
        ],
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
    p.blockers = Some(vec![BlockerReport {
        tid: 21,
        pid: 20,
        role: Role::Other,
        comm: "node".into(),
        cause: "fork".into(),
        waits: 900,
        wait_ns: 200_000_000,
        write_wait_ns: 200_000_000,
    }]);
    let f = find(&summary(vec![p.clone()]), None);
    let l = f.iter().find(|f| f.id == "long-holds").unwrap();
    assert_eq!(l.wait_ns, 200_000_000);
    assert!(l.evidence.facts[1].contains("(900 waits) is charged to its holds"));
    // Short holds, however many, are not long holds.
    p.threads[1] = writer(
        21,
        Role::Other,
        &[("fork", holds(40_000, 1000, 280_000_000, 90_000))],
    );
    assert!(!finds(&summary(vec![p]), "long-holds"));
}

#[test]
fn an_addons_threads_and_file_are_named() {
    let mut p = with_main(
        30,
        vec![thread(
            31,
            Role::Addon,
            &[("mmap", stats(150, 1000)), ("munmap", stats(150, 1000))],
            stats(0, 0),
        )],
    );
    let dso = |dso: &str, write| DsoReport {
        dso: dso.into(),
        write,
    };
    p.dsos = Some(vec![
        dso(
            "/srv/app/node_modules/x/build/Release/churn.node",
            stats(400, 3000),
        ),
        dso("/usr/bin/node", stats(20, 100)),
    ]);
    let s = Report {
        stack_sample: Some(1),
        ..summary(vec![p])
    };
    let a = addon_finding(&s, "churn.node's threads map and unmap memory: 300 writes");
    assert_eq!(
        a.evidence.code,
        ["/srv/app/node_modules/x/build/Release/churn.node"]
    );
    assert_eq!(a.evidence.causes, ["mmap", "munmap"]);
}

/// The `addon-threads` finding of `s`, whose title starts with `title`.
fn addon_finding(s: &Report, title: &str) -> super::Finding {
    let a = find(s, None)
        .into_iter()
        .find(|f| f.id == "addon-threads")
        .expect("addon-threads");
    assert!(a.title.starts_with(title), "{}", a.title);
    a
}

/// Without sampled stacks, the addon is named by its threads' start routines, and a thread
/// that a library behind it started (libvips behind sharp) is said to be that library's.
#[test]
fn an_addons_threads_name_it_and_its_library_without_stacks() {
    let mut lib_thread = thread(
        32,
        Role::Addon,
        &[("mmap", stats(200, 1000)), ("munmap", stats(200, 1000))],
        stats(0, 0),
    );
    lib_thread.role_addon = Some("/app/node_modules/sharp/sharp.node".into());
    lib_thread.role_library = Some("/app/node_modules/sharp/lib/libvips-cpp.so.42".into());
    let p = with_main(30, vec![lib_thread]);
    let a = addon_finding(
        &summary(vec![p]),
        "sharp.node's threads map and unmap memory: 400 writes",
    );
    assert!(
        a.evidence.facts.iter().any(|f| f
            == "1 of them started in /app/node_modules/sharp/lib/libvips-cpp.so.42, a library sharp.node needs: 400 writes"),
        "{:?}",
        a.evidence.facts
    );
}

#[test]
fn fault_reads_v8_unmaps_and_the_profiler_itself() {
    let mut p = with_main(
        40,
        vec![
            thread(
                41,
                Role::Worker,
                &[("mprotect", stats(100, 100_000_000))],
                stats(5000, 50_000_000),
            ),
            writer(42, Role::V8, &[("munmap", stats(300, 60_000_000))]),
            // The profiler's own thread reading the process's maps: in no total, no share.
            thread(
                99,
                Role::Profiler,
                &[],
                holds(30, 1000, 20_000_000, 3_000_000),
            ),
        ],
    );
    p.profiler = Some(ProfilerShare {
        read: holds(30, 1000, 20_000_000, 3_000_000),
        write: Stats::default(),
        share: 0.005,
    });
    let role_block = |holder_role, cause: &'static str, ns| RoleBlock {
        waiter_role: Role::Worker,
        holder_role,
        cause: cause.into(),
        wait_ns: ns,
        write_wait_ns: ns,
    };
    p.blocked_by_role = Some(vec![
        role_block(Role::Worker, "read", 70_000_000),
        role_block(Role::V8, "downgrade", 10_000_000),
    ]);
    let f = find(&summary(vec![p.clone()]), None);
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
    // The profiler: its holds bound what it made the process wait (never charged to it).
    let ours = f.iter().find(|f| f.id == "profiler-presence").unwrap();
    assert_eq!(ours.wait_ns, 20_000_000);
    assert_eq!(ours.evidence.roles, ["profiler"]);
    assert!(
        ours.title.ends_with("30 read acquisitions"),
        "{}",
        ours.title
    );
    assert!(ours.evidence.facts[0].contains("0.5% of the lock's acquisitions"));
    // Its time is not the process's: the profiler's thread is in no share.
    let roles: Vec<Role> = p
        .time_share_by_role
        .iter()
        .flatten()
        .map(|r| r.role)
        .collect();
    assert!(!roles.contains(&Role::Profiler));
    // Info findings too say all they have in the text, as in the JSON and the page.
    let text = to_text(&f);
    assert!(text.contains("the profiler's own reads"), "{text}");
    assert!(text.contains("sample fewer stacks"), "{text}");
    // Without the profiler's part (a foreign thread named like it is another process).
    p.profiler = None;
    p.threads[3].role = Role::Foreign;
    assert!(!finds(&summary(vec![p]), "profiler-presence"));
}

#[test]
fn a_study_adds_the_measured_effect_of_the_advice() {
    let study = StudyEffects::from_study(&super::study::tests::study_line(serde_json::json!({
        "type": "study", "schema_version": 1, "runs": [],
        "machine": {"kernel": "6.18.0", "node": "v20.20.2", "cpus": 2},
        "ranking": [{"file_kib": 64.0, "scenario": "jemalloc", "throughput_ratio": 1.3, "writes_ratio": 0.3,
                     "throughput": {"mean": 1.3, "min": 1.2, "max": 1.4, "runs": 3},
                     "writes": {"mean": 0.3, "min": 0.25, "max": 0.35, "runs": 3}, "throughput_verdict": "changed"},
                    {"file_kib": 64.0, "scenario": "arena-1", "throughput_ratio": 1.24, "writes_ratio": 0.46}]})));
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
    // A finding that costs next to nothing says all it has too (one finding, one content:
    // the JSON's and the page's), and what the study the user gave measured of its advice.
    let mut info = f.clone();
    info[0].severity = Severity::Info;
    let text = to_text(&info);
    assert!(text.contains("change: "), "{text}");
    assert!(
        text.contains("measured here: arena-1 at 64 KiB: 1.24x throughput"),
        "{text}"
    );
}

/// Contention mode: the holder of the long writes may never have waited itself (it is only
/// among the blockers), and no hold is measured: the waits charged to it tell, and every
/// finding says what its numbers are.
#[test]
fn long_holds_in_contention_mode_come_from_the_waits_behind_the_holder() {
    let mut p = with_main(
        30,
        vec![writer(
            32,
            Role::Worker,
            &[("mmap", stats(300, 250_000_000))],
        )],
    );
    let holder = |waits, wait_ns| BlockerReport {
        tid: 31,
        pid: 30,
        role: Role::Worker,
        comm: "node".into(),
        cause: "mprotect".into(),
        waits,
        wait_ns,
        write_wait_ns: wait_ns,
    };
    p.blockers = Some(vec![holder(100, 200_000_000)]);
    let mut s = summary(vec![p.clone()]);
    s.mode = crate::vocab::Mode::Contention;
    s.drop_unmeasured();
    let f = find(&s, None);
    let l = f.iter().find(|f| f.id == "long-holds").expect("long-holds");
    assert!(
        l.title.starts_with(
            "thread 31 (node, worker) holds mmap_lock for write in mprotect: each contended wait behind it lasted 2.00ms on average"
        ),
        "{}",
        l.title
    );
    assert_eq!(l.evidence.threads[0].cause, "mprotect");
    assert!(l.evidence.facts[0].starts_with("contention mode measures no hold"));
    assert!(
        f.iter()
            .all(|f| f.evidence.facts.iter().any(|x| x == super::CONTENTION_FACT)),
        "{f:?}"
    );
    // Short waits behind it: no long holds. In full mode, a holder that is not among the
    // threads (no hold of its own measured) is no finding either.
    p.blockers = Some(vec![holder(100_000, 200_000_000)]);
    s.processes = vec![p.clone()];
    assert!(!finds(&s, "long-holds"));
    p.blockers = Some(vec![holder(100, 200_000_000)]);
    assert!(!finds(&summary(vec![p]), "long-holds"));
}

/// Contention mode with holder stacks: the long-holds finding names the JavaScript function
/// the writers of its cause were running when the most wait began behind them (another
/// cause's function is not its).
#[test]
fn long_holds_cite_the_holders_javascript_function() {
    let mut p = with_main(
        30,
        vec![writer(
            32,
            Role::Worker,
            &[("mmap", stats(300, 250_000_000))],
        )],
    );
    p.blockers = Some(vec![BlockerReport {
        tid: 31,
        pid: 30,
        role: Role::Worker,
        comm: "node".into(),
        cause: "mprotect".into(),
        waits: 100,
        wait_ns: 200_000_000,
        write_wait_ns: 200_000_000,
    }]);
    let function = |name: &str, cause: &'static str, wait_ns_sum| HolderFunctionReport {
        function: name.into(),
        file: "/srv/app.js:10:3".into(),
        cause: cause.into(),
        waits: 40,
        wait_ns_sum,
    };
    p.holder_functions = Some(vec![
        function("allocate", "mmap", 900_000_000),
        function("shrinkBuffer", "mprotect", 150_000_000),
        function("compress", "mprotect", 20_000_000),
    ]);
    let mut s = summary(vec![p]);
    s.mode = crate::vocab::Mode::Contention;
    s.drop_unmeasured();
    let f = find(&s, None);
    let l = f.iter().find(|f| f.id == "long-holds").expect("long-holds");
    assert!(l.title.ends_with("(running shrinkBuffer)"), "{}", l.title);
    assert!(
        (l.evidence.facts.iter()).any(|x| x.starts_with(
            "the writers holding it for mprotect were running shrinkBuffer (/srv/app.js:10:3) when 40 of the sampled waits began behind them"
        )),
        "{:?}",
        l.evidence.facts
    );
}
