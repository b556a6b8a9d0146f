//! A summary's grouped processes (`minor_processes`) in `compare`: by run, every figure is
//! what it would be with each process listed; by command, each joins its command's group;
//! by executable, each joins its executable's group (an earlier build's, not kept by
//! executable, is a group of their own); by cgroup, they are a group of their own; an earlier
//! build's group, without histograms, is counted and said.

use super::{
    RUN,
    tests::{NODE, compare_by, node, row, sums, threads_and_forks},
    *,
};
use crate::{
    output::{
        compare::{Comparison, compare, tests::runs_by, text::to_text},
        reading::Line,
        report,
    },
    registry::roles::Role,
};

/// The NOT KEPT group of `--by cgroup`.
const NOT_KEPT: &str = "(grouped: cgroup not kept)";

/// The executable of the short `sh` children.
const SH: &str = "/bin/sh";

/// The forks run with 20 more short children (`node` and `sh`, their waits in buckets of
/// their own), every process listed; and the same run as a summary groups it: the parent
/// and its three children listed, the 20 grouped.
fn forks_with_short_children() -> (Report, Report) {
    let (_, mut forks) = threads_and_forks();
    for i in 0..20u32 {
        let comm = if i % 2 == 0 { "node" } else { "sh" };
        let mut threads = vec![(Role::Main, 3 + u64::from(i), 500 << (i % 6))];
        if i % 4 == 0 {
            threads.push((Role::V8, 2, 100));
        }
        let mut p = node(300 + i, comm, Some("/user.slice/c.scope"), &threads);
        p.exe = Some(if i % 2 == 0 { NODE } else { SH }.into());
        forks.processes.push(p);
    }
    let mut grouped = forks.clone();
    report::group(&mut grouped, |p| p.pid < 300);
    assert_eq!(grouped.processes.len(), 4);
    assert_eq!(
        grouped.minor_processes.as_ref().unwrap().totals.processes,
        20
    );
    (forks, grouped)
}

/// (group, kind, key) -> every figure's means, before and after.
fn figures(c: &Comparison) -> BTreeMap<Key, [f64; 8]> {
    c.rows
        .iter()
        .map(|r| {
            let f = r.figures().map(|(c, _)| [c.before.mean, c.after.mean]);
            (
                (r.process.clone(), r.group, r.key.clone()),
                f.concat().try_into().unwrap(),
            )
        })
        .collect()
}

#[test]
fn by_run_grouped_processes_count_as_if_each_were_listed() {
    let (threads, _) = threads_and_forks();
    let (listed, grouped) = forks_with_short_children();
    let all = compare_by(By::Run, &threads, &listed);
    let c = compare_by(By::Run, &threads, &grouped);
    // Every row, its writes, wait, mean and p99 (the histograms merged) alike.
    assert_eq!(figures(&c), figures(&all));
    assert_eq!(c.groups, all.groups);
    assert_eq!(c.groups[0].after.processes.mean, 24.0);
    assert_eq!(c.groups[0].after.comms, ["node", "sh"]);
    // By hand: the parent and its children (3115 writes), and 20 children of 3..=22
    // main-thread writes and, one in four, 2 V8 writes.
    let writes = 3115 + (3..=22).sum::<u64>() + 5 * 2;
    assert_eq!(sums(row(&c, RUN, "all", "all"))[1].0, writes as f64);
    assert_eq!(sums(row(&c, RUN, "role", "v8"))[1].0, (5 + 5 * 2) as f64);
    assert!(c.notes.is_empty(), "{:?}", c.notes);
}

#[test]
fn by_comm_grouped_processes_join_their_commands_group() {
    let (threads, _) = threads_and_forks();
    let (listed, grouped) = forks_with_short_children();
    let all = compare_by(By::Comm, &threads, &listed);
    let c = compare_by(By::Comm, &threads, &grouped);
    assert_eq!(c.groups, all.groups);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["node", "runner", "sh"]);
    // 4 listed `node` and 10 grouped; 10 grouped `sh`.
    assert_eq!(c.groups[0].after.processes.mean, 14.0);
    assert_eq!(c.groups[2].after.processes.mean, 10.0);
    // Each command's `all` row exactly as if its processes were listed.
    let alls = |c: &Comparison| {
        figures(c)
            .into_iter()
            .filter(|(k, _)| k.1 == "all")
            .collect::<Vec<_>>()
    };
    assert_eq!(alls(&c), alls(&all));
    // Its role rows are its listed processes' only: `sh` has none, and it is said.
    assert!(c.rows.iter().all(|r| r.process != "sh" || r.group == "all"));
    assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
    assert!(
        c.notes[0].starts_with("forks.json: its grouped processes (minor_processes) are in their command's processes and `all` row, not in its role and cause rows"),
        "{:?}",
        c.notes
    );
    let text = to_text(&c);
    assert!(text.contains("\n  note: forks.json: its grouped"), "{text}");
}

#[test]
fn by_exe_grouped_processes_join_their_executables_group() {
    let (threads, _) = threads_and_forks();
    let (listed, grouped) = forks_with_short_children();
    let all = compare_by(By::Exe, &threads, &listed);
    let c = compare_by(By::Exe, &threads, &grouped);
    assert_eq!(c.groups, all.groups);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, [SH, NODE]);
    // 4 listed node processes and 10 grouped, with the renamed parent's name before; 10 sh.
    assert_eq!(c.groups[1].after.processes.mean, 14.0);
    assert_eq!(c.groups[1].before.comms, ["runner"]);
    assert_eq!(c.groups[0].after.processes.mean, 10.0);
    assert_eq!(c.groups[0].after.comms, ["sh"]);
    // Each executable's `all` row exactly as if its processes were listed.
    let alls = |c: &Comparison| {
        figures(c)
            .into_iter()
            .filter(|(k, _)| k.1 == "all")
            .collect::<Vec<_>>()
    };
    assert_eq!(alls(&c), alls(&all));
    // Its role rows are its listed processes' only, and it is said.
    assert!(c.rows.iter().all(|r| r.process != SH || r.group == "all"));
    assert_eq!(
        c.notes,
        [
            "forks.json: its grouped processes (minor_processes) are in their executable's processes and `all` row, not in its role and cause rows (a summary keeps their roles and causes for the run, not per executable: --by run has them)"
        ]
    );
}

#[test]
fn by_exe_an_earlier_builds_grouped_processes_are_a_group_of_their_own() {
    let (threads, _) = threads_and_forks();
    let (listed, mut grouped) = forks_with_short_children();
    grouped.minor_processes.as_mut().unwrap().by_exe.clear();
    let c = compare_by(By::Exe, &threads, &grouped);
    let not_kept = "(grouped: executable not kept)";
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, [not_kept, NODE]);
    assert_eq!(c.groups[0].after.processes.mean, 20.0);
    assert_eq!(c.groups[0].after.comms, ["node", "sh"]);
    // Its rows, all and by role and cause, are the 20's, as listed they would be by run.
    let only_short = |r: &Report| {
        let mut r = r.clone();
        r.processes.retain(|p| p.pid >= 300);
        r
    };
    let short = compare_by(By::Run, &threads, &only_short(&listed));
    let theirs: Vec<&crate::output::compare::Row> =
        short.rows.iter().filter(|r| sums(r)[1].0 > 0.0).collect();
    let ours = c.rows.iter().filter(|r| r.process == not_kept).count();
    assert_eq!(ours, theirs.len());
    for r in theirs {
        assert_eq!(
            sums(row(&c, not_kept, r.group, &r.key))[1],
            sums(r)[1],
            "{} {}",
            r.group,
            r.key
        );
    }
    assert_eq!(
        c.notes,
        [format!(
            "forks.json: its grouped processes (minor_processes) are the group {not_kept}: a summary of a build before executables were reported groups them by command only"
        )]
    );
}

#[test]
fn by_cgroup_grouped_processes_are_a_group_of_their_own() {
    let (threads, _) = threads_and_forks();
    let (listed, grouped) = forks_with_short_children();
    let c = compare_by(By::Cgroup, &threads, &grouped);
    let names: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        names,
        [NOT_KEPT, "/user.slice/a.scope", "/user.slice/b.scope"]
    );
    assert_eq!(c.groups[0].after.processes.mean, 20.0);
    // Its rows: the sums over the 20 grouped processes, all and by role and cause; the
    // listed processes' groups as before.
    let all = compare_by(By::Cgroup, &threads, &listed);
    let ours = figures(&c);
    for ((group, kind, key), f) in figures(&all) {
        let group = if group == "/user.slice/c.scope" {
            NOT_KEPT.to_string()
        } else {
            group
        };
        assert_eq!(ours[&(group, kind, key)], f);
    }
    assert_eq!(ours.len(), figures(&all).len());
    assert_eq!(
        c.notes,
        [format!(
            "forks.json: its grouped processes (minor_processes) are the group {NOT_KEPT}: a summary groups them by command only"
        )]
    );
    // Listed processes without a cgroup are still refused, whatever it grouped.
    let mut none = grouped.clone();
    none.processes.iter_mut().for_each(|p| p.cgroup = None);
    let e = compare(
        ("a.json", &runs_by(By::Cgroup, [Line::Summary(none)])),
        ("b.json", &runs_by(By::Cgroup, [Line::Summary(threads)])),
        None,
    )
    .expect_err("refused");
    assert!(
        e.to_string().starts_with("--by cgroup: a.json records no"),
        "{e}"
    );
}

#[test]
fn an_earlier_builds_group_is_counted_without_histograms_and_said() {
    let (threads, _) = threads_and_forks();
    let (listed, mut grouped) = forks_with_short_children();
    // As the build before the group kept its STATS wrote it (read back: empty STATS).
    let m = grouped.minor_processes.as_mut().unwrap();
    m.totals.write = Stats::default();
    m.by_comm
        .iter_mut()
        .for_each(|c| c.totals.write = Stats::default());
    (m.roles, m.causes) = (Vec::new(), Vec::new());
    let all = compare_by(By::Run, &threads, &listed);
    let c = compare_by(By::Run, &threads, &grouped);
    let run = |c: &Comparison| sums(row(c, RUN, "all", "all"));
    assert_eq!(run(&c), run(&all), "writes and wait exact");
    assert_eq!(
        row(&c, RUN, "all", "all").mean_wait_ns.after.mean,
        row(&all, RUN, "all", "all").mean_wait_ns.after.mean
    );
    assert_eq!(
        c.notes,
        [
            "forks.json: 20 grouped processes (minor_processes) come without their histograms (a summary of an earlier build): their writes and wait are counted, not in the p99s nor in the role and cause rows"
        ]
    );
}
