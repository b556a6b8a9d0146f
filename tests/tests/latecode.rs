//! ROOT-ONLY: code that appears after the profiler attached (an addon `require`d later), a
//! program whose file is gone by the time its stacks are named, and where sampled stacks end.

use std::process::Command;

use integration_tests::{
    Profiler, Workload, bpf_test, churn_bin, process, profile_until_done, profile_workload,
};
use serde_json::Value;

/// An addon loaded by Workers after attach: its writes are charged to its `.node` file (the
/// mappings are read again when a return address is outside the known ones).
#[test]
fn an_addon_required_after_attach_is_charged_to_its_file() {
    let Some(dir) = bpf_test() else { return };
    let (workers, n) = (3u64, 160u64);
    let mut w = Workload::churn_addon(dir.path(), "addon/late.js", workers, n);
    let pid = w.pid.to_string();
    let prof = Profiler::start(&["-p", &pid, "-i", "0", "--stack-sample", "1"]);
    let out = profile_until_done(&mut w, prof);
    let s = out.summary();
    // Every write is sampled: a profiler that falls behind (a slow host, the process's first
    // stacks waiting on its V8 metadata) drops some, counted in `lost.stacks`. The charge is
    // judged on those that arrived, and most must have.
    let lost = s["lost"]["stacks"].as_u64().expect("lost.stacks");
    let p = process(s, w.pid).expect("node in the summary");
    // Each Worker: n x (mmap + munmap), in the addon's own function.
    let addon_writes = 2 * n * workers;
    assert!(lost * 2 < addon_writes, "{lost} sampled stacks lost");
    let addon_writes = addon_writes - lost.min(addon_writes);
    let dsos = p["dsos"].as_array().expect("dsos");
    let charged = dsos
        .iter()
        .find(|d| d["dso"].as_str().unwrap().ends_with("/churn.node"))
        .map_or(0, |d| d["write"]["count"].as_u64().unwrap());
    eprintln!("charged to churn.node: {charged} of {addon_writes} sampled ({lost} lost); {dsos:?}");
    assert!(
        charged * 100 > 95 * addon_writes && charged <= addon_writes + lost,
        "{charged} of {addon_writes} addon writes charged to it"
    );
}

/// A program whose file is deleted while it runs, then exits before the report: its frames
/// are still named (the file was opened while it lived).
#[test]
fn symbols_survive_the_process_exit() {
    let Some(dir) = bpf_test() else { return };
    let copy = dir.path().join("churn-copy");
    std::fs::copy(churn_bin(), &copy).unwrap();
    let mut cmd = Command::new(&copy);
    cmd.args(["2", "200", "65536"]);
    let mut w = Workload::spawn(cmd);
    let pid = w.pid.to_string();
    let prof = Profiler::start(&["-p", &pid, "-i", "0", "--stack-sample", "1"]);
    // Nothing is left at that path once the process is gone.
    std::fs::remove_file(&copy).unwrap();
    w.go();
    assert!(w.wait().success());
    let out = prof.finish();
    assert!(out.status.success(), "{}", out.stderr);
    let p = process(out.summary(), w.pid).expect("in the summary");
    let frames: Vec<&str> = p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    assert!(
        frames
            .iter()
            .any(|f| f.contains("map_touch_unmap") && f.ends_with("(churn-copy)")),
        "{frames:?}"
    );
}

/// Every sampled stack says where it ends; a program whose stacks fit in the kernel's copy
/// reaches its threads' roots in every one.
#[test]
fn every_stack_reaches_its_root_or_says_why_not() {
    let Some(_dir) = bpf_test() else { return };
    let mut w = Workload::churn(2, 300, None);
    let out = profile_workload(&mut w, &["-i", "0", "--stack-sample", "1"]);
    let p = process(out.summary(), w.pid).expect("in the summary");
    let ends = p["stack_ends"].as_object().expect("stack_ends");
    let total: u64 = ends.values().map(|v| v.as_u64().unwrap()).sum();
    let sampled: u64 = p["dsos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["write"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(total, sampled, "one end per sampled stack: {ends:?}");
    let known = [
        "root",
        "no_unwind_info",
        "unreadable_memory",
        "depth_limit",
        "unknown_mapping",
        "no_process",
    ];
    assert!(ends.keys().all(|k| known.contains(&k.as_str())), "{ends:?}");
    let root = ends.get("root").and_then(Value::as_u64).unwrap_or(0);
    assert!(root * 100 >= 99 * total, "{ends:?}");
}
