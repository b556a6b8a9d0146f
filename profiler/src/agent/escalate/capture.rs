//! One capture: the one-shot profiler run as a child process on one process for the capture's
//! length, writing into a directory of its own. A child, not a second session in the agent:
//! its full-mode programs are attached only while it runs, its memory goes back when it ends,
//! nothing it does can stall `/metrics` or take the agent down, and what it writes is exactly
//! the one-shot's report (its summary complete even when the process exits first).
//!
//! Once it has ended, the capture is given its verdict: why it was taken (the window that
//! crossed, its functions and findings) and how its own time compared, measured by the agent
//! as the crossing was (`trigger`). A second child, `mmaplock-prof report --trigger`, writes
//! it into the summary and renders the page from the report, so that a large report is read
//! and drawn outside the agent.

use std::{
    fs,
    io::{self, BufRead, BufReader, Write},
    os::unix::{fs::DirBuilderExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use super::dirs::{dir_name, prune, size_of_dir};
use crate::{
    kernel::btf::TracepointLayout,
    output::report::{Trigger, TriggerMeasure, verdict_line},
    vocab::ids::ProcId,
};

/// What the child profiles in, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub args: Vec<&'static str>,
    pub why: &'static str,
}

impl Plan {
    /// Full mode with `--blockers`, except where attaching full mode's tracepoints makes the
    /// kernel format a cgroup path on every acquisition of every process on the host (their
    /// `memcg_path` layout, before Linux 6.14): contention mode there.
    pub fn for_kernel(layout: TracepointLayout) -> Plan {
        match layout {
            TracepointLayout::WithMemcgPath => Plan {
                args: vec!["--mode", "contention"],
                why: "contention mode: in full mode this kernel's mmap_lock tracepoints format a memory cgroup path on every acquisition of every process (before Linux 6.14)",
            },
            _ => Plan {
                args: vec!["--mode", "full", "--blockers"],
                why: "full mode with --blockers",
            },
        }
    }
}

/// What came of a crossing that was captured, as `mmaplock_escalations_total`'s `reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Written whole.
    Captured,
    /// The process was gone before the capture could begin (or its pid was another's).
    Exited,
    /// The directory could not hold it (a full disk, a quota).
    NoSpace(String),
    /// Larger than `--escalate-budget` alone: removed.
    OverBudget(u64),
    /// The capture's profiler could not run or failed.
    Failed(String),
}

impl Outcome {
    pub fn reason(&self) -> &'static str {
        match self {
            Outcome::Captured => "captured",
            Outcome::Exited => "exited",
            Outcome::NoSpace(_) => "no_space",
            Outcome::OverBudget(_) => "over_budget",
            Outcome::Failed(_) => "failed",
        }
    }

    fn of_io(e: &io::Error) -> Outcome {
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => Outcome::NoSpace(e.to_string()),
            _ => Outcome::Failed(e.to_string()),
        }
    }
}

/// Where and how long captures are written.
#[derive(Clone, Debug)]
pub struct Settings {
    pub root: PathBuf,
    pub length: Duration,
    pub budget: u64,
    /// The profiler to run (the agent's own executable).
    pub exe: PathBuf,
    /// The agent's `--stack-sample`, which the capture samples at too.
    pub stack_sample: u32,
}

/// Where a capture is.
enum Stage {
    /// Its profiler runs.
    Profiling,
    /// Its profiler ended with `Captured`; `report --trigger` writes the verdict into its
    /// summary and draws its page (what it says read as the profiler's is).
    Rendering(Child, Option<JoinHandle<String>>),
}

/// A capture running.
pub struct Capture {
    pub proc: ProcId,
    /// The process's labels, as its metrics carry them.
    pub labels: (String, String),
    pub dir: PathBuf,
    /// Its window that crossed the threshold.
    pub crossed: super::Windowed,
    /// Why it was taken, and (once it has ended) how it compares.
    pub trigger: Box<Trigger>,
    /// The process's readings while its profiler ran (its length at most), as the agent
    /// measured the crossing.
    pub during: super::Windowed,
    /// When it began.
    pub began: std::time::Instant,
    child: Child,
    stage: Stage,
    /// Reads its profiler's standard error; gives its last line once it is closed.
    said: Option<JoinHandle<String>>,
}

/// The trigger handed to `report --trigger` (removed once it is in the summary).
pub const TRIGGER_FILE: &str = "trigger.json";

/// Room kept for the capture about to be written when pruning before it: 15 s of a process
/// of 4 contended Workers wrote 706 KiB, most of it its interval lines; a process of
/// hundreds of threads writes more.
const ROOM: u64 = 16 << 20;

impl Capture {
    /// Begins a capture of `proc` (named `comm`): prunes the oldest captures to make room,
    /// makes its directory, writes `before.pb.gz` with `before`, and starts the profiler.
    pub fn begin(
        s: &Settings,
        proc: ProcId,
        comm: &str,
        labels: (String, String),
        (crossed, trigger): (super::Windowed, Box<Trigger>),
        plan: &Plan,
        before: impl FnOnce(&mut Vec<u8>) -> io::Result<()>,
    ) -> Result<Capture, Outcome> {
        prune(&s.root, s.budget, ROOM.min(s.budget / 2), None);
        let dir = s.root.join(dir_name(SystemTime::now(), comm, proc.pid));
        let fail = |e: io::Error, dir: &Path| {
            let _ = fs::remove_dir_all(dir);
            Outcome::of_io(&e)
        };
        fs::DirBuilder::new()
            .mode(0o750)
            .create(&dir)
            .map_err(|e| Outcome::of_io(&e))?;
        let mut bytes = Vec::new();
        before(&mut bytes).map_err(|e| fail(e, &dir))?;
        (fs::File::create(dir.join("before.pb.gz")).and_then(|mut f| f.write_all(&bytes)))
            .map_err(|e| fail(e, &dir))?;
        let path = |f: &str| dir.join(f).into_os_string();
        let mut cmd = Command::new(&s.exe);
        cmd.arg("--pid")
            .arg(proc.pid.to_string())
            .arg("--pid-start-ticks")
            .arg(proc.start.to_string())
            .arg("--duration")
            .arg(s.length.as_secs_f64().to_string())
            .args(["--interval", "1", "--format", "json", "--quiet"])
            .arg("--output")
            .arg(path("report.ndjson"))
            .arg("--pprof")
            .arg(path("profile.pb.gz"))
            .arg("--stack-sample")
            .arg(s.stack_sample.max(1).to_string())
            .args(&plan.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl in the child between fork and exec, async-signal-safe.
        unsafe {
            // The capture ends, its report complete, if the agent dies without stopping it.
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| fail(e, &dir))?;
        let said = relay(&mut child, proc.pid);
        Ok(Capture {
            proc,
            labels,
            dir,
            crossed,
            trigger,
            during: super::Windowed::default(),
            began: std::time::Instant::now(),
            child,
            stage: Stage::Profiling,
            said,
        })
    }

    /// Whether its profiler still runs (the agent's readings of the process then count as
    /// the capture's).
    pub fn profiling(&self) -> bool {
        matches!(self.stage, Stage::Profiling)
    }

    /// Its outcome once it is over (None while it runs or its page is drawn).
    pub fn poll(&mut self, s: &Settings) -> Option<Outcome> {
        match &mut self.stage {
            Stage::Profiling => match self.child.try_wait() {
                Ok(None) => None,
                Ok(Some(status)) => self.ended(status, s),
                Err(e) => Some(Outcome::Failed(e.to_string())),
            },
            Stage::Rendering(r, _) => match r.try_wait() {
                Ok(None) => None,
                Ok(Some(status)) => Some(self.rendered(Some(status))),
                Err(_) => Some(self.rendered(None)),
            },
        }
    }

    /// Stops it early (the agent is stopping): its profiler ends as on SIGTERM, its report
    /// complete, and it is given its verdict.
    pub fn stop(&mut self, s: &Settings) -> Outcome {
        if self.profiling() {
            // SAFETY: plain kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let out = match self.child.wait() {
                Ok(status) => self.ended(status, s),
                Err(e) => Some(Outcome::Failed(e.to_string())),
            };
            if let Some(out) = out {
                return out;
            }
        }
        match &mut self.stage {
            Stage::Rendering(r, _) => {
                let status = r.wait().ok();
                self.rendered(status)
            }
            Stage::Profiling => Outcome::Failed("stopped".into()),
        }
    }

    /// Its profiler ended: what came of it, or (captured) its verdict's writing begun.
    fn ended(&mut self, status: ExitStatus, s: &Settings) -> Option<Outcome> {
        let out = self.settle(status, s.budget);
        if out != Outcome::Captured {
            return Some(out);
        }
        match self.give_verdict(s) {
            Ok(mut child) => {
                let said = relay(&mut child, self.proc.pid);
                self.stage = Stage::Rendering(child, said);
                None
            }
            Err(e) => {
                eprintln!(
                    "mmaplock-prof agent: capture of {}: its verdict could not be written: {e}",
                    self.proc.pid
                );
                // A disk that filled before the verdict: the capture is lost as any other
                // that found no space (its directory removed, counted as `no_space`).
                match Outcome::of_io(&e) {
                    out @ Outcome::NoSpace(_) => {
                        let _ = fs::remove_dir_all(&self.dir);
                        Some(out)
                    }
                    _ => Some(Outcome::Captured),
                }
            }
        }
    }

    /// The trigger with the capture's own measure, in `trigger.json`, and `report --trigger`
    /// started on it.
    fn give_verdict(&mut self, s: &Settings) -> io::Result<Child> {
        let d = self.during;
        self.trigger.capture = Some(TriggerMeasure {
            share: d.reading.share(),
            wait_ns: d.reading.wait_ns,
            alive_ns: d.reading.alive_ns,
            waits: d.reading.waits,
            window_s: d.span.as_secs_f64(),
        });
        self.trigger.passed = Some(d.reading.share() < self.trigger.threshold);
        self.trigger.verdict = verdict_line(&self.trigger);
        let path = self.dir.join(TRIGGER_FILE);
        fs::write(&path, serde_json::to_vec(&self.trigger)?)?;
        let mut cmd = Command::new(&s.exe);
        cmd.arg("report")
            .arg(self.dir.join("report.ndjson"))
            .arg("--trigger")
            .arg(&path)
            .arg("--html")
            .arg(self.dir.join("report.html"))
            .args(["--format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.spawn()
    }

    /// Its page drawn, or not: the report stays, without its verdict, unless the disk
    /// filled (the summary is replaced whole, so the report is intact, but a capture that
    /// found no space is removed and counted `no_space` at whichever step it found none).
    fn rendered(&mut self, status: Option<ExitStatus>) -> Outcome {
        let last = match &mut self.stage {
            Stage::Rendering(_, said) => said.take().and_then(|h| h.join().ok()),
            Stage::Profiling => None,
        }
        .unwrap_or_default();
        if !status.is_some_and(|s| s.success()) {
            eprintln!(
                "mmaplock-prof agent: capture of {}: its verdict and page could not be written ({})",
                self.proc.pid,
                status.map_or("not run".into(), |s| s.to_string())
            );
            if says_no_space(&last) {
                let _ = fs::remove_dir_all(&self.dir);
                return Outcome::NoSpace(last);
            }
        }
        let _ = fs::remove_file(self.dir.join(TRIGGER_FILE));
        Outcome::Captured
    }

    fn settle(&mut self, status: ExitStatus, budget: u64) -> Outcome {
        // Its standard error closed when it exited: read to its end.
        let last = (self.said.take())
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let out = if status.success() {
            match complete(&self.dir.join("report.ndjson")) {
                Ok(true) => Outcome::Captured,
                Ok(false) => Outcome::Failed("report.ndjson has no summary".into()),
                Err(e) => Outcome::of_io(&e),
            }
        } else if says_no_space(&last) {
            Outcome::NoSpace(last)
        } else if last.contains("no process with pid") || last.contains("is not the process it was")
        {
            Outcome::Exited
        } else {
            Outcome::Failed(if last.is_empty() {
                status.to_string()
            } else {
                last
            })
        };
        let size = size_of_dir(&self.dir);
        match out {
            Outcome::Captured if size > budget => {
                let _ = fs::remove_dir_all(&self.dir);
                Outcome::OverBudget(size)
            }
            Outcome::Captured => {
                prune(
                    self.dir.parent().unwrap_or(&self.dir),
                    budget,
                    0,
                    Some(&self.dir),
                );
                out
            }
            // Nothing worth keeping: a capture that did not happen leaves no directory.
            Outcome::Exited | Outcome::NoSpace(_) => {
                let _ = fs::remove_dir_all(&self.dir);
                out
            }
            // A profiler that failed keeps what it wrote of its report, if anything (its
            // message is on the agent's standard error).
            _ if !self.dir.join("report.ndjson").exists() => {
                let _ = fs::remove_dir_all(&self.dir);
                out
            }
            _ => out,
        }
    }
}

/// What a child of the capture says goes to the agent's own log (not into the directory: a
/// full disk would stop it saying why); its last line is kept for the outcome.
fn relay(child: &mut Child, pid: u32) -> Option<JoinHandle<String>> {
    child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            let mut last = String::new();
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("mmaplock-prof agent: capture of {pid}: {l}");
                last = l;
            }
            last
        })
    })
}

/// Whether a child's last line is its file system's refusal for room (a full disk, a quota:
/// the error's text as the standard library gives it).
fn says_no_space(last: &str) -> bool {
    last.contains("No space left") || last.contains("quota exceeded")
}

/// Whether a run's NDJSON ends with its summary.
fn complete(path: &Path) -> io::Result<bool> {
    let text = fs::read_to_string(path)?;
    Ok(text
        .lines()
        .last()
        .is_some_and(|l| l.starts_with("{\"type\":\"summary\"")))
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
