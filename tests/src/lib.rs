//! Helpers for the integration tests: the built binaries, workloads of known behaviour, and a
//! profiler handle, each an RAII guard that kills its child process when dropped (a failing
//! test leaves nothing behind).
//!
//! The tests load the real eBPF programs, so they need root; `cargo xtask test` builds the
//! binaries they run first.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

/// One anonymous private read-write mapping of `size` bytes: exactly one mmap(2), so one
/// write acquisition of the process's mmap_lock (the ground-truth helpers' building block).
pub fn map_anon(size: usize) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping; the caller owns it and unmaps it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap failed");
    p
}

/// For the ground-truth helpers: print "ready PID", then block until a line arrives on stdin,
/// so that a profiler attached in between sees exactly the work that follows.
pub fn ready_then_wait_for_go() {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", std::process::id()).expect("stdout");
    out.flush().expect("stdout");
    drop(out);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
}

/// Where cargo put this test's binaries: `target/<profile>`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is not built: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

pub fn profiler_bin() -> PathBuf {
    built("mmaplock-prof")
}

pub fn churn_bin() -> PathBuf {
    built("mmap-churn")
}

pub fn lock_ops_bin() -> PathBuf {
    built("lock-ops")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The environment variable through which `cargo xtask test` names the file where skipped
/// tests are recorded (one line each: `test name<TAB>reason`). libtest has no "skipped"
/// outcome for a test that returns early: xtask reads this file, counts those tests as skipped
/// instead of passed, and, under CI, fails the run.
pub const SKIP_FILE_ENV: &str = "MMAPLOCK_PROF_TEST_SKIP_FILE";

/// Whether this run is CI (`CI` set, as CI services and `.ci/run` do): there, a test that
/// cannot run is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Records that the calling test is skipped, and why; the test then returns at once:
///
/// ```ignore
/// if skip_because("no node") { return; }
/// ```
///
/// Under CI it panics instead, so that the test that could not run is named as failed.
/// Always returns true.
pub fn skip_because(reason: &str) -> bool {
    // libtest runs each test on a thread named after it; the binary says which test file.
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let file = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.file_stem()?.to_str()?.to_string()))
        .map(|stem| {
            stem.rsplit_once('-')
                .map_or(stem.clone(), |(f, _)| f.to_string())
        });
    let test = match file {
        Some(f) => format!("{f}::{name}"),
        None => name,
    };
    assert!(
        !under_ci(),
        "{test} cannot run ({reason}), and under CI (CI is set) a test that cannot run fails"
    );
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_FILE_ENV) {
        use std::io::Write as _;
        let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
        // One short O_APPEND write per skip: whole lines even from concurrent test binaries.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("cannot record the skip in {path:?}: {e}"));
    }
    true
}

/// Root-only tests call this first. Not being root is a failure, not a skip: CI runs as root
/// and must exercise the real programs. A kernel without the mmap_lock tracepoints is the one
/// reason to skip: then the skip is recorded ([`skip_because`]; a failure under CI) and this
/// returns false.
pub fn require_root_and_tracepoints() -> bool {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test loads eBPF programs and needs root: run `sudo -E cargo xtask test`"
    );
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").unwrap_or_default();
    let needle = b"btf_trace_mmap_lock_acquire_returned";
    if !btf.windows(needle.len()).any(|w| w == needle) {
        skip_because("this kernel has no mmap_lock tracepoints in its BTF");
        return false;
    }
    true
}

/// Waits for a child with a deadline; kills it if the deadline passes.
fn wait_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child {} did not finish within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_until_ready(child: &mut Child) -> Vec<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = Vec::new();
    let mut reader = BufReader::new(stdout);
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
    pub pid: u32,
    /// What it printed up to and including "ready".
    pub preamble: Vec<String>,
}

impl Workload {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let preamble = read_until_ready(&mut child);
        Workload {
            pid: child.id(),
            child,
            stdin,
            preamble,
        }
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

    pub fn wait(&mut self) -> ExitStatus {
        wait_timeout(&mut self.child, Duration::from_secs(120))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a finished profiler run produced.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub lines: Vec<Value>,
    pub raw_stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The summary line, which must be the last line.
    pub fn summary(&self) -> &Value {
        let last = self.lines.last().unwrap_or_else(|| {
            panic!(
                "no output; stderr: {}\nstdout: {}",
                self.stderr, self.raw_stdout
            )
        });
        assert_eq!(last["type"], "summary", "last line must be the summary");
        last
    }
}

/// Finds a process in a report.
pub fn process(report: &Value, pid: u32) -> Option<&Value> {
    report["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
}

/// A running `mmaplock-prof` with JSON output.
pub struct Profiler {
    child: Child,
    stderr_rx: mpsc::Receiver<String>,
    stderr: Vec<String>,
    stdout_thread: Option<std::thread::JoinHandle<String>>,
}

impl Profiler {
    /// Starts the profiler and waits until its programs are attached.
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(profiler_bin())
            .args(["--format", "json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mmaplock-prof");
        let stdout = child.stdout.take().expect("stdout");
        let stdout_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut s);
            s
        });
        let stderr = child.stderr.take().expect("stderr");
        let (tx, stderr_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut p = Profiler {
            child,
            stderr_rx,
            stderr: Vec::new(),
            stdout_thread: Some(stdout_thread),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match p
                .stderr_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => {
                    let attached = l.contains("attached in");
                    p.stderr.push(l);
                    if attached {
                        return p;
                    }
                }
                Err(_) => panic!("mmaplock-prof did not attach; stderr: {:?}", p.stderr),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits for the profiler to end by itself (duration, targets' exit, signal).
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let status = wait_timeout(&mut self.child, timeout);
        let raw_stdout = self
            .stdout_thread
            .take()
            .expect("once")
            .join()
            .expect("stdout reader");
        self.stderr.extend(self.stderr_rx.try_iter());
        let lines = raw_stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
            .collect();
        Finished {
            status,
            lines,
            raw_stdout,
            stderr: self.stderr.join("\n"),
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the profiler to completion with the given arguments (for usage errors and the like).
pub fn run_profiler(args: &[&str]) -> std::process::Output {
    Command::new(profiler_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run mmaplock-prof")
}
