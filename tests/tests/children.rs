//! ROOT-ONLY: `--children` follows a target's descendants from their first acquisition: a
//! Node parent spawning ground-truth helpers through child_process (fork + exec), each of
//! whose writes must all appear, under its own pid.

use std::{collections::HashMap, process::Command};

use integration_tests::{
    Workload, cause_counts, churn_bin, fixture, process, profile_workload,
    require_root_and_tracepoints,
};
use serde_json::Value;

/// A helper's pid and its writes by cause.
type Helper = (u32, HashMap<String, u64>);

/// spawner.js (started with `env`) running `children` churn helpers of one thread and `n`
/// mmap/munmap pairs each, profiled with `--children` to its end, nothing lost: its pid, the
/// summary, and each helper's pid (as spawner.js says it) with its writes by cause.
fn spawned(env: &[(&str, &str)], children: u64, n: u64) -> (u32, Value, Vec<Helper>) {
    let mut cmd = Command::new("node");
    cmd.envs(env.iter().copied())
        .arg(fixture("spawner.js"))
        .arg(churn_bin())
        .args([children.to_string(), "1".into(), n.to_string()]);
    let mut w = Workload::spawn(cmd);
    let out = profile_workload(&mut w, &["--children", "-i", "0"]);
    let pids: Vec<u32> = w.report()["children"]
        .as_array()
        .expect("the children's pids")
        .iter()
        .map(|p| p.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(pids.len() as u64, children);
    let s = out.summary().clone();
    assert_eq!(s["lost"]["events"], 0, "{}", s["lost"]);
    let helpers = pids
        .into_iter()
        .map(|pid| {
            let p =
                process(&s, pid).unwrap_or_else(|| panic!("helper {pid} is not in the summary"));
            (pid, cause_counts(p))
        })
        .collect();
    (w.pid, s, helpers)
}

#[test]
fn a_node_parents_children_are_followed_from_their_first_write() {
    if !require_root_and_tracepoints() {
        return;
    }
    let n = 2000u64;
    let (parent, s, helpers) = spawned(&[], 3, n);
    for (pid, causes) in helpers {
        let of = |c: &str| causes.get(c).copied().unwrap_or(0);
        // Every mmap of its work (N), plus the few of its start-up (the dynamic loader mapping
        // libc): followed from exec, before it could have been discovered by looking.
        assert!(
            (n + 1..=n + 64).contains(&of("mmap")),
            "child {pid}: {causes:?}"
        );
        assert!(of("munmap") >= n, "child {pid}: {causes:?}");
        // Start-up writes that only a process followed from its first acquisition shows.
        assert!(
            of("brk") > 0 && of("mprotect") > 0,
            "child {pid}: {causes:?}"
        );
    }
    // The parent is there too.
    assert!(process(&s, parent).is_some());
}

/// `--children` also covers the descendants that exist when it attaches: a Node parent whose
/// two helpers (one a grandchild, through `sh -c`) were started before the profiler, each
/// then doing N x (mmap; munmap) after it attached: every one of those writes is counted,
/// under the helper's own pid.
#[test]
fn descendants_that_exist_at_attach_are_followed_too() {
    if !require_root_and_tracepoints() {
        return;
    }
    let n = 2000u64;
    let (_, _, helpers) = spawned(&[("SPAWN_EARLY", "1")], 2, n);
    for (pid, causes) in helpers {
        let of = |c: &str| causes.get(c).copied().unwrap_or(0);
        // Its work after "go" (N of each), and at most a few writes of its own around it.
        assert!(
            (n..=n + 8).contains(&of("mmap")),
            "helper {pid}: {causes:?}"
        );
        assert!(
            (n..=n + 8).contains(&of("munmap")),
            "helper {pid}: {causes:?}"
        );
    }
}
