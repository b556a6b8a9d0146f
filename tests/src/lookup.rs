//! Entries of a report line (as JSON) found by their key: a process by pid, a thread by tid,
//! a cause by name, and the figures the tests compare with what a workload did.

use std::{collections::HashMap, path::Path};

use serde_json::Value;

/// The element of the array `v[list]` whose `key` is `want` (`find(p, "threads", "tid", 7)`).
pub fn find<'a, T>(v: &'a Value, list: &str, key: &str, want: T) -> Option<&'a Value>
where
    Value: PartialEq<T>,
{
    v[list].as_array()?.iter().find(|e| e[key] == want)
}

/// Finds a process in a report.
pub fn process(report: &Value, pid: u32) -> Option<&Value> {
    find(report, "processes", "pid", pid)
}

/// The finding `id` about process `pid` in a summary, which must be there.
pub fn finding<'a>(summary: &'a Value, id: &str, pid: u32) -> &'a Value {
    summary["findings"]
        .as_array()
        .expect("the summary has findings")
        .iter()
        .find(|f| f["id"] == id && f["pid"] == pid)
        .unwrap_or_else(|| panic!("no {id} finding in {}", summary["findings"]))
}

/// The string `key` of every element of the array `v[list]` (`strings(p, "causes", "cause")`).
pub fn strings<'a>(v: &'a Value, list: &str, key: &str) -> Vec<&'a str> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no array {list} in {v}"))
        .iter()
        .map(|e| {
            e[key]
                .as_str()
                .unwrap_or_else(|| panic!("no string {key} in {e}"))
        })
        .collect()
}

/// A thread of a process entry, which must be there.
pub fn thread(p: &Value, tid: u64) -> &Value {
    find(p, "threads", "tid", tid).unwrap_or_else(|| panic!("thread {tid} not in {}", p["threads"]))
}

/// The write count of a thread of a process entry (0 if it is not there).
pub fn thread_writes(p: &Value, tid: u64) -> u64 {
    find(p, "threads", "tid", tid).map_or(0, |t| t["write"]["count"].as_u64().unwrap())
}

/// The threads a ground-truth helper `pid` started: all but its main thread and the writes of
/// others on its lock (`foreign`, `profiler`).
pub fn helper_threads(p: &Value, pid: u32) -> Vec<&Value> {
    p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tid"] != pid && t["role"] != "foreign" && t["role"] != "profiler")
        .collect()
}

/// The lines of a newline-delimited JSON file.
pub fn read_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

/// `count` and `wait_ns.sum` of STATS `v[side]` (`write`, `read`, `downgrade`).
pub fn stats(v: &Value, side: &str) -> (u64, u64) {
    let missing = |what: &str| -> ! {
        let keys: Vec<&String> = v
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        panic!(
            "no {side}.{what} in the entry of pid {} tid {}: it has {keys:?}",
            v["pid"], v["tid"]
        )
    };
    (
        v[side]["count"]
            .as_u64()
            .unwrap_or_else(|| missing("count")),
        v[side]["wait_ns"]["sum"]
            .as_u64()
            .unwrap_or_else(|| missing("wait_ns.sum")),
    )
}

/// Write acquisitions by cause of a process or thread entry.
pub fn cause_counts(p: &Value) -> HashMap<String, u64> {
    p["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("causes in {p}"))
        .iter()
        .map(|c| {
            (
                c["cause"].as_str().unwrap().to_string(),
                c["write"]["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The write STATS of one cause of a process or thread entry.
pub fn cause_stats<'a>(p: &'a Value, cause: &str) -> Option<&'a Value> {
    find(p, "causes", "cause", cause).map(|c| &c["write"])
}
