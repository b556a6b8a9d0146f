//! What a reader that falls behind costs the profile, and what the writer thread costs: the
//! one-shot profiler at `-i 0.1` (stacks sampled 1 write in 64, the default) on thread churn
//! (`thread-waves` 100 x 4 x 900: 720,000 writes), its standard output a pipe read at once or
//! left unread for 10 s. What it kept of the sampled stacks and of the interval lines, its
//! CPU time (from `wait4`), and the writer thread's own with the reader prompt (the thread
//! named `output`, read from /proc every 0.1 s: its last reading before the profiler exits).

use std::{
    io::{Read, Write},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    capture::started_with_stdout,
    stats::{Spread, json_of, show},
    workload::start_ready,
};

/// How long the held reader leaves the pipe unread (the workload takes about 4.5 s).
const HOLD: Duration = Duration::from_secs(10);

/// One run.
#[derive(Clone, Debug)]
pub struct ReaderRun {
    /// Which build of the profiler: this one, or the baseline given.
    pub build: &'static str,
    pub held: bool,
    /// Sampled stacks kept (the target's `dsos`) and dropped (`lost.stacks`).
    pub sampled: u64,
    pub dropped: u64,
    /// Interval lines received; made (`intervals`) and lost (`lost.output`), where said.
    pub lines: u64,
    pub intervals: Option<u64>,
    pub lost_lines: Option<u64>,
    /// The profiler's CPU time, all threads, and its writer thread's.
    pub cpu: Duration,
    pub writer_cpu: Option<Duration>,
    /// The stack copier thread's (`stack-copier`: the sampled stacks' ring copied out).
    pub copier_cpu: Option<Duration>,
}

/// The CPU time of the thread named `name` of `pid`, if it has one, in nanoseconds
/// (`schedstat`: the scheduler's own account, where `stat` counts 10 ms ticks).
fn thread_cpu(pid: u32, name: &str) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            return Some(Duration::from_nanos(
                s.split_whitespace().next()?.parse().ok()?,
            ));
        }
    }
    None
}

/// Waits for a child's end, and its CPU time (user and system, all threads), from `wait4`.
fn wait_with_cpu(pid: u32) -> Result<Duration> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pointers are to live locals.
    if unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) } < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// One run of `prof`; the helper is the pinned one beside `pinned`.
fn one(build: &'static str, prof: &Path, pinned: &Path, held: bool) -> Result<ReaderRun> {
    let bin = pinned.parent().context("bin dir")?;
    let (mut w, mut wout) =
        start_ready(Command::new(bin.join("thread-waves")).args(["100", "4", "900", "0"]))?;
    let pid = w.0.id().to_string();
    let mut cmd = Command::new(prof);
    cmd.args(["-p", &pid, "-i", "0.1", "-f", "json"])
        .stdout(Stdio::piped());
    let mut p = started_with_stdout(cmd, "attached in")?;
    let ppid = p.0.id();
    let mut out = p.0.stdout.take().context("stdout")?;
    let reader = std::thread::spawn(move || {
        if held {
            std::thread::sleep(HOLD);
        }
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writer_cpu = Arc::new(Mutex::new(None));
    let copier_cpu = Arc::new(Mutex::new(None));
    let poller = {
        let (stop, writer_cpu, copier_cpu) = (stop.clone(), writer_cpu.clone(), copier_cpu.clone());
        std::thread::spawn(move || {
            // Held, the writes come in a burst as the profiler exits, after the last reading.
            while !held && !stop.load(Ordering::Relaxed) {
                if let Some(t) = thread_cpu(ppid, "output") {
                    *writer_cpu.lock().unwrap() = Some(t);
                }
                if let Some(t) = thread_cpu(ppid, "stack-copier") {
                    *copier_cpu.lock().unwrap() = Some(t);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    w.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut rest = String::new();
    let _ = wout.read_to_string(&mut rest);
    let _ = w.0.wait();
    // The target exited: the profiler ends by itself, once its reader has taken everything.
    let cpu = wait_with_cpu(ppid)?;
    // Reaped: its guard must not signal the pid again.
    let _reaped = std::mem::ManuallyDrop::new(p);
    stop.store(true, Ordering::Relaxed);
    let _ = poller.join();
    let text = reader.join().map_err(|_| anyhow::anyhow!("reader"))?;
    let lines: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("the profiler's lines")?;
    let s = lines.last().context("no summary")?;
    let target = (s["processes"].as_array().into_iter().flatten())
        .find(|x| x["pid"].as_u64() == pid.parse().ok())
        .context("the target in the summary")?;
    let sampled = (target["dsos"].as_array().into_iter().flatten())
        .map(|d| d["write"]["count"].as_u64().unwrap_or(0))
        .sum();
    let writer_cpu = *writer_cpu.lock().unwrap();
    let copier_cpu = *copier_cpu.lock().unwrap();
    Ok(ReaderRun {
        build,
        held,
        sampled,
        dropped: s["lost"]["stacks"].as_u64().unwrap_or(0),
        lines: lines.len() as u64 - 1,
        intervals: s["intervals"].as_u64(),
        lost_lines: s["lost"]["output"].as_u64(),
        cpu,
        writer_cpu,
        copier_cpu,
    })
}

/// `rounds` rounds, each with the reader prompt, then held; with a `baseline` build of the
/// profiler (one before a change), each runs it too, interleaved.
pub fn run(rounds: usize, prof: &Path, baseline: Option<&Path>) -> Result<Vec<ReaderRun>> {
    let mut builds = vec![("this build", prof)];
    builds.extend(baseline.map(|b| ("baseline", b)));
    let mut runs = Vec::new();
    for round in 0..rounds {
        for held in [false, true] {
            for &(build, bin) in &builds {
                let r = one(build, bin, prof, held)?;
                eprintln!(
                    "reader round {}/{rounds}, {build}, {}: {} of {} sampled stacks dropped; {} interval lines received, {:?} lost, {:?} made; CPU {:.2} s, writer {:?}",
                    round + 1,
                    if held { "held 10 s" } else { "prompt" },
                    r.dropped,
                    r.sampled + r.dropped,
                    r.lines,
                    r.lost_lines,
                    r.intervals,
                    r.cpu.as_secs_f64(),
                    r.writer_cpu
                );
                runs.push(r);
            }
        }
    }
    Ok(runs)
}

/// The section's JSON and markdown.
pub fn summarize(runs: &[ReaderRun]) -> (Value, String) {
    let mut md = String::from(
        "## A reader that falls behind (the writer thread)\n\n\
         The one-shot profiler at `-i 0.1` (1 write in 64 sampled) on thread churn \
         (thread-waves 100 x 4 x 900: 720,000 writes), its standard output a pipe read at once \
         or left unread for 10 s; median (min - max) over the rounds. The writer's CPU is the \
         thread `output`'s, read every 0.1 s until the profiler exits, with the reader \
         prompt (held, its writes come in a burst as the profiler exits, after the last \
         reading; none: a build without it), and so is the stack copier's (`stack-copier`). A baseline is another build of the profiler, given by `--reader-baseline`.\n\n\
         | build | reader | sampled stacks dropped (%) | interval lines received | lost (`lost.output`) | profiler CPU (s) | writer thread CPU (ms) | stack copier CPU (ms) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut rows = Vec::new();
    for (build, held) in ["this build", "baseline"]
        .into_iter()
        .flat_map(|b| [(b, false), (b, true)])
    {
        let rs: Vec<&ReaderRun> = (runs.iter())
            .filter(|r| r.held == held && r.build == build)
            .collect();
        if rs.is_empty() {
            continue;
        }
        let sp = |f: &dyn Fn(&ReaderRun) -> f64| Spread::of(rs.iter().map(|r| f(r)));
        let dropped = sp(&|r| 100.0 * r.dropped as f64 / (r.sampled + r.dropped).max(1) as f64);
        let lines = sp(&|r| r.lines as f64);
        let lost = sp(&|r| r.lost_lines.map_or(f64::NAN, |n| n as f64));
        let cpu = sp(&|r| r.cpu.as_secs_f64());
        let writer = sp(&|r| r.writer_cpu.map_or(f64::NAN, |t| t.as_secs_f64() * 1e3));
        let copier = sp(&|r| r.copier_cpu.map_or(f64::NAN, |t| t.as_secs_f64() * 1e3));
        let reader = if held {
            "unread for 10 s"
        } else {
            "read at once"
        };
        md.push_str(&format!(
            "| {build} | {reader} | {} | {} | {} | {} | {} | {} |\n",
            show(dropped, 2),
            show(lines, 0),
            show(lost, 0),
            show(cpu, 2),
            show(writer, 0),
            show(copier, 0)
        ));
        rows.push(json!({
            "build": build, "reader": reader, "stacks_dropped_pct": json_of(dropped, 2),
            "lines_received": json_of(lines, 0), "lines_lost": json_of(lost, 0),
            "profiler_cpu_s": json_of(cpu, 3), "writer_cpu_ms": json_of(writer, 1),
            "copier_cpu_ms": json_of(copier, 1),
        }));
    }
    (json!({ "runs": rows }), md)
}
