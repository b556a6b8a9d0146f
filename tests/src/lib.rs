//! Helpers for the integration tests: the built binaries, workloads of known behaviour, and a
//! profiler handle, each an RAII guard that kills its child process when dropped (a failing
//! test leaves nothing behind).
//!
//! The tests load the real eBPF programs, so they need root; `cargo xtask test` builds the
//! binaries they run first.

pub mod bpf_objects;
mod browser;
mod lookup;

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod containers;
pub mod nodes;
pub mod scrape;

pub use browser::{
    assert_charts, assert_self_contained, charts, page_requests, rendered_charts, rendered_dom,
};
pub use lookup::{
    cause_counts, cause_stats, find, finding, helper_threads, process, read_lines, stats, strings,
    thread, thread_writes,
};

/// One anonymous private read-write mapping of `size` bytes: exactly one mmap(2), so one
/// write acquisition of the process's mmap_lock (the ground-truth helpers' building block).
pub fn map_anon(size: usize) -> *mut libc::c_void {
    mmap_anon(size, 0)
}

/// One anonymous private read-write mapping of `size` bytes with every page populated (one
/// mmap(2); the pages are faulted in by the kernel, not by touches).
pub fn map_anon_populated(size: usize) -> *mut libc::c_void {
    mmap_anon(size, libc::MAP_POPULATE)
}

fn mmap_anon(size: usize, flags: libc::c_int) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping; the caller owns it (and unmaps it).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap failed");
    p
}

/// `n` x (mmap `size` bytes; touch one byte; munmap): exactly `n` mmap and `n` munmap write
/// acquisitions (each munmap then downgrades its write lock to read once); the touch is a
/// page fault that per-VMA locking serves without mmap_lock.
pub fn map_touch_unmap(n: u64, size: usize) {
    for _ in 0..n {
        let p = map_anon(size);
        // SAFETY: touching one byte of the fresh mapping, then unmapping it once.
        unsafe {
            std::ptr::write_volatile(p.cast::<u8>(), 1);
            assert_eq!(libc::munmap(p, size), 0, "munmap failed");
        }
    }
}

/// For the ground-truth helpers: their `N` numeric arguments; otherwise the usage line
/// (`usage`, the command and its arguments' names) on standard error, and exit status 2.
pub fn numeric_args<T: std::str::FromStr, const N: usize>(usage: &str) -> [T; N] {
    let args: Option<Vec<T>> = std::env::args().skip(1).map(|a| a.parse().ok()).collect();
    args.and_then(|a| a.try_into().ok()).unwrap_or_else(|| {
        eprintln!("usage: {usage}");
        std::process::exit(2)
    })
}

/// For the ground-truth helpers: flush standard output and end the process at once with
/// `_exit`, skipping the Rust runtime's clean-up, which would unmap the main thread's
/// signal stack (one more munmap after the measured work).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().lock().flush();
    // SAFETY: _exit ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}

struct RawStart<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    index: usize,
}

extern "C" fn raw_start(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` points into the `starts` of the RawThreads that created this thread, which
    // joins it before they are dropped.
    let s = unsafe { &*arg.cast::<RawStart>() };
    (s.f)(s.index);
    std::ptr::null_mut()
}

/// Threads made with `pthread_create` itself, for ground truth: a `std::thread` maps a
/// signal stack of its own as it starts (mmap + mprotect) and unmaps it as it ends (munmap),
/// writes that the workload did not ask for. These threads run `f(index)` and nothing else:
/// no allocation by the Rust runtime, no arena of their own unless `f` allocates, and stacks
/// that glibc caches and reuses (no mmap for a thread of a later wave of the same size).
/// Joined on `join` or drop.
pub struct RawThreads<'a> {
    ids: Vec<libc::pthread_t>,
    // Boxed: each thread holds a pointer to its own element.
    _starts: Box<[RawStart<'a>]>,
}

impl<'a> RawThreads<'a> {
    pub fn spawn(n: usize, stack_size: usize, f: &'a (dyn Fn(usize) + Sync)) -> Self {
        let starts: Box<[RawStart<'a>]> = (0..n).map(|index| RawStart { f, index }).collect();
        let mut ids = Vec::with_capacity(n);
        // SAFETY: plain pthread calls on a zeroed attribute object initialised first; each
        // thread's argument outlives it (joined before `starts` is dropped).
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_attr_init(&mut attr), 0);
            assert_eq!(libc::pthread_attr_setstacksize(&mut attr, stack_size), 0);
            for s in starts.iter() {
                let mut id: libc::pthread_t = 0;
                let arg = (s as *const RawStart).cast_mut().cast::<libc::c_void>();
                let rc = libc::pthread_create(&mut id, &attr, raw_start, arg);
                assert_eq!(rc, 0, "pthread_create failed");
                ids.push(id);
            }
            libc::pthread_attr_destroy(&mut attr);
        }
        RawThreads {
            ids,
            _starts: starts,
        }
    }

    pub fn join(self) {}
}

impl Drop for RawThreads<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            // SAFETY: each id is a joinable thread created above, joined once.
            unsafe { libc::pthread_join(id, std::ptr::null_mut()) };
        }
    }
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

/// The profiler under test: this build's, or the one `MMAPLOCK_PROF_BIN` names (to run the
/// tests against another build).
pub fn profiler_bin() -> PathBuf {
    match std::env::var_os("MMAPLOCK_PROF_BIN") {
        Some(p) => PathBuf::from(p),
        None => built("mmaplock-prof"),
    }
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

/// Builds the tests' N-API addon (`fixtures/addon/churn.c`) with gcc against the installed
/// Node headers, into `dir`.
pub fn build_addon(dir: &Path) -> PathBuf {
    let out = dir.join("churn.node");
    gcc(&out, "addon/churn.c", &[]);
    out
}

/// Builds the addon-library fixture into `dir`: `libmmaplock_spawner.so`
/// (`fixtures/addon/libspawner.c`, which starts a thread of its own) and `spawner.node`
/// (`fixtures/addon/spawner.c`), which needs it (DT_NEEDED, found through its rpath
/// `$ORIGIN`). Returns the addon.
pub fn build_spawner_addon(dir: &Path) -> PathBuf {
    gcc(
        &dir.join("libmmaplock_spawner.so"),
        "addon/libspawner.c",
        &["-Wl,-soname,libmmaplock_spawner.so"],
    );
    let out = dir.join("spawner.node");
    let lib_dir = format!("-L{}", dir.display());
    gcc(
        &out,
        "addon/spawner.c",
        &[&lib_dir, "-lmmaplock_spawner", "-Wl,-rpath,$ORIGIN"],
    );
    out
}

/// Compiles the fixture `source` into the shared object `out` (with Node's headers).
fn gcc(out: &Path, source: &str, link: &[&str]) {
    let status = Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-pthread",
            "-I/usr/include/node",
            "-o",
        ])
        .arg(out)
        .arg(fixture(source))
        .args(link)
        .status()
        .expect("gcc");
    assert!(status.success(), "building {source} failed");
}

/// `roles.js` (fixtures/roles.js) with known thread roles: 3 Workers reading a 64 KiB file
/// (written in `dir`) 300 times each, two libuv threadpool threads, two V8 platform threads.
/// The workload, ready, and its Workers' tids as it printed them.
pub fn roles_workload(dir: &Path) -> (Workload, Vec<u64>) {
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
    let mut cmd = Command::new("node");
    cmd.env("UV_THREADPOOL_SIZE", "2")
        .arg("--v8-pool-size=2")
        .arg(fixture("roles.js"))
        .args(["3", "300"])
        .arg(&file);
    let w = Workload::spawn(cmd);
    let workers = w.preamble_tids("workers");
    (w, workers)
}

/// In `roles.js`'s process entry (`pid`): its main thread is `main`, each of its `workers`
/// `worker` (whatever else each test checks of them).
pub fn assert_main_and_workers(p: &Value, pid: u32, workers: &[u64]) {
    let role_of = |tid: u64| find(p, "threads", "tid", tid).map(|t| t["role"].clone());
    assert_eq!(role_of(u64::from(pid)), Some("main".into()));
    for tid in workers {
        assert_eq!(
            role_of(*tid),
            Some("worker".into()),
            "Worker {tid}: {}",
            p["threads"]
        );
    }
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

/// A tool that `cargo xtask test` installs (`what` names it), or None with the calling test
/// recorded as skipped ([`skip_because`]; under CI, where it must be there, a failure).
pub fn installed_or_skip<T>(tool: Option<T>, what: &str) -> Option<T> {
    if tool.is_none() {
        assert!(
            !under_ci(),
            "{what} is not installed (cargo xtask test installs it)"
        );
        skip_because(&format!("{what} is not installed"));
    }
    tool
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

/// Asks `state` every `every` until it says done (`Ok`), and returns what it gave; once
/// `within` has passed, fails with what it said last (`Err`). A bound on a wait (the machine
/// may be slow), never a measure of time.
pub fn wait_until<T>(
    within: Duration,
    every: Duration,
    mut state: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match state() {
            Ok(v) => return v,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        std::thread::sleep(every);
    }
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
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
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
        let status = wait_timeout(&mut self.child, Duration::from_secs(120));
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
        let mut cmd = Command::new(profiler_bin());
        cmd.args(["--format", "json"])
            .args(args)
            .stdin(Stdio::null());
        Self::start_command(cmd)
    }

    /// Starts the profiler on `pid` (no interval lines) with one write's stack in `sample`
    /// sampled, folded into `folded` (`--stacks`) at the end.
    pub fn start_with_stacks(pid: u32, sample: u32, folded: &Path) -> Self {
        let (pid, sample) = (pid.to_string(), sample.to_string());
        Self::start(&[
            "-p",
            &pid,
            "-i",
            "0",
            "--stack-sample",
            &sample,
            "--stacks",
            folded.to_str().unwrap(),
        ])
    }

    /// Starts the profiler (or the agent) as `cmd` says (another user, capabilities, ...),
    /// its output read as [`start`](Self::start)'s, and waits until it is attached.
    pub fn start_command(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
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
                Err(_) => panic!(
                    "mmaplock-prof did not attach; exit {:?}, stderr: {:?}",
                    p.child.try_wait(),
                    p.stderr
                ),
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

    /// [`finish`](Self::finish), and the run must have succeeded.
    pub fn finish_ok(self, timeout: Duration) -> Finished {
        let out = self.finish(timeout);
        assert!(
            out.status.success(),
            "exit status {:?}: {}",
            out.status,
            out.stderr
        );
        out
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

/// Write acquisitions a mmap-churn process adds to its 2*T*N once the work starts: the
/// process's own exit (exit_mmap takes the lock for write once), and glibc trimming the
/// threads' malloc arenas and freeing thread stacks as they exit (0 to 2 per thread, seen
/// 1 + 0 to 4 for T = 4 here). Generous enough for other glibc versions, small against 2*T*N.
pub fn churn_slack(threads: u64) -> u64 {
    4 + 2 * threads
}

/// Checks a mmap-churn process's entry (`t` threads x `n` iterations, `pid`) against what it
/// did: its writes are 2*T*N plus at most [`churn_slack`], each worker thread made exactly 2N
/// (+ its exit's clean-up) and is `other` (started by Rust's std::thread, none of Node's),
/// and the main thread is `main`. Returns the process's write count.
pub fn check_churn_writes(p: &Value, pid: u32, t: u64, n: u64, what: &str) -> u64 {
    let (writes, _) = stats(p, "write");
    assert_churn_total(writes, t, n, what, "");
    let threads = p["threads"].as_array().unwrap();
    let busy: Vec<&Value> = threads
        .iter()
        .filter(|th| th["write"]["count"].as_u64().unwrap() >= 2 * n)
        .collect();
    assert_eq!(busy.len(), t as usize, "{what}: {threads:?}");
    for th in &busy {
        assert!(th["write"]["count"].as_u64().unwrap() <= 2 * n + 2, "{th}");
        assert_eq!(th["role"], "other", "{th}");
        assert_ne!(th["tid"], pid, "{th}");
    }
    let main = threads.iter().find(|th| th["tid"] == pid).expect("main");
    assert_eq!(main["role"], "main");
    writes
}

/// The write count of a mmap-churn process of `t` threads x `n` iterations (all its
/// threads', or those `what` names) against what it did: 2*T*N plus at most [`churn_slack`].
/// `context` follows the failure's message.
pub fn assert_churn_total(writes: u64, t: u64, n: u64, what: &str, context: &str) {
    let expected = 2 * t * n;
    let most = expected + churn_slack(t);
    eprintln!(
        "{what}: writes {writes}, expected {expected} + at most {}",
        churn_slack(t)
    );
    assert!(
        (expected..=most).contains(&writes),
        "{what}: writes {writes} not in {expected}..={most}{context}"
    );
}

/// Runs the profiler to completion with the given arguments (for usage errors and the like).
pub fn run_profiler(args: &[&str]) -> std::process::Output {
    run(args)
}

fn run<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> std::process::Output {
    Command::new(profiler_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run mmaplock-prof")
}

/// Runs a command of the profiler that reads files (`report`, `compare`) or runs workloads
/// of its own (`demo`, `study`) to completion, which must succeed; returns its standard
/// output.
pub fn run_ok<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "exit status {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// [`run_ok`] with `-f json`: its one JSON line.
pub fn run_json<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Value {
    let args: Vec<std::ffi::OsString> = args
        .into_iter()
        .map(|a| a.as_ref().to_owned())
        .chain(["-f".into(), "json".into()])
        .collect();
    let out = run_ok(&args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `mmaplock-prof report INPUT -f text --html PAGE`, which must succeed; its text (the
/// findings).
pub fn report_html(input: &Path, page: &Path) -> String {
    run_ok([
        OsStr::new("report"),
        input.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("text"),
        OsStr::new("--html"),
        page.as_os_str(),
    ])
}

/// Starts the profiler on `w` (`--pid`, JSON, plus `args`), lets the workload run to its end,
/// and returns what the profiler reported; the run must have ended by itself, successfully.
pub fn profile_workload(w: &mut Workload, args: &[&str]) -> Finished {
    let pid = w.pid.to_string();
    let mut all = vec!["--pid", pid.as_str()];
    all.extend_from_slice(args);
    let prof = Profiler::start(&all);
    w.go();
    let status = w.wait();
    assert!(status.success(), "workload {}: {status:?}", w.pid);
    // The target exited: the profiler ends by itself.
    prof.finish_ok(Duration::from_secs(60))
}

/// For a workload that takes commands (a Node fixture): `go`, then, once it says `done`, the
/// profiler stopped with SIGINT and the workload told to `exit`; what the profiler reported.
pub fn profile_until_done(w: &mut Workload, prof: Profiler) -> Finished {
    w.send("go");
    stop_when_done(w, prof)
}

/// [`profile_until_done`] of a workload already told to go.
pub fn stop_when_done(w: &mut Workload, prof: Profiler) -> Finished {
    assert_eq!(w.read_line(), "done");
    prof.signal(libc::SIGINT);
    let out = prof.finish(Duration::from_secs(60));
    w.send("exit");
    assert!(w.wait().success());
    out
}

impl Finished {
    /// The interval lines (all lines but the summary).
    pub fn intervals(&self) -> &[Value] {
        self.summary();
        &self.lines[..self.lines.len() - 1]
    }
}

/// Checks one STATS object of the contract, field by field.
pub fn check_stats(s: &Value, what: &str) {
    assert!(s["count"].is_u64(), "{what}.count: {s}");
    assert!(s["failed_trylocks"].is_u64(), "{what}.failed_trylocks");
    for d in ["wait_ns", "hold_ns"] {
        let h = &s[d];
        for f in ["sum", "max", "p50", "p90", "p99", "p999"] {
            assert!(h[f].is_u64(), "{what}.{d}.{f}: {h}");
        }
        assert!(h["mean"].is_number(), "{what}.{d}.mean");
        let buckets = h["buckets"].as_array().expect("buckets");
        let mut total = 0;
        let mut prev = 0;
        for b in buckets {
            let (ub, n) = (b[0].as_u64().unwrap(), b[1].as_u64().unwrap());
            assert!(
                ub.is_power_of_two() && ub > prev && n > 0,
                "{what}.{d}: {b}"
            );
            prev = ub;
            total += n;
        }
        assert_eq!(
            total,
            s["count"].as_u64().unwrap(),
            "{what}.{d} bucket total"
        );
        let (p50, p99, max) = (h["p50"].as_u64(), h["p99"].as_u64(), h["max"].as_u64());
        assert!(p50 <= p99 && p99 <= max, "{what}.{d} percentiles ordered");
    }
}

/// The reasons an acquisition can be lost, each counted in `lost` (docs/report-format.md);
/// `lost.events` is their sum. `map_full` and `stacks` are counted apart.
pub const LOST_EVENT_REASONS: [&str; 5] = [
    "nested",
    "no_state",
    "ring_full",
    "exit_flush",
    "exit_pending",
];

/// Checks a report line's `lost` object and returns `lost.events`. `exit_pending` (threads
/// still exiting when the run ended) is a summary figure: an interval line may omit it.
pub fn check_lost(report: &Value) -> u64 {
    let lost = &report["lost"];
    let summary = report["type"] == "summary";
    for k in ["events", "map_full", "stacks"]
        .iter()
        .chain(LOST_EVENT_REASONS.iter())
    {
        let optional = *k == "exit_pending" && !summary && lost[*k].is_null();
        assert!(lost[*k].is_u64() || optional, "lost.{k}: {lost}");
    }
    let events = lost["events"].as_u64().unwrap();
    let sum: u64 = LOST_EVENT_REASONS
        .iter()
        .map(|k| lost[*k].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(events, sum, "lost.events is the sum of its reasons: {lost}");
    events
}

/// The sum of a metric's samples in a Prometheus text exposition whose labels contain all of
/// `with` (e.g. `process="node"`), as a count.
pub fn metric_sum(text: &str, metric: &str, with: &[&str]) -> u64 {
    metric_f64(text, metric, with) as u64
}

/// The same, as a number (seconds and the like).
pub fn metric_f64(text: &str, metric: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// In folded stacks: at least `min` sampled `mmap` writes, nine in ten or more of them through
/// a frame containing `needle`.
pub fn assert_mmaps_named(folded: &str, needle: &str, min: u64, what: &str) {
    let (sampled, named) = mmap_samples(folded, needle);
    eprintln!("{what}: {sampled} sampled mmaps, {named} through {needle}");
    assert!(sampled >= min, "{sampled} sampled mmaps");
    assert!(
        named * 10 >= sampled * 9,
        "{needle} in {named} of {sampled} sampled mmaps"
    );
}

/// In folded stacks (`--stacks`): sampled `mmap` writes (innermost frame mmap), and how many of them have `needle`.
pub fn mmap_samples(folded: &str, needle: &str) -> (u64, u64) {
    let mut all = (0, 0);
    for l in folded.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        let innermost = stack.rsplit(';').next().unwrap_or("");
        if innermost.contains("mmap") && !innermost.contains("munmap") {
            all.0 += n;
            if stack.contains(needle) {
                all.1 += n;
            }
        }
    }
    all
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
pub fn metric_gauge(text: &str, metric: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{metric} "))?.parse().ok())
        .unwrap_or_else(|| panic!("no {metric} in {text}"))
}
