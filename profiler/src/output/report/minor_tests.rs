//! The group of processes a summary does not list: exact totals, per command, executable,
//! role and cause.

use super::*;
use crate::output::fixtures::{process, stats, summary};

/// The STATS of `f` of each process merged, computed apart from `group`.
fn merge_of<'a>(ps: impl IntoIterator<Item = &'a Stats>) -> SideStats {
    ps.into_iter().fold(SideStats::default(), |mut m, s| {
        m.merge(&s.side());
        m
    })
}

/// What `compare` reads of a STATS: count, wait sum and max, buckets, p99; and no hold.
fn waits(s: &Stats) -> (u64, u64, u64, Vec<(u64, u64)>, u64, bool) {
    let d = &s.wait_ns;
    (
        s.count,
        d.sum,
        d.max,
        d.buckets.clone(),
        d.p99,
        s.hold_ns.is_some(),
    )
}

fn expect(m: &SideStats) -> (u64, u64, u64, Vec<(u64, u64)>, u64, bool) {
    let d = crate::output::report::Dist::new(&m.wait, m.count);
    (m.count, d.sum, d.max, d.buckets, d.p99, false)
}

#[test]
fn the_group_keeps_its_writes_merged_per_command_role_and_cause() {
    // Waits in buckets that differ per process, so that the buckets and the p99 depend
    // on which processes were merged.
    let all: Vec<ProcessReport> = (1..=60u32)
        .map(|pid| {
            let comm = ["sh", "node"][pid as usize % 2];
            let slow = 1u64 << (10 + pid % 8);
            let mut p = process(pid, comm, 100 * u64::from(pid), false);
            p.lock.write = stats(10, 5 * 600 + 5 * slow, slow, &[(1024, 5), (2 * slow, 5)]);
            p.threads[1].lock.write = stats(5, 5 * slow, slow, &[(2 * slow, 5)]);
            p
        })
        .collect();
    let mut r = summary(all.clone());
    group(&mut r, |p| p.pid <= 5);
    let grouped: Vec<&ProcessReport> = all.iter().filter(|p| p.pid > 5).collect();
    let m = r.minor_processes.clone().unwrap();
    let whole = merge_of(grouped.iter().map(|p| &p.lock.write));
    assert_eq!(waits(&m.totals.write), expect(&whole));
    assert_eq!(m.totals.write.count, m.totals.writes);
    assert_eq!(m.totals.write.wait_ns.sum, m.totals.write_wait_ns);
    for c in &m.by_comm {
        let of = merge_of(
            grouped
                .iter()
                .filter(|p| p.comm == c.comm)
                .map(|p| &p.lock.write),
        );
        assert_eq!(waits(&c.totals.write), expect(&of), "{}", c.comm);
    }
    // By role (main and worker, in the fixture) and by cause, for the group.
    let roles: Vec<Role> = m.roles.iter().map(|r| r.role).collect();
    assert_eq!(roles, [Role::Main, Role::Worker]);
    for mr in &m.roles {
        let of = merge_of(
            grouped
                .iter()
                .flat_map(|p| &p.threads)
                .filter(|t| t.role == mr.role)
                .map(|t| &t.lock.write),
        );
        assert_eq!(waits(&mr.write), expect(&of), "{:?}", mr.role);
    }
    let causes: Vec<&str> = m.causes.iter().map(|c| c.cause.as_str()).collect();
    assert_eq!(causes, ["mprotect", "munmap"]);
    for mc in &m.causes {
        let of = merge_of(
            grouped
                .iter()
                .flat_map(|p| &p.lock.causes)
                .filter(|c| c.cause == mc.cause)
                .map(|c| &c.write),
        );
        assert_eq!(waits(&mc.write), expect(&of), "{}", mc.cause);
    }
    // Grouped in two steps (a file read back and grouped again), the same.
    let mut twice = summary(all);
    group(&mut twice, |p| p.pid <= 30);
    group(&mut twice, |p| p.pid <= 5);
    assert_eq!(twice.minor_processes, r.minor_processes);
    // The JSON: STATS without holds, read back the same.
    let line = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&line).unwrap();
    assert_eq!(back.minor_processes, r.minor_processes);
    let json: serde_json::Value = serde_json::from_str(&line).unwrap();
    let mp = &json["minor_processes"];
    assert!(mp["write"]["wait_ns"]["buckets"].is_array(), "{mp}");
    assert!(mp["write"].get("hold_ns").is_none(), "{mp}");
    assert_eq!(mp["roles"][1]["role"], "worker");
    assert_eq!(mp["causes"][0]["cause"], "mprotect");
    assert!(mp["by_comm"][0]["write"]["count"].is_u64(), "{mp}");
}

#[test]
fn grouped_processes_keep_their_exact_totals_by_command() {
    let mut r = summary(
        (0..1000)
            .map(|i| {
                let comm = ["sh", "esbuild", "node"][i % 3];
                process(i as u32 + 1, comm, 1000 + i as u64, i % 2 == 0)
            })
            .collect(),
    );
    let total = |r: &Report| {
        let p = r.processes.iter().fold(MinorTotals::default(), |mut t, p| {
            t.add(p);
            t
        });
        let m = r.minor_processes.clone().unwrap_or_default().totals;
        (
            p.processes + m.processes,
            p.writes + m.writes,
            p.reads + m.reads,
            p.wait_ns + m.wait_ns,
            p.write_wait_ns + m.write_wait_ns,
        )
    };
    let before = total(&r);
    group(&mut r, |p| p.pid <= 7);
    assert_eq!(total(&r), before, "listed and grouped add up to the run");
    assert_eq!(r.processes.len(), 7);
    let m = r.minor_processes.as_ref().unwrap();
    assert_eq!(m.totals.processes, 993);
    // By command: their sums are the group's, most processes first.
    let sum = |f: fn(&MinorTotals) -> u64| m.by_comm.iter().map(|c| f(&c.totals)).sum::<u64>();
    assert_eq!(sum(|t| t.processes), 993);
    assert_eq!(sum(|t| t.writes), m.totals.writes);
    assert_eq!(sum(|t| t.wait_ns), m.totals.wait_ns);
    assert_eq!(sum(|t| t.reads), m.totals.reads);
    let comms: Vec<&str> = m.by_comm.iter().map(|c| c.comm.as_str()).collect();
    assert_eq!(
        comms,
        ["esbuild", "node", "sh"],
        "331 each, as many writes: by name"
    );
    assert_eq!(m.comms_text(2), "esbuild, node, 1 more");
    // The fixture's processes: 10 writes, 2 threads, the wait given plus 10 ns of reads.
    assert_eq!((m.max_writes, m.threads), (10, 993 * 2));
    assert_eq!(m.max_wait_ns, 1999 + 10);
    // Grouping again (a file read back) adds to what is there.
    group(&mut r, |p| p.pid <= 3);
    assert_eq!(total(&r), before);
    assert_eq!(r.minor_processes.as_ref().unwrap().totals.processes, 997);
    // Read back from its JSON, the same.
    let line = serde_json::to_string(&r).unwrap();
    assert!(
        line.contains(r#""minor_processes":{"processes":997,"#),
        "{line}"
    );
    let back: Report = serde_json::from_str(&line).unwrap();
    assert_eq!(back.minor_processes, r.minor_processes);
    // Nothing to group: no group.
    let mut few = summary(vec![process(1, "node", 5, false)]);
    group(&mut few, |_| true);
    assert!(few.minor_processes.is_none());
    assert!(
        !serde_json::to_string(&few)
            .unwrap()
            .contains("minor_processes")
    );
}

#[test]
fn grouped_processes_keep_their_exact_totals_by_executable() {
    // 60 processes: `node` and its renamed processes (`runner`) of one executable, `sh`, and
    // some whose executable was not read.
    let all: Vec<ProcessReport> = (1..=60u32)
        .map(|pid| {
            let (comm, exe) = match pid % 4 {
                0 => ("node", Some("/usr/bin/node")),
                1 => ("runner", Some("/usr/bin/node")),
                2 => ("sh", Some("/bin/sh")),
                _ => ("sh", None),
            };
            let mut p = process(pid, comm, 100 * u64::from(pid), false);
            p.exe = exe.map(String::from);
            p.lock.write = stats(u64::from(pid), 700 * u64::from(pid), 700, &[(1024, 1)]);
            p
        })
        .collect();
    let mut r = summary(all.clone());
    group(&mut r, |p| p.pid <= 4);
    let m = r.minor_processes.clone().unwrap();
    assert!(m.exes_complete());
    let grouped: Vec<&ProcessReport> = all.iter().filter(|p| p.pid > 4).collect();
    // Each executable's totals are its processes', computed apart; most processes first.
    let exes: Vec<(Option<&str>, Vec<&str>, u64)> = m
        .by_exe
        .iter()
        .map(|e| {
            let comms = e.comms.iter().map(String::as_str).collect();
            (e.exe.as_deref(), comms, e.totals.processes)
        })
        .collect();
    assert_eq!(
        exes,
        [
            (Some("/usr/bin/node"), vec!["node", "runner"], 28),
            (None, vec!["sh"], 14),
            (Some("/bin/sh"), vec!["sh"], 14),
        ]
    );
    for e in &m.by_exe {
        let of: Vec<&&ProcessReport> = grouped.iter().filter(|p| p.exe == e.exe).collect();
        let writes: u64 = of.iter().map(|p| p.lock.write.count).sum();
        let wait: u64 = of.iter().map(|p| p.lock.write.wait_ns.sum).sum();
        assert_eq!((e.totals.writes, e.totals.write_wait_ns), (writes, wait));
        assert_eq!(
            waits(&e.totals.write),
            expect(&merge_of(of.iter().map(|p| &p.lock.write)))
        );
    }
    // Grouped in two steps, the same; read back from its JSON, the same, the unknown
    // executable absent.
    let mut twice = summary(all.clone());
    group(&mut twice, |p| p.pid <= 30);
    group(&mut twice, |p| p.pid <= 4);
    assert_eq!(twice.minor_processes, r.minor_processes);
    let line = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&line).unwrap();
    assert_eq!(back.minor_processes, r.minor_processes);
    let json: serde_json::Value = serde_json::from_str(&line).unwrap();
    let by_exe = &json["minor_processes"]["by_exe"];
    assert_eq!(by_exe[0]["exe"], "/usr/bin/node");
    assert!(by_exe[1].get("exe").is_none(), "{by_exe}");
    assert_eq!(by_exe[1]["processes"], 14);
    // A group an earlier build began (no `by_exe`), grouped again: none is begun, which
    // would miss its first processes.
    let mut earlier = summary(all);
    group(&mut earlier, |p| p.pid <= 30);
    earlier.minor_processes.as_mut().unwrap().by_exe.clear();
    group(&mut earlier, |p| p.pid <= 4);
    let m = earlier.minor_processes.unwrap();
    assert_eq!((m.totals.processes, m.by_exe.len()), (56, 0));
    assert!(!m.exes_complete());
}
