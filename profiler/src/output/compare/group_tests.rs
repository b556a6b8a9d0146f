//! Grouping (`--by`) on synthetic runs: exact sums, and a renamed parent with Workers set
//! against a parent with child processes (every one of them running node's executable).

use super::{RUN, *};
use crate::{
    aggregation::{DurationHist, SideStats},
    output::{
        compare::{Comparison, Row, compare, tests::runs_by, text::to_text},
        compare_findings, fixtures,
        reading::Line,
        report::{CauseReport, Stats},
    },
    registry::roles::Role,
};

/// `n` durations of `each` ns.
fn waits(n: u64, each: u64) -> SideStats {
    SideStats {
        count: n,
        failed: 0,
        wait: DurationHist::from_upper_bounds(n * each, each, [(bucket(each), n)]),
        hold: DurationHist::default(),
    }
}

/// The upper bound of the log2 bucket of a duration (`upper/2 <= d < upper`).
fn bucket(ns: u64) -> u64 {
    (ns + 1).next_power_of_two()
}

/// A process whose threads (role, writes, each write's wait in ns) made its writes: its
/// figures their sums, its causes `mmap` (the main thread's) and `mprotect` (the others'),
/// its threads' wait 0.1% of their time.
pub(super) fn node(
    pid: u32,
    comm: &str,
    cgroup: Option<&str>,
    threads: &[(Role, u64, u64)],
) -> ProcessReport {
    let (mut all, mut mmap, mut mprotect) = Default::default();
    let mut list = Vec::new();
    for (i, &(role, n, each)) in threads.iter().enumerate() {
        let s = waits(n, each);
        SideStats::merge(&mut all, &s);
        SideStats::merge(
            if role == Role::Main {
                &mut mmap
            } else {
                &mut mprotect
            },
            &s,
        );
        let mut t = fixtures::process(pid, comm, 0, false).threads.remove(0);
        (t.tid, t.role, t.lock.write) = (pid + i as u32, role, Stats::new(&s));
        list.push(t);
    }
    let mut p = fixtures::process(pid, comm, 0, false);
    p.cgroup = cgroup.map(String::from);
    p.lock.write = Stats::new(&all);
    p.lock.causes = [("mmap", mmap), ("mprotect", mprotect)]
        .into_iter()
        .filter(|(_, s)| s.count > 0)
        .map(|(c, s)| CauseReport {
            cause: c.into(),
            write: Stats::new(&s),
        })
        .collect();
    // A small share of a long time: "not your bottleneck", a finding of every process.
    p.time_share = Some(fixtures::time_share(
        all.wait.sum,
        1000 * all.wait.sum,
        threads.len() as u64,
    ));
    p.threads = list;
    p
}

pub(super) fn row<'a>(c: &'a Comparison, group: &str, kind: &str, key: &str) -> &'a Row {
    c.rows
        .iter()
        .find(|r| r.process == group && r.group == kind && r.key == key)
        .unwrap_or_else(|| panic!("no row {group} {kind} {key}"))
}

/// (writes, total wait) of a row, before and after.
pub(super) fn sums(r: &Row) -> [(f64, f64); 2] {
    [
        (r.writes.before.mean, r.wait_ns.before.mean),
        (r.writes.after.mean, r.wait_ns.after.mean),
    ]
}

/// The executable of every process of [`threads_and_forks`].
pub(super) const NODE: &str = "/usr/bin/node";

/// Test-runner shaped: one process renamed `runner` with three Workers, against a `node`
/// parent and three `node` children doing the same work on their main threads.
pub(super) fn threads_and_forks() -> (Report, Report) {
    let (mut threads, mut forks) = threads_and_forks_without_exes();
    for p in threads.processes.iter_mut().chain(&mut forks.processes) {
        p.exe = Some(NODE.into());
    }
    (threads, forks)
}

/// [`threads_and_forks`] as a build before executables were reported wrote them.
fn threads_and_forks_without_exes() -> (Report, Report) {
    let threads = fixtures::summary(vec![node(
        100,
        "runner",
        Some("/user.slice/a.scope"),
        &[
            (Role::Main, 50, 600),
            (Role::V8, 10, 100),
            (Role::Worker, 1000, 3000),
            (Role::Worker, 1200, 3000),
            (Role::Worker, 900, 20_000),
        ],
    )]);
    let mut forks = vec![node(
        200,
        "node",
        Some("/user.slice/a.scope"),
        &[(Role::Main, 60, 600), (Role::V8, 5, 100)],
    )];
    for (pid, n, each) in [(201, 1000, 2000), (202, 1100, 2000), (203, 950, 40_000)] {
        forks.push(node(
            pid,
            "node",
            Some("/user.slice/b.scope"),
            &[(Role::Main, n, each)],
        ));
    }
    (threads, fixtures::summary(forks))
}

pub(super) fn compare_by(by: By, b: &Report, a: &Report) -> Comparison {
    compare(
        ("threads.json", &runs_by(by, [Line::Summary(b.clone())])),
        ("forks.json", &runs_by(by, [Line::Summary(a.clone())])),
        None,
    )
    .unwrap()
}

#[test]
fn by_name_a_renamed_parent_and_its_children_never_meet_by_run_they_line_up() {
    let (threads, forks) = threads_and_forks();
    // By name, as before --by: `runner` against `node`, nothing on both sides.
    let c = compare_by(By::Comm, &threads, &forks);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["node", "runner"]);
    assert_eq!(sums(row(&c, "runner", "all", "all"))[1], (0.0, 0.0));
    assert_eq!(sums(row(&c, "node", "all", "all"))[0], (0.0, 0.0));
    // By run: one group, each side's every process in it.
    let c = compare_by(By::Run, &threads, &forks);
    assert_eq!(c.by, By::Run);
    assert_eq!(c.groups.len(), 1);
    let g = &c.groups[0];
    assert_eq!(g.name, RUN);
    assert_eq!(
        (g.before.processes.mean, g.after.processes.mean),
        (1.0, 4.0)
    );
    assert_eq!(
        (g.before.comms.as_slice(), g.after.comms.as_slice()),
        (&["runner".to_string()][..], &["node".to_string()][..])
    );
    // Exact sums, worked out by hand from the threads above.
    let before_wait = 50 * 600 + 10 * 100 + 2200 * 3000 + 900 * 20_000;
    let after_wait = 60 * 600 + 5 * 100 + 2100 * 2000 + 950 * 40_000;
    assert_eq!(
        sums(row(&c, RUN, "all", "all")),
        [(3160.0, before_wait as f64), (3115.0, after_wait as f64)]
    );
    // The Workers' writes on one side, the children's main threads' on the other.
    assert_eq!(
        sums(row(&c, RUN, "role", "worker")),
        [(3100.0, (2200 * 3000 + 900 * 20_000) as f64), (0.0, 0.0)]
    );
    assert_eq!(
        sums(row(&c, RUN, "role", "main")),
        [
            (50.0, 30_000.0),
            (3110.0, (60 * 600 + 2100 * 2000 + 950 * 40_000) as f64)
        ]
    );
    assert_eq!(
        sums(row(&c, RUN, "role", "v8")),
        [(10.0, 1000.0), (5.0, 500.0)]
    );
    assert_eq!(
        sums(row(&c, RUN, "cause", "mprotect"))[0],
        (3110.0, (1000 + 2200 * 3000 + 900 * 20_000) as f64)
    );
    assert_eq!(
        sums(row(&c, RUN, "cause", "mmap"))[1],
        (3110.0, (60 * 600 + 2100 * 2000 + 950 * 40_000) as f64)
    );
    // The p99 of the merged histograms: after, 950 of 3115 waits at 40 us.
    let merged = DurationHist::from_upper_bounds(
        after_wait,
        40_000,
        [(1024, 60), (128, 5), (2048, 2100), (65_536, 950)],
    );
    assert_eq!(
        row(&c, RUN, "all", "all").p99_wait_ns.after.mean,
        merged.quantiles([0.99])[0] as f64
    );
    let text = to_text(&c);
    assert!(text.contains("grouped by run (--by run)"), "{text}");
    assert!(
        text.contains("1 process (runner) -> 4 processes (node)"),
        "{text}"
    );
    assert!(text.contains("run / role / cause"), "{text}");
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["by"], "run");
    assert_eq!(json["groups"][0]["after"]["processes"]["mean"], 4.0);
    assert_eq!(json["groups"][0]["before"]["comms"][0], "runner");
}

#[test]
fn by_cgroup_groups_and_a_process_without_one_is_apart() {
    let (threads, mut forks) = threads_and_forks();
    forks.processes[3].cgroup = None;
    let c = compare_by(By::Cgroup, &threads, &forks);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "(cgroup unknown)",
            "/user.slice/a.scope",
            "/user.slice/b.scope"
        ]
    );
    // The renamed parent alone before; the `node` parent after.
    let threads_wait = 50 * 600 + 10 * 100 + 2200 * 3000 + 900 * 20_000;
    assert_eq!(
        sums(row(&c, "/user.slice/a.scope", "all", "all")),
        [(3160.0, threads_wait as f64), (65.0, 36_500.0)]
    );
    assert_eq!(
        sums(row(&c, "/user.slice/b.scope", "all", "all"))[1],
        (2100.0, 4_200_000.0)
    );
    assert_eq!(
        sums(row(&c, "(cgroup unknown)", "all", "all"))[1],
        (950.0, 38_000_000.0)
    );
    let b = &c.groups[2];
    assert_eq!(
        (b.before.processes.mean, b.after.processes.mean),
        (0.0, 2.0)
    );
}

#[test]
fn by_exe_a_renamed_parent_and_its_children_are_one_executable() {
    let (threads, forks) = threads_and_forks();
    let c = compare_by(By::Exe, &threads, &forks);
    assert_eq!(c.by, By::Exe);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, [NODE]);
    let g = &c.groups[0];
    assert_eq!(
        (g.before.processes.mean, g.after.processes.mean),
        (1.0, 4.0)
    );
    assert_eq!(
        (g.before.comms.as_slice(), g.after.comms.as_slice()),
        (&["runner".to_string()][..], &["node".to_string()][..])
    );
    // Every process is node: every row is the run's, under the executable's name.
    let run = compare_by(By::Run, &threads, &forks);
    assert_eq!(c.rows.len(), run.rows.len());
    for r in &run.rows {
        let mine = row(&c, NODE, r.group, &r.key);
        assert_eq!(
            (&mine.writes, &mine.wait_ns, &mine.p99_wait_ns),
            (&r.writes, &r.wait_ns, &r.p99_wait_ns)
        );
    }
    let text = to_text(&c);
    assert!(
        text.contains("grouped by executable (--by exe), processes before -> after:"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "    {NODE:<28} 1 process (runner) -> 4 processes (node)\n"
        )),
        "{text}"
    );
    assert!(text.contains("exe / role / cause"), "{text}");
    assert_eq!(serde_json::to_value(&c).unwrap()["by"], "exe");
}

#[test]
fn by_exe_a_process_without_one_is_apart_and_a_long_path_keeps_its_end() {
    let (mut threads, mut forks) = threads_and_forks();
    forks.processes[3].exe = None;
    let nvm = "/root/.nvm/versions/node/v22.11.0/bin/node";
    threads.processes[0].exe = Some(nvm.into());
    let c = compare_by(By::Exe, &threads, &forks);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["(executable unknown)", nvm, NODE]);
    // The child without one alone; the renamed parent under its own node; the parent and
    // two children under the other.
    assert_eq!(
        sums(row(&c, "(executable unknown)", "all", "all")),
        [(0.0, 0.0), (950.0, 38_000_000.0)]
    );
    let threads_wait = 50 * 600 + 10 * 100 + 2200 * 3000 + 900 * 20_000;
    assert_eq!(
        sums(row(&c, nvm, "all", "all")),
        [(3160.0, threads_wait as f64), (0.0, 0.0)]
    );
    assert_eq!(
        sums(row(&c, NODE, "all", "all"))[1],
        (2165.0, (60 * 600 + 5 * 100 + 2100 * 2000) as f64)
    );
    let text = to_text(&c);
    assert!(
        text.contains("\n    …ions/node/v22.11.0/bin/node 1 process (runner) -> 0 processes\n"),
        "{text}"
    );
    assert!(text.contains("\n  …ions/node/v22.11.0/bin/node "), "{text}");
}

#[test]
fn a_grouping_a_file_does_not_record_is_refused() {
    let (mut threads, forks) = threads_and_forks();
    threads.processes[0].cgroup = None;
    let run = |by| runs_by(by, [Line::Summary(threads.clone())]);
    let other = |by| runs_by(by, [Line::Summary(forks.clone())]);
    let e = compare(
        ("threads.json", &run(By::Cgroup)),
        ("forks.json", &other(By::Cgroup)),
        None,
    )
    .expect_err("refused")
    .to_string();
    assert!(
        e.starts_with("--by cgroup: threads.json records no process's cgroup ("),
        "{e}"
    );
    assert!(e.ends_with("; group by comm or run"), "{e}");
    // A build before executables were reported: refused whichever side it is.
    let (old, _) = threads_and_forks_without_exes();
    let old = runs_by(By::Exe, [Line::Summary(old)]);
    for (before, after, file) in [
        (&old, &other(By::Exe), "a.json"),
        (&other(By::Exe), &old, "b.json"),
    ] {
        let e = compare(("a.json", before), ("b.json", after), None)
            .expect_err("refused")
            .to_string();
        assert_eq!(
            e,
            format!(
                "--by exe: {file} records no process's executable (a build before executables were reported, or a run that could not read them); group by comm or run"
            )
        );
    }
}

#[test]
fn findings_are_followed_by_group() {
    let (threads, forks) = threads_and_forks();
    for (by, group) in [(By::Run, RUN), (By::Comm, "runner")] {
        let c = compare_by(by, &threads, &forks);
        let found = compare_findings::per_run(&threads, &|f| f.comm.clone());
        assert!(!found.is_empty(), "the fixture has findings");
        for (_, id) in found.keys() {
            assert!(
                c.findings
                    .iter()
                    .any(|f| &f.id == id && f.process == group && f.before.present == 1),
                "{id} in {group}: {:?}",
                c.findings
            );
        }
    }
}
