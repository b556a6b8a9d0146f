//! ROOT-ONLY: `--children` follows a target's descendants from their first acquisition: a
//! Node parent spawning ground-truth helpers through child_process (fork + exec), each of
//! whose writes must all appear, under its own pid.

use std::process::Command;

use integration_tests::{
    Workload, cause_counts, churn_bin, fixture, process, profile_workload,
    require_root_and_tracepoints,
};

/// The pids spawner.js says its children had.
fn children_of(did: &serde_json::Value) -> Vec<u32> {
    did["children"]
        .as_array()
        .expect("the children's pids")
        .iter()
        .map(|p| p.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn a_node_parents_children_are_followed_from_their_first_write() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (children, n) = (3u64, 2000u64);
    let mut cmd = Command::new("node");
    cmd.arg(fixture("spawner.js"))
        .arg(churn_bin())
        .arg(children.to_string())
        .args(["1", &n.to_string()]);
    let mut w = Workload::spawn(cmd);
    let out = profile_workload(&mut w, &["--children", "-i", "0"]);
    let did = w.report();
    let pids = children_of(&did);
    assert_eq!(pids.len() as u64, children);
    let s = out.summary();
    assert_eq!(s["lost"]["events"], 0, "{}", s["lost"]);
    for pid in pids {
        let p = process(s, pid).unwrap_or_else(|| panic!("child {pid} is not in the summary"));
        let causes = cause_counts(p);
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
    assert!(process(s, w.pid).is_some());
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
    let mut cmd = Command::new("node");
    cmd.env("SPAWN_EARLY", "1")
        .arg(fixture("spawner.js"))
        .arg(churn_bin())
        .args(["2", "1", &n.to_string()]);
    let mut w = Workload::spawn(cmd);
    let out = profile_workload(&mut w, &["--children", "-i", "0"]);
    let did = w.report();
    let pids = children_of(&did);
    assert_eq!(pids.len(), 2);
    let s = out.summary();
    assert_eq!(s["lost"]["events"], 0, "{}", s["lost"]);
    for pid in pids {
        let p = process(s, pid).unwrap_or_else(|| panic!("helper {pid} is not in the summary"));
        let causes = cause_counts(p);
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
