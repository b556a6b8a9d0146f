//! Workloads of known behaviour: a child that prints "ready", waits for "go", does its work and
//! reports it; killed on drop. Also the bounded waits the tests poll with.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{build_addon, built, churn_bin, fixture};

/// `roles.js` (fixtures/roles.js) with known thread roles: 3 Workers reading a 64 KiB file
/// (written in `dir`) 300 times each, two libuv threadpool threads, two V8 platform threads.
/// The workload, ready, and its Workers' tids as it printed them.
pub fn roles_workload(dir: &Path) -> (Workload, Vec<u64>) {
    roles_workload_sized(dir, 3, 300, 64 * 1024)
}

/// [`roles_workload`] with `workers` Workers reading a file of `size` bytes `iterations`
/// times each.
pub fn roles_workload_sized(
    dir: &Path,
    workers: u32,
    iterations: u32,
    size: usize,
) -> (Workload, Vec<u64>) {
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![7u8; size]).unwrap();
    let mut cmd = Command::new("node");
    if size > 128 * 1024 {
        // Each read's Buffer an mmap and a munmap: glibc's own threshold rises past it after
        // the first free, and the Buffers would then come from the arenas.
        cmd.env("MALLOC_MMAP_THRESHOLD_", "131072");
    }
    cmd.env("UV_THREADPOOL_SIZE", "2")
        .arg("--v8-pool-size=2")
        .arg(fixture("roles.js"))
        .args([workers.to_string(), iterations.to_string()])
        .arg(&file);
    let w = Workload::spawn(cmd);
    let workers = w.preamble_tids("workers");
    (w, workers)
}

/// Asks `state` every `every` until it says done (`Ok`), and returns what it gave; once
/// `within` on the reference machine ([`crate::scaled`]: the bound grows with the measured
/// speed factor) has passed, fails with what it said last (`Err`). A bound on a wait for
/// something a broken product would never produce, never a measure of time.
pub fn wait_until<T>(
    within: Duration,
    every: Duration,
    mut state: impl FnMut() -> Result<T, String>,
) -> T {
    let within = crate::scaled(within);
    let deadline = Instant::now() + within;
    loop {
        match state() {
            Ok(v) => return v,
            Err(why) => assert!(
                Instant::now() < deadline,
                "{why} (still so after {within:?}, speed factor {:.2})",
                crate::speed::factor()
            ),
        }
        std::thread::sleep(every);
    }
}

/// Starts `cmd`, which must start (its pipes set by the caller).
pub(crate) fn start(cmd: &mut Command) -> Child {
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits for a child that ends by itself (its work is finite, or it was signalled), with no
/// bound: a hang is caught by the suite's per-test limit, which names the test.
pub(crate) fn wait_child(child: &mut Child) -> ExitStatus {
    child.wait().expect("wait for a child")
}

fn read_until_ready(reader: &mut BufReader<ChildStdout>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).expect("read workload stdout") == 0 {
            panic!("workload exited before it was ready; it printed {lines:?}");
        }
        let l = l.trim_end().to_string();
        let done = l.starts_with("ready");
        lines.push(l);
        if done {
            return lines;
        }
    }
}

/// A running workload that waits for "go" on stdin after printing "ready".
pub struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    // Kept open: a helper that reports what it did after its work must not meet a closed pipe.
    stdout: Option<BufReader<ChildStdout>>,
    pub pid: u32,
    /// What it printed up to and including "ready".
    pub preamble: Vec<String>,
    /// What it printed after "ready", once [`Workload::wait`] has returned.
    pub output: Vec<String>,
}

impl Workload {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = start(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()));
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let preamble = read_until_ready(&mut stdout);
        Workload {
            pid: child.id(),
            child,
            stdin,
            stdout: Some(stdout),
            preamble,
            output: Vec::new(),
        }
    }

    /// The tids a Node fixture's first line lists under `key` (`{"workers": [tid, ...]}`).
    pub fn preamble_tids(&self, key: &str) -> Vec<u64> {
        let ids: Value = serde_json::from_str(&self.preamble[0]).expect("tids line");
        ids[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} in {ids}"))
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    }

    /// One of this package's ground-truth helpers (`target/<profile>/NAME`) with arguments.
    pub fn helper<A: ToString>(name: &str, args: impl IntoIterator<Item = A>) -> Self {
        let mut cmd = Command::new(built(name));
        cmd.args(args.into_iter().map(|a| a.to_string()));
        Self::spawn(cmd)
    }

    /// `node SCRIPT churn.node WORKERS N`: a fixture driving the tests' addon (`fixtures/addon/`,
    /// built into `dir` by [`build_addon`]) from `workers` Worker threads, `n` calls each.
    pub fn churn_addon(dir: &Path, script: &str, workers: u64, n: u64) -> Self {
        let mut cmd = Command::new("node");
        cmd.arg(fixture(script))
            .arg(build_addon(dir))
            .args([workers.to_string(), n.to_string()]);
        Self::spawn(cmd)
    }

    /// `mmap-churn`: `threads` x `iterations` x (mmap 64 KiB; touch; munmap).
    pub fn churn(threads: u32, iterations: u32, name: Option<&str>) -> Self {
        let mut cmd = Command::new(churn_bin());
        cmd.args([threads.to_string(), iterations.to_string(), "65536".into()]);
        if let Some(n) = name {
            cmd.arg(n);
        }
        Self::spawn(cmd)
    }

    pub fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("go once");
        stdin.write_all(b"go\n").expect("write go");
    }

    /// Writes a line to the workload's stdin, keeping it open (for workloads that take more
    /// than one command).
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .expect("write to the workload");
    }

    /// The next line the workload prints (after "ready"), waiting for it.
    pub fn read_line(&mut self) -> String {
        let r = self.stdout.as_mut().expect("stdout still open");
        let mut l = String::new();
        let n = r.read_line(&mut l).expect("read workload stdout");
        assert!(n > 0, "workload {} ended before printing a line", self.pid);
        l.trim_end().to_string()
    }

    /// Waits for the workload to end, then collects what it printed after "ready" into
    /// `output` (a helper prints one short line: it fits in the pipe while nobody reads).
    pub fn wait(&mut self) -> ExitStatus {
        let status = wait_child(&mut self.child);
        if let Some(r) = self.stdout.take() {
            self.output.extend(
                r.lines()
                    .map_while(Result::ok)
                    .map(|l| l.trim_end().to_string()),
            );
        }
        status
    }

    /// The JSON line a ground-truth helper printed last, saying what it did (after `wait`).
    pub fn report(&self) -> Value {
        let last = self.output.last().unwrap_or_else(|| {
            panic!(
                "the workload printed nothing after ready (call wait first): {:?}",
                self.output
            )
        });
        serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last:?}"))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // V8 leaves its perf map (`--perf-basic-prof`) when it exits; a later process given
        // the same pid would seem to have written it.
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.pid));
    }
}
