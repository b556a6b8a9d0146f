//! ROOT-ONLY: a thread started by a library that an addon needs (libvips's workers behind
//! sharp's `.node`) is the addon's: role `addon`, with the library and the addon named, and
//! exactly its own writes; node's own threads keep their roles.

use std::process::Command;

use integration_tests::{
    Profiler, Workload, bpf_test, build_spawner_addon, cause_counts, fixture, process,
    require_root_and_tracepoints, skip_because,
};
use serde_json::Value;

#[test]
fn a_thread_started_by_a_library_behind_an_addon_is_the_addons() {
    let Some(dir) = bpf_test() else { return };
    let addon = build_spawner_addon(dir.path());
    let (workers, n, size) = (2u64, 300u64, 65536u64);
    let mut cmd = Command::new("node");
    cmd.env("UV_THREADPOOL_SIZE", "2")
        .arg("--v8-pool-size=2")
        .arg(fixture("addon/library.js"))
        .arg(&addon)
        .args([workers, n, size].map(|x| x.to_string()));
    let mut w = Workload::spawn(cmd);
    let worker_tids = w.preamble_tids("workers");
    // Threads before the work: main, V8's platform threads, the Workers (libuv's threadpool
    // and the library's thread start after "go").
    let before: Vec<u64> = std::fs::read_dir(format!("/proc/{}/task", w.pid))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let (done, p) = profile(&mut w);
    let done: Value = serde_json::from_str(&done).expect("done line");
    let lib_tid = done["library_thread"]
        .as_u64()
        .expect("the library's thread");
    let threads = p["threads"].as_array().unwrap();

    // The library's thread: the addon's, both named, and exactly its n mmaps and n munmaps.
    let t = threads
        .iter()
        .find(|t| t["tid"] == lib_tid)
        .unwrap_or_else(|| panic!("thread {lib_tid} not in {threads:?}"));
    assert_eq!(t["role"], "addon", "{t}");
    let named = |field: &str, file: &str| {
        t[field]
            .as_str()
            .is_some_and(|p| p == dir.path().join(file).to_str().unwrap())
    };
    assert!(named("role_library", "libmmaplock_spawner.so"), "{t}");
    assert!(named("role_addon", "spawner.node"), "{t}");
    assert_eq!(t["write"]["count"], 2 * n, "{t}");
    let causes = cause_counts(t);
    assert_eq!((causes["mmap"], causes["munmap"]), (n, n), "{causes:?}");

    // Node's own threads keep their roles; the library's is the only addon thread.
    let with_role = |role: &str| -> Vec<u64> {
        threads
            .iter()
            .filter(|t| t["role"] == role)
            .map(|t| t["tid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(with_role("addon"), [lib_tid]);
    assert_eq!(with_role("main"), [w.pid as u64]);
    let mut found = with_role("worker");
    found.sort_unstable();
    let mut expected = worker_tids.clone();
    expected.sort_unstable();
    assert_eq!(found, expected, "{threads:?}");
    let libuv = with_role("libuv");
    assert_eq!(libuv.len(), 2, "UV_THREADPOOL_SIZE=2: {threads:?}");
    assert!(libuv.iter().all(|t| !before.contains(t)), "{libuv:?}");
    let v8 = with_role("v8");
    assert!((1..=3).contains(&v8.len()), "{threads:?}");
    assert!(
        v8.iter()
            .all(|t| before.contains(t) && !worker_tids.contains(t))
    );
    only_the_exit_is_unclassified(threads);
}

/// Profiles the node workload `w` from "go" to its exit: the line it printed when done, and
/// its process's entry in the summary.
fn profile(w: &mut Workload) -> (String, Value) {
    let pid = w.pid.to_string();
    let prof = Profiler::start(&["-p", &pid, "-i", "0"]);
    w.send("go");
    let done = w.read_line();
    w.send("exit");
    assert!(w.wait().success());
    let out = prof.finish();
    assert!(out.status.success(), "{}", out.stderr);
    let p = process(out.summary(), w.pid).expect("node in the summary");
    (done, p.clone())
}

/// The thread that ran the process's exit (exit_mmap) after the others were gone, if it
/// took the lock only then, could no longer be read; nothing else is unclassified.
fn only_the_exit_is_unclassified(threads: &[Value]) {
    for t in threads.iter().filter(|t| t["role"] == "other") {
        assert!(
            cause_counts(t).keys().all(|c| c == "exit"),
            "unclassified {t}"
        );
    }
}

/// The case users meet: sharp's addon needs libvips, whose worker threads (glib names them
/// `libvips worker`) start in libvips. They are sharp's addon threads, libvips named.
#[test]
fn libvips_threads_behind_sharp_are_addon_threads() {
    if !require_root_and_tracepoints() {
        return;
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let sharp = std::path::Path::new(&home).join(".cache/mmaplock-prof/sharp/node_modules/sharp");
    if !sharp.join("package.json").exists() {
        skip_because("sharp is not installed (cargo xtask test installs it)");
        return;
    }
    let mut cmd = Command::new("node");
    cmd.arg(fixture("addon/sharp.js")).arg(&sharp).arg("20");
    let mut w = Workload::spawn(cmd);
    let (done, p) = profile(&mut w);
    assert_eq!(done, "done");
    let threads = p["threads"].as_array().unwrap();
    let libvips: Vec<&Value> = threads
        .iter()
        .filter(|t| t["comm"] == "libvips worker")
        .collect();
    assert!(
        !libvips.is_empty(),
        "no libvips thread took the lock: {threads:?}"
    );
    let file = |t: &Value, field: &str| {
        let path = t[field].as_str().unwrap_or_default();
        path.rsplit('/').next().unwrap_or_default().to_string()
    };
    for t in &libvips {
        if t["role"] == "other" {
            continue; // only_the_exit_is_unclassified, below
        }
        assert_eq!(t["role"], "addon", "{t}");
        assert!(
            file(t, "role_library").starts_with("libvips-cpp.so."),
            "{t}"
        );
        assert!(file(t, "role_addon").starts_with("sharp-linux-x64"), "{t}");
        assert!(file(t, "role_addon").ends_with(".node"), "{t}");
    }
    // sharp's own work runs on libuv's threadpool: libvips's are the only addon threads.
    for t in threads.iter().filter(|t| t["role"] == "addon") {
        assert_eq!(t["comm"], "libvips worker", "{t}");
    }
    only_the_exit_is_unclassified(threads);
}
