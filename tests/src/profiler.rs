//! The profiler under test: `mmaplock-prof` started and attached (killed on drop), or run to
//! completion; what a finished run printed, its lines parsed as JSON.

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
};

use serde_json::Value;

use crate::{
    Workload, profiler_bin,
    workload::{start, wait_child},
};

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

    /// The interval lines (all lines but the summary).
    pub fn intervals(&self) -> &[Value] {
        self.summary();
        &self.lines[..self.lines.len() - 1]
    }
}

/// A running `mmaplock-prof` with JSON output.
pub struct Profiler {
    child: Child,
    stderr_rx: mpsc::Receiver<String>,
    stderr: Vec<String>,
    stdout_thread: Option<std::thread::JoinHandle<String>>,
    /// While held, nothing reads the profiler's standard output ([`Self::start_unread`]).
    reader_held: Option<mpsc::Sender<()>>,
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

    /// [`start`](Self::start), but nothing reads its standard output (a pipe: once its
    /// buffer is full, the profiler's writes block) until [`resume_reading`](Self::resume_reading).
    pub fn start_unread(args: &[&str]) -> Self {
        let mut cmd = Command::new(profiler_bin());
        cmd.args(["--format", "json"])
            .args(args)
            .stdin(Stdio::null());
        Self::start_with(cmd, true)
    }

    /// Reads the standard output of a profiler started by [`start_unread`](Self::start_unread)
    /// from now on.
    pub fn resume_reading(&mut self) {
        self.reader_held = None;
    }

    /// Starts the profiler (or the agent) as `cmd` says (another user, capabilities, ...),
    /// its output read as [`start`](Self::start)'s, and waits until it is attached.
    pub fn start_command(cmd: Command) -> Self {
        Self::start_with(cmd, false)
    }

    fn start_with(mut cmd: Command, held: bool) -> Self {
        let mut child = start(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()));
        let stdout = child.stdout.take().expect("stdout");
        let (hold, held_rx) = mpsc::channel::<()>();
        let stdout_thread = std::thread::spawn(move || {
            // Until the sender is dropped (never sent on).
            let _ = held_rx.recv();
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
            reader_held: held.then_some(hold),
        };
        // It attaches or ends (stderr then closes): no bound on how long attaching takes.
        loop {
            match p.stderr_rx.recv() {
                Ok(l) => {
                    let attached = l.contains("attached in");
                    p.stderr.push(l);
                    if attached {
                        return p;
                    }
                }
                Err(_) => panic!(
                    "mmaplock-prof did not attach; exit {:?}, stderr: {:?}",
                    p.child.wait(),
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
    pub fn finish_ok(self) -> Finished {
        let out = self.finish();
        assert!(
            out.status.success(),
            "exit status {:?}: {}",
            out.status,
            out.stderr
        );
        out
    }

    /// Waits for the profiler to end by itself (duration, targets' exit, signal): no bound.
    pub fn finish(mut self) -> Finished {
        // A profiler still writing its output ends once it is read.
        self.resume_reading();
        let status = wait_child(&mut self.child);
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

/// The text report of a run's output, as a user reads it: `out` written to `file`, then
/// `mmaplock-prof report FILE -f text`, which must succeed.
pub fn report_text(out: &Finished, file: &Path) -> String {
    std::fs::write(file, &out.raw_stdout).expect("write the run's output");
    run_ok([
        OsStr::new("report"),
        file.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("text"),
    ])
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
    prof.finish_ok()
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
    let out = prof.finish();
    w.send("exit");
    assert!(w.wait().success());
    out
}

/// With `MMAPLOCK_PROF_TEST_KEEP=DIR`, a run's output is kept there (`NAME-N.ndjson`, with
/// `NAME-N.txt` saying what ran), for `mmaplock-prof report` to show it as a user sees it.
pub fn keep_output(out: &Finished, name: &str, what: &str) {
    let Some(dir) = std::env::var_os("MMAPLOCK_PROF_TEST_KEEP") else {
        return;
    };
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir).expect("MMAPLOCK_PROF_TEST_KEEP is a directory");
    let n = (0..)
        .find(|n| !dir.join(format!("{name}-{n}.ndjson")).exists())
        .unwrap();
    std::fs::write(dir.join(format!("{name}-{n}.ndjson")), &out.raw_stdout).unwrap();
    std::fs::write(dir.join(format!("{name}-{n}.txt")), what).unwrap();
}
