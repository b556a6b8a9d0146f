//! The lanes fixture: a small HTTP server (`fixtures/addon/hashserver.js`) whose every request
//! is one call of the tests' addon `lanes.node` on libuv's threadpool, shaped like a
//! memory-hard password hash (a large block, a thread per lane, started and joined per
//! call), loaded by a closed-loop client (`fixtures/addon/loadgen.js`) the test starts.
//!
//! Where the CPUs run is the test's to decide, not the host's: a shape pins the server to its
//! CPUs, and a shape's CPUs are saturated or not by its own threads (a CPU-bound run: more
//! lanes than its one CPU, under the ordinary scheduler, which preempts them, lock held or
//! not, every few milliseconds; other processes on that CPU only add to it). An idle-core
//! shape runs at real-time priority (SCHED_RR) on two CPUs with fewer runnable threads than
//! that, so that no other process on the host can take a CPU from it: its CPUs have room
//! whatever the host does. Request rates are compared within one test's interleaved runs,
//! never against a constant.

use std::{path::Path, process::Command};

use serde_json::Value;

use crate::{Finished, Profiler, Workload, fixture, skip_because};

/// A workload shape: the calls' numbers (`lanes.c`'s `hash`), the load, and where it runs.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub block_kib: u64,
    pub lanes: u64,
    pub passes: u64,
    pub pause_us: u64,
    pub stack_kib: u64,
    /// Requests in flight at once (the client's connections).
    pub conns: u64,
    pub requests: u64,
    /// libuv's threadpool (UV_THREADPOOL_SIZE).
    pub pool: u64,
    /// The server's CPUs (`taskset -c`), and the client's.
    pub cpus: &'static str,
    /// The server at real-time priority (`chrt -r 1`).
    pub realtime: bool,
    pub client_cpus: &'static str,
}

/// Builds `lanes.node` into `dir`.
pub fn build_lanes_addon(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("lanes.node");
    crate::binaries::gcc(&out, "addon/lanes.c", &[]);
    out
}

/// Builds `lanes.node` into `dir` as many prebuilt native libraries are built (sharp's
/// libvips among them): without unwind tables, and at -O2 without frame pointers, so that no
/// unwinder can walk out of its code (`lanes-nounwind.node`).
pub fn build_lanes_addon_without_unwind_tables(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("lanes-nounwind.node");
    crate::binaries::gcc(
        &out,
        "addon/lanes.c",
        &[
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-fomit-frame-pointer",
        ],
    );
    out
}

/// Whether this host can run the shapes: two CPUs or more, `taskset` and `chrt`, and
/// real-time scheduling allowed (a container may refuse it). Records the skip otherwise.
pub fn can_shape() -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        skip_because("the lanes shapes need two CPUs");
        return false;
    }
    let rt = Command::new("chrt")
        .args(["-r", "1", "taskset", "-c", "0", "true"])
        .status();
    if !rt.is_ok_and(|s| s.success()) {
        skip_because("chrt -r (real-time scheduling) or taskset cannot run here");
        return false;
    }
    true
}

/// A running server of `shape` (its env `env` besides), and the port it listens on.
pub fn start_server(addon: &Path, shape: &Shape, env: &[(&str, &str)]) -> (Workload, u16) {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", shape.cpus]);
    if shape.realtime {
        cmd.args(["chrt", "-r", "1"]);
    }
    cmd.arg("node")
        .arg(fixture("addon/hashserver.js"))
        .arg(addon)
        .args(
            [
                shape.block_kib,
                shape.lanes,
                shape.passes,
                shape.pause_us,
                shape.stack_kib,
            ]
            .map(|n| n.to_string()),
        )
        .env("UV_THREADPOOL_SIZE", shape.pool.to_string())
        .envs(env.iter().copied());
    let w = Workload::spawn(cmd);
    let port: Value = serde_json::from_str(&w.preamble[0]).expect("the port line");
    let port = port["port"].as_u64().expect("port") as u16;
    (w, port)
}

/// The client, ready to go on "go".
fn client(shape: &Shape, port: u16) -> Workload {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", shape.client_cpus, "node"])
        .arg(fixture("addon/loadgen.js"))
        .args([
            port.to_string(),
            "/hash".into(),
            shape.conns.to_string(),
            shape.requests.to_string(),
        ]);
    Workload::spawn(cmd)
}

/// Runs the client to its end against the server on `port`: its line
/// (`{"requests","errors","seconds","per_s","p50_ms","p99_ms"}`).
fn load(shape: &Shape, port: u16) -> Value {
    let mut c = client(shape, port);
    c.go();
    assert!(c.wait().success(), "the client failed: {:?}", c.output);
    let r = c.report();
    assert_eq!(r["errors"], 0, "{r}");
    r
}

/// Ends a server: "exit", and its count of calls.
fn stop(mut server: Workload) -> u64 {
    server.send("exit");
    assert!(server.wait().success());
    server.report()["calls"].as_u64().expect("calls")
}

/// Requests per second of `shape` with `env`, with no profiler.
pub fn throughput(addon: &Path, shape: &Shape, env: &[(&str, &str)]) -> f64 {
    let (server, port) = start_server(addon, shape, env);
    let r = load(shape, port);
    assert_eq!(stop(server), shape.requests);
    r["per_s"].as_f64().expect("per_s")
}

/// The median of `runs` interleaved runs of each of `a` and `b` (the env of each), their
/// requests per second: the host's slow moments fall on both alike.
pub fn throughputs(
    addon: &Path,
    shape: &Shape,
    a: &[(&str, &str)],
    b: &[(&str, &str)],
    runs: usize,
) -> (f64, f64) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        xs.push(throughput(addon, shape, a));
        ys.push(throughput(addon, shape, b));
    }
    eprintln!("requests per second: {xs:?} against {ys:?}");
    (median(xs), median(ys))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A profiled run of `shape` (env `env`), the profiler given `args` (besides `-p` and JSON):
/// what it reported, and the client's line.
pub fn profiled(
    addon: &Path,
    shape: &Shape,
    env: &[(&str, &str)],
    args: &[&str],
) -> (Finished, Value) {
    let (server, port) = start_server(addon, shape, env);
    let pid = server.pid.to_string();
    let mut all = vec!["-p", pid.as_str(), "-i", "0"];
    all.extend_from_slice(args);
    let prof = Profiler::start(&all);
    let r = load(shape, port);
    prof.signal(libc::SIGINT);
    let out = prof.finish_ok();
    assert_eq!(stop(server), shape.requests);
    crate::keep_output(
        &out,
        "lanes",
        &format!("{shape:?}\nenv {env:?}\nargs {args:?}\n"),
    );
    (out, r)
}
