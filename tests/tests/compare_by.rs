//! ROOT-ONLY: `compare --by run` lines up the two pools of a test runner: one node process that
//! renamed itself (`process.title`) running its tasks on Worker threads, against a node parent
//! running the same tasks in child processes (fixtures/runner.js). By name they share nothing;
//! by run, each side is one group whose figures are the exact sums of its summary's processes,
//! those it lists and those it grouped by command (`minor_processes`, a pool of 14 children).
//!
//! By executable (`--by exe`), every process of both runs is node's, the renamed parent
//! included: each has node's real path or none (a short child gone before the profiler could
//! read it after its exec), and each group's figures are the sums over the processes the
//! summaries say are in it.
//!
//! Each run is selected by the parent's pid (with `--children` for the forks), not by
//! `--comm node`: the test counts whole runs, and any other node process on the host would
//! be in a run selected by name.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use integration_tests::{
    Workload, bpf_test, fixture, profile_workload, read_lines, run_json, run_ok, run_profiler,
};
use serde_json::Value;

/// Tasks (Workers or children), and 64 KiB reads per task.
const TASKS: u64 = 3;
const READS: u64 = 2000;

/// runner.js's `pool` of `tasks` tasks of `reads` reads profiled into `out` (`--pid`, plus
/// `extra`): its summary, and what the runner printed at its end.
fn profile_pool(
    dir: &Path,
    (pool, tasks, reads): (&str, u64, u64),
    extra: &[&str],
    out: &Path,
) -> (Value, Value) {
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(fixture("runner.js"))
        .args([pool, &tasks.to_string(), &reads.to_string()])
        .arg(&file);
    let mut w = Workload::spawn(cmd);
    let mut args = vec!["-i", "0", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    profile_workload(&mut w, &args);
    let summary = read_lines(out).pop().expect("a summary line");
    assert_eq!(summary["type"], "summary");
    (summary, w.report())
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A summary's write count and wait sum per row key (`all`, `role ROLE`, `cause CAUSE`),
/// summed over its processes here, independently of `compare`: those listed, and those
/// grouped (`minor_processes`: their writes, by role and by cause).
fn sums(summary: &Value) -> BTreeMap<(String, String), (u64, u64)> {
    let mut m: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut add = |group: &str, key: &str, stats: &Value| {
        let e = m.entry((group.into(), key.into())).or_default();
        e.0 += u(&stats["count"]);
        e.1 += u(&stats["wait_ns"]["sum"]);
    };
    for p in summary["processes"].as_array().unwrap() {
        add("all", "all", &p["write"]);
        for t in p["threads"].as_array().unwrap() {
            add("role", t["role"].as_str().unwrap(), &t["write"]);
        }
        for c in p["causes"].as_array().unwrap() {
            add("cause", c["cause"].as_str().unwrap(), &c["write"]);
        }
    }
    if let Some(g) = summary.get("minor_processes") {
        add("all", "all", &g["write"]);
        for r in g["roles"].as_array().unwrap() {
            add("role", r["role"].as_str().unwrap(), &r["write"]);
        }
        for c in g["causes"].as_array().unwrap() {
            add("cause", c["cause"].as_str().unwrap(), &c["write"]);
        }
    }
    m
}

/// The array `key` of `v`, or none.
fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A summary's command names, listed or grouped.
fn names(summary: &Value) -> BTreeSet<String> {
    let minor = summary.get("minor_processes").unwrap_or(&Value::Null);
    list(summary, "processes")
        .iter()
        .chain(list(minor, "by_comm"))
        .map(|p| p["comm"].as_str().unwrap().to_string())
        .collect()
}

/// The node the fixtures run (the first on PATH), its symlinks resolved: the path
/// `/proc/PID/exe` gives.
fn node_exe() -> String {
    let path = std::env::var_os("PATH").expect("PATH");
    let node = std::env::split_paths(&path)
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .expect("node on PATH");
    let real = std::fs::canonicalize(node).unwrap();
    real.to_str().unwrap().to_string()
}

/// `--by exe`'s group of the processes without an executable.
const UNKNOWN: &str = "(executable unknown)";

/// A summary by executable, summed here: per group, its processes, their names, and the
/// write count and wait sum per row (`all`, `role ROLE`, `cause CAUSE`; those it grouped in
/// their executable's `all` row only). Every executable is `node`'s.
type ByExe = BTreeMap<
    String,
    (
        u64,
        BTreeSet<String>,
        BTreeMap<(String, String), (u64, u64)>,
    ),
>;

fn by_exe(summary: &Value, node: &str) -> ByExe {
    let mut m = ByExe::new();
    let group = |exe: &Value| {
        let name = exe.as_str().unwrap_or(UNKNOWN).to_string();
        assert!(name == node || name == UNKNOWN, "{name}: not {node}");
        name
    };
    let add = |rows: &mut BTreeMap<(String, String), (u64, u64)>,
               kind: &str,
               key: &str,
               stats: &Value| {
        let e = rows.entry((kind.into(), key.into())).or_default();
        e.0 += u(&stats["count"]);
        e.1 += u(&stats["wait_ns"]["sum"]);
    };
    for p in list(summary, "processes") {
        let (n, comms, rows) = m.entry(group(&p["exe"])).or_default();
        *n += 1;
        comms.insert(p["comm"].as_str().unwrap().to_string());
        add(rows, "all", "all", &p["write"]);
        for t in list(p, "threads") {
            add(rows, "role", t["role"].as_str().unwrap(), &t["write"]);
        }
        for c in list(p, "causes") {
            add(rows, "cause", c["cause"].as_str().unwrap(), &c["write"]);
        }
    }
    let minor = summary.get("minor_processes").unwrap_or(&Value::Null);
    let mut grouped = 0;
    for e in list(minor, "by_exe") {
        let (n, comms, rows) = m.entry(group(&e["exe"])).or_default();
        *n += u(&e["processes"]);
        grouped += u(&e["processes"]);
        comms.extend(
            list(e, "comms")
                .iter()
                .map(|c| c.as_str().unwrap().to_string()),
        );
        add(rows, "all", "all", &e["write"]);
    }
    assert_eq!(
        grouped,
        minor.get("processes").map_or(0, u),
        "by_exe covers the group: {minor}"
    );
    m
}

/// `compare --by exe` of two summaries: its groups, their processes and names, and every row
/// the sums [`by_exe`] makes of them; the renamed parent and the forks' parent in node's group.
fn lines_up_by_exe(c: &Value, before: &Value, after: &Value, node: &str) {
    assert_eq!(c["by"], "exe");
    let sides = [
        ("before", by_exe(before, node)),
        ("after", by_exe(after, node)),
    ];
    for (_, m) in &sides {
        assert!(
            m.get(node).is_some_and(|g| g.0 >= 1),
            "the parent is node's: {m:?}"
        );
    }
    let names: BTreeSet<&String> = sides.iter().flat_map(|(_, m)| m.keys()).collect();
    let groups = list(c, "groups");
    assert_eq!(groups.len(), names.len(), "{groups:?}");
    let mut keys = 0;
    for g in groups {
        let name = g["name"].as_str().unwrap().to_string();
        let mut rows = BTreeSet::new();
        for (side, m) in &sides {
            let (n, comms, sums) = m.get(&name).cloned().unwrap_or_default();
            assert_eq!(
                g[*side]["processes"]["mean"].as_f64(),
                Some(n as f64),
                "{g}"
            );
            let got: BTreeSet<String> = list(&g[*side], "comms")
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect();
            assert_eq!(got, comms, "{name} {side}");
            rows.extend(sums.keys().cloned());
        }
        keys += rows.len();
    }
    let rows = list(c, "rows");
    assert_eq!(rows.len(), keys, "a row per group and key of either side");
    for r in rows {
        let group = r["process"].as_str().unwrap();
        let key = (
            r["group"].as_str().unwrap().to_string(),
            r["key"].as_str().unwrap().to_string(),
        );
        for (side, m) in &sides {
            let want = m
                .get(group)
                .and_then(|g| g.2.get(&key))
                .copied()
                .unwrap_or_default();
            let got = |f: &str| r[f][*side]["mean"].as_f64().unwrap();
            assert_eq!(
                (got("writes"), got("wait_ns")),
                (want.0 as f64, want.1 as f64),
                "{group} {key:?} {side}"
            );
        }
    }
}

/// A summary's processes, listed or grouped.
fn processes(summary: &Value) -> u64 {
    let minor = summary
        .get("minor_processes")
        .map_or(0, |g| u(&g["processes"]));
    list(summary, "processes").len() as u64 + minor
}

/// `compare --by run` of two summaries: one group, each side's every process in it, listed
/// or grouped, under its own names, and every row the exact sum over its side's processes.
fn lines_up_by_run(c: &Value, before: &Value, after: &Value) {
    assert_eq!(c["by"], "run");
    let groups = c["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    let g = &groups[0];
    assert_eq!(g["name"], "run");
    for (side, summary) in [("before", before), ("after", after)] {
        let n = processes(summary) as f64;
        assert_eq!(g[side]["processes"]["mean"].as_f64(), Some(n), "{g}");
        let comms: BTreeSet<String> = g[side]["comms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        assert_eq!(comms, names(summary));
    }
    let rows = c["rows"].as_array().unwrap();
    let (b, a) = (sums(before), sums(after));
    let keys: BTreeSet<&(String, String)> = b.keys().chain(a.keys()).collect();
    assert_eq!(rows.len(), keys.len(), "a row per key of either side");
    for r in rows {
        assert_eq!(r["process"], "run");
        let key = (
            r["group"].as_str().unwrap().to_string(),
            r["key"].as_str().unwrap().to_string(),
        );
        for (side, want) in [("before", &b), ("after", &a)] {
            let (writes, wait) = want.get(&key).copied().unwrap_or_default();
            let got = |f: &str| r[f][side]["mean"].as_f64().unwrap();
            assert_eq!(
                (got("writes"), got("wait_ns")),
                (writes as f64, wait as f64),
                "{key:?} {side}"
            );
        }
    }
    assert_eq!(c["notes"].as_array().map(Vec::len), Some(0), "{c}");
}

#[test]
fn by_run_a_renamed_parent_with_workers_lines_up_with_a_parent_and_children() {
    let Some(dir) = bpf_test() else { return };
    let (a, b) = (
        dir.path().join("threads.json"),
        dir.path().join("forks.json"),
    );
    let (threads, ran) = profile_pool(dir.path(), ("threads", TASKS, READS), &[], &a);
    assert_eq!(u(&ran["workers"]), TASKS);
    let (forks, ran) = profile_pool(dir.path(), ("forks", TASKS, READS), &["--children"], &b);
    let children: BTreeSet<u64> = ran["children"].as_array().unwrap().iter().map(u).collect();
    assert_eq!(children.len() as u64, TASKS);
    // The threads run is its one process; the forks run the parent and each child.
    let pids = |s: &Value| -> Vec<u64> {
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u(&p["pid"]))
            .collect()
    };
    assert_eq!(pids(&threads).len(), 1);
    let forked: BTreeSet<u64> = pids(&forks).into_iter().collect();
    assert!(children.is_subset(&forked), "{children:?} in {forked:?}");
    assert_eq!(forked.len() as u64, TASKS + 1, "{forked:?}");

    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let c = run_json(["compare", a, b, "--by", "run"]);
    lines_up_by_run(&c, &threads, &forks);
    let (before, after) = (sums(&threads), sums(&forks));
    // The Workers on the threads' side only; on the other, the children's main threads.
    let worker = ("role".to_string(), "worker".to_string());
    assert!(before.get(&worker).is_some_and(|w| w.0 > 0), "{before:?}");
    assert!(!after.contains_key(&worker), "{after:?}");

    // Text and page say how they grouped.
    let text = run_ok(["compare", a, b, "-f", "text"]);
    assert!(text.contains("grouped by run (--by run)"), "{text}");
    let page = dir.path().join("compare.html");
    run_ok(["compare", a, b, "--html", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Processes grouped by run (--by run)."));

    // By executable: node's real path, the renamed parent's too, its text saying so.
    let node = node_exe();
    let c = run_json(["compare", a, b, "--by", "exe"]);
    lines_up_by_exe(&c, &threads, &forks, &node);
    assert_eq!(c["notes"].as_array().map(Vec::len), Some(0), "{c}");
    let runner = threads["processes"][0]["comm"].as_str().unwrap();
    assert_eq!(threads["processes"][0]["exe"], node.as_str(), "{runner}");
    let text = run_ok(["compare", a, b, "--by", "exe", "-f", "text"]);
    assert!(text.contains("grouped by executable (--by exe)"), "{text}");
    let label = if node.chars().count() <= 28 {
        node.clone()
    } else {
        let n = node.chars().count();
        format!("…{}", node.chars().skip(n - 27).collect::<String>())
    };
    let forks_n = by_exe(&forks, &node)[&node].0;
    let noun = if forks_n == 1 { "process" } else { "processes" };
    assert!(
        text.contains(&format!(
            "\n    {label:<28} 1 process ({runner}) -> {forks_n} {noun} (node)\n"
        )),
        "{text}"
    );

    // What cannot be grouped is refused, in one line, as bad usage: an unknown grouping, and
    // --by exe on a file of a build before executables were reported (here, the threads
    // run's without them).
    let old = dir.path().join("old.json");
    let lines: Vec<String> = read_lines(Path::new(a))
        .into_iter()
        .map(|mut l| {
            for p in l["processes"].as_array_mut().into_iter().flatten() {
                p.as_object_mut().unwrap().remove("exe");
            }
            l.to_string()
        })
        .collect();
    std::fs::write(&old, lines.join("\n") + "\n").unwrap();
    let old = old.to_str().unwrap();
    for (before, by, needle) in [
        (
            old,
            "exe",
            format!("mmaplock-prof: --by exe: {old} records no process's executable"),
        ),
        (
            a,
            "bogus",
            "[possible values: exe, comm, cgroup, run]".to_string(),
        ),
    ] {
        let out = run_profiler(&["compare", before, b, "--by", by]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&needle), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// Children a summary groups: 14 and the parent are 15 processes, of which it lists at most
/// the 10 that waited longest when none waited materially (none does, on 100 reads each).
const MANY: u64 = 14;

#[test]
fn grouped_children_are_counted_by_run_and_join_their_command_by_comm() {
    let Some(dir) = bpf_test() else { return };
    let (a, b) = (
        dir.path().join("threads.json"),
        dir.path().join("forks.json"),
    );
    let (threads, _) = profile_pool(dir.path(), ("threads", MANY, 100), &[], &a);
    let (forks, ran) = profile_pool(dir.path(), ("forks", MANY, 100), &["--children"], &b);
    assert_eq!(list(&ran, "children").len() as u64, MANY);
    assert_eq!(
        processes(&forks),
        MANY + 1,
        "every child, listed or grouped"
    );
    let minor = forks
        .get("minor_processes")
        .unwrap_or_else(|| panic!("children grouped: {}", list(&forks, "processes").len()));
    assert!(u(&minor["processes"]) > 0, "{minor}");
    // Its STATS are its commands' (what compare by command adds), and its writes.
    let by_comm: u64 = list(minor, "by_comm")
        .iter()
        .map(|c| u(&c["write"]["count"]))
        .sum();
    assert_eq!(by_comm, u(&minor["write"]["count"]));
    assert_eq!(u(&minor["write"]["count"]), u(&minor["writes"]));

    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    lines_up_by_run(&run_json(["compare", a, b]), &threads, &forks);
    // By command: every child in `node`, listed or grouped, and its `all` row theirs; that
    // its role and cause rows are its listed processes' only is said.
    let c = run_json(["compare", a, b, "--by", "comm"]);
    let node = list(&c, "groups")
        .iter()
        .find(|g| g["name"] == "node")
        .unwrap_or_else(|| panic!("{c}"));
    assert_eq!(
        node["after"]["processes"]["mean"].as_f64(),
        Some((MANY + 1) as f64)
    );
    let all = list(&c, "rows")
        .iter()
        .find(|r| r["process"] == "node" && r["group"] == "all")
        .unwrap();
    let want = sums(&forks)[&("all".to_string(), "all".to_string())];
    assert_eq!(all["writes"]["after"]["mean"].as_f64(), Some(want.0 as f64));
    assert_eq!(
        all["wait_ns"]["after"]["mean"].as_f64(),
        Some(want.1 as f64)
    );
    let notes = list(&c, "notes");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("{b}: its grouped processes")),
        "{notes:?}"
    );
    let text = run_ok(["compare", a, b, "--by", "comm", "-f", "text"]);
    assert!(
        text.contains(&format!("  note: {b}: its grouped processes")),
        "{text}"
    );
    // By executable: the grouped children in their executable's group, counted and summed
    // (`by_exe`), which is said.
    let c = run_json(["compare", a, b, "--by", "exe"]);
    lines_up_by_exe(&c, &threads, &forks, &node_exe());
    let notes = list(&c, "notes");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].as_str().unwrap().starts_with(&format!(
            "{b}: its grouped processes (minor_processes) are in their executable's processes"
        )),
        "{notes:?}"
    );
}
