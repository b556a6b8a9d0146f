//! What the agent costs an operator, as the agent runs on a host: interleaved rounds of the
//! same Node workloads with no tracing, the agent in each mode (its default selection: every
//! node process), and the floors beside them (mmaplock-prof's empty and clock-only programs on
//! the mmap_lock tracepoints, system-wide). A round's figures are its throughput (operations
//! per second of wall time) and its CPU per operation: everything its node processes used
//! (the BPF programs run in their threads, so they are in it) plus the tracer's own process.
//! Each is a ratio to the mean of the same round's two untraced runs; medians with their
//! spread. The second untraced run against the first (an A/A comparison) shows how far two
//! runs with nothing attached differ on this machine: the resolution of every other row.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStderr, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::procfs;

pub mod accounted;
mod summary;
use crate::workspace_root;
pub use summary::summarize;

/// What runs beside the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracer {
    None,
    /// No tracing again, elsewhere in the round: the baseline is the mean of both, and the
    /// two against each other are the machine's own noise.
    NoneAgain,
    /// `mmaplock-prof agent` (its default selection), contention mode: the default.
    AgentContention,
    /// The same in full mode: every acquisition timed.
    AgentFull,
    /// `mmaplock-prof --floor`: empty programs on the three mmap_lock tracepoints.
    Floor,
    /// `mmaplock-prof --floor-clock`: one clock read per tracepoint run.
    FloorClock,
    /// The agent in contention mode with `--escalate-dir` and a threshold nothing crosses:
    /// what leaving the trigger on costs (it samples stacks for `before.pb.gz`).
    AgentEscalateIdle,
    /// The same with a threshold every process crosses: captures run (one at a time, one per
    /// process) during the workload; its slowdown is the cost of captures to the processes.
    AgentEscalating,
    /// Every feature armed: the trigger on (nothing crossing), the pprof endpoint, the
    /// JavaScript functions' series, and pushes every 5 s (3 times the default's rate, so
    /// that a run of a few seconds pushes at all) to a Pyroscope ingest path and an OTLP
    /// Collector on this host ([`PUSH_PORTS`]).
    AgentArmed,
}

/// Where [`Tracer::AgentArmed`] pushes: the push tests' Collector (OTLP/HTTP) and Pyroscope
/// ingest stand-in, started by the accounted runs (`accounted.rs`).
pub const PUSH_PORTS: (u16, u16) = (47318, 47040);

/// Where the capturing agent writes (emptied before each run; its captures' bytes are read
/// by [`summary`]).
pub const CAPTURES_DIR: &str = "/tmp/mmaplock-bench-captures";

impl Tracer {
    pub const ALL: [Tracer; 8] = [
        Tracer::None,
        Tracer::AgentContention,
        Tracer::AgentFull,
        Tracer::NoneAgain,
        Tracer::Floor,
        Tracer::FloorClock,
        Tracer::AgentEscalateIdle,
        Tracer::AgentEscalating,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tracer::None => "no tracing",
            Tracer::NoneAgain => "no tracing, again (A/A: against the first)",
            Tracer::AgentContention => "agent, contention mode (default)",
            Tracer::AgentFull => "agent, full mode",
            Tracer::Floor => "floor (empty programs)",
            Tracer::FloorClock => "clock floor (one clock read)",
            Tracer::AgentEscalateIdle => "agent, contention mode, --escalate-dir, nothing crossing",
            Tracer::AgentEscalating => {
                "agent, contention mode, capturing every process (--escalate-at 0.01)"
            }
            Tracer::AgentArmed => {
                "agent, contention mode, every feature armed (--escalate-dir, --pprof, --js-functions 20, --pyroscope and --otlp every 5 s)"
            }
        }
    }

    /// mmaplock-prof's arguments, and the line on its standard error that says it attached.
    fn command(self) -> Option<(&'static [&'static str], &'static str)> {
        match self {
            Tracer::None | Tracer::NoneAgain => None,
            Tracer::AgentContention => Some((
                &["agent", "--listen", "127.0.0.1:0", "--mode", "contention"],
                "serving",
            )),
            Tracer::AgentFull => Some((
                &["agent", "--listen", "127.0.0.1:0", "--mode", "full"],
                "serving",
            )),
            Tracer::Floor => Some((&["--floor", "-i", "0", "-f", "json"], "attached in")),
            Tracer::FloorClock => {
                Some((&["--floor-clock", "-i", "0", "-f", "json"], "attached in"))
            }
            Tracer::AgentEscalateIdle => Some((
                &[
                    "agent",
                    "--listen",
                    "127.0.0.1:0",
                    "--mode",
                    "contention",
                    "--escalate-dir",
                    "/tmp/mmaplock-bench-escalate",
                    "--escalate-at",
                    "100",
                ],
                "serving",
            )),
            Tracer::AgentEscalating => Some((
                &[
                    "agent",
                    "--listen",
                    "127.0.0.1:0",
                    "--mode",
                    "contention",
                    "--escalate-dir",
                    CAPTURES_DIR,
                    "--escalate-at",
                    "0.01",
                    "--escalate-window",
                    "2",
                    "--escalate-for",
                    "5",
                ],
                "serving",
            )),
            Tracer::AgentArmed => Some((
                &[
                    "agent",
                    "--listen",
                    "127.0.0.1:0",
                    "--mode",
                    "contention",
                    "--escalate-dir",
                    "/tmp/mmaplock-bench-escalate",
                    "--escalate-at",
                    "100",
                    "--pprof",
                    "--js-functions",
                    "20",
                    "--otlp",
                    "http://127.0.0.1:47318",
                    "--pyroscope",
                    "http://127.0.0.1:47040",
                    "--push-interval",
                    "5",
                ],
                "serving",
            )),
        }
    }
}

/// The workloads an agent meets on a Node host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// 20 short node processes, two at a time, each 2 Workers x 2000 readFileSync of 64 KiB:
    /// processes the agent selects at exec and drops at exit all the time.
    ShortProcesses,
    /// 4 node processes one after another, each 4 Workers x 3000 readFileSync of 64 KiB: a
    /// round is several processes long, so that one run's contention does not decide it.
    Workers,
}

impl Load {
    pub const ALL: [Load; 2] = [Load::ShortProcesses, Load::Workers];

    pub fn name(self) -> &'static str {
        match self {
            Load::ShortProcesses => "20 short node processes (2 Workers each)",
            Load::Workers => "4 node processes of 4 Workers",
        }
    }

    /// (processes, at once, Workers each, reads per Worker).
    fn shape(self) -> (u32, u32, u32, u32) {
        match self {
            Load::ShortProcesses => (20, 2, 2, 2000),
            Load::Workers => (4, 1, 4, 3000),
        }
    }
}

/// One round of one workload under one tracer.
#[derive(Clone, Debug)]
pub struct Run {
    pub round: usize,
    pub load: Load,
    pub tracer: Tracer,
    pub ops: f64,
    pub wall_s: f64,
    /// The node processes' CPU and the tracer's, seconds.
    pub cpu_s: f64,
    pub tracer_cpu_s: f64,
    /// Under [`Tracer::AgentEscalating`]: the captures written, and their bytes.
    pub captures: (u64, u64),
}

impl Run {
    fn ops_per_s(&self) -> f64 {
        self.ops / self.wall_s
    }

    fn cpu_per_op(&self) -> f64 {
        (self.cpu_s + self.tracer_cpu_s) / self.ops
    }
}

/// A started tracer, attached; killed on drop.
struct Started {
    child: procfs::Guard,
    cpu0: f64,
}

fn start(t: Tracer, prof: &Path) -> Result<Option<Started>> {
    let Some((args, attached)) = t.command() else {
        return Ok(None);
    };
    if t == Tracer::AgentEscalating {
        let _ = std::fs::remove_dir_all(CAPTURES_DIR);
    }
    let mut child = procfs::Guard(
        Command::new(prof)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", t.name()))?,
    );
    let lines = lines_of(child.0.stderr.take().context("stderr")?);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains(attached) => break,
            Ok(_) => {}
            Err(_) => bail!("{} did not attach: {:?}", t.name(), child.0.try_wait()),
        }
    }
    let cpu0 = cpu_s(child.0.id());
    Ok(Some(Started { child, cpu0 }))
}

/// Its CPU since it attached, then it is stopped as a service manager stops it.
fn stop(s: Started) -> Result<f64> {
    let pid = s.child.0.id();
    let cpu = cpu_s(pid) - s.cpu0;
    let mut guard = s.child;
    if let Some(status) = guard.0.try_wait()? {
        bail!("the tracer ended during the run: {status}");
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = guard.0.wait();
    Ok(cpu)
}

/// A process's CPU time in seconds, to the nanosecond: its threads' run time as the
/// scheduler counts it (`/proc/PID/task/*/schedstat`; the tick-based utime of /proc/PID/stat
/// is too coarse for a tracer's few tens of milliseconds a round).
fn cpu_s(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return procfs::cpu_time(pid).as_secs_f64();
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

fn lines_of(r: ChildStderr) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

/// A node process of the workload, ready.
struct Node {
    child: Child,
    out: BufReader<ChildStdout>,
}

fn node(file: &Path, workers: u32, reads: u32) -> Result<Node> {
    let mut child = Command::new("node")
        .arg(workspace_root().join("profiler/demo/workload.js"))
        .args(["workers", &workers.to_string()])
        .arg(file)
        .arg(reads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("start node")?;
    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
    let mut l = String::new();
    out.read_line(&mut l)?;
    if l.trim() != "ready" {
        bail!("the workload said {l:?}");
    }
    Ok(Node { child, out })
}

/// Waits for a child and returns the CPU it used (user and system, seconds), from wait4.
fn wait_cpu(child: &mut Child) -> Result<f64> {
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill, for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child; the pointers are to locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if r < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("node ended with status {status}");
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Runs one round of `load` (the tracer already attached): operations, wall time, CPU.
fn run_load(load: Load, file: &Path) -> Result<(f64, f64, f64)> {
    let (processes, at_once, workers, reads) = load.shape();
    let t0 = Instant::now();
    let (mut ops, mut cpu) = (0.0, 0.0);
    for _ in 0..processes / at_once {
        let mut batch: Vec<Node> = (0..at_once)
            .map(|_| node(file, workers, reads))
            .collect::<Result<_>>()?;
        for n in &mut batch {
            n.child
                .stdin
                .as_mut()
                .context("stdin")?
                .write_all(b"go\n")?;
        }
        for mut n in batch {
            let mut l = String::new();
            n.out.read_line(&mut l)?;
            let v: Value = serde_json::from_str(&l).context("the workload's result")?;
            ops += v["ops"].as_f64().unwrap_or(0.0);
            cpu += wait_cpu(&mut n.child)?;
        }
    }
    Ok((ops, t0.elapsed().as_secs_f64(), cpu))
}

/// The captures under `dir` that hold a summary, and the bytes of all of them.
fn captures_written(dir: &Path) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0);
    for d in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let files: Vec<_> = std::fs::read_dir(d.path())
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        bytes += files
            .iter()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum::<u64>();
        let report = std::fs::read_to_string(d.path().join("report.ndjson")).unwrap_or_default();
        n += report.contains("\"type\":\"summary\"") as u64;
    }
    (n, bytes)
}

/// Every round: each workload under each tracer, the order rotating.
pub fn run(rounds: usize, prof: &Path, out_dir: &Path) -> Result<Vec<Run>> {
    let file = out_dir.join("data.bin");
    let began = Instant::now();
    let mut runs = Vec::new();
    for round in 0..rounds {
        for (li, &load) in Load::ALL.iter().enumerate() {
            for k in 0..Tracer::ALL.len() {
                let tracer = Tracer::ALL[(round + li + k) % Tracer::ALL.len()];
                let started = start(tracer, prof)?;
                let (ops, wall_s, cpu_s) = run_load(load, &file)?;
                let tracer_cpu_s = started.map(stop).transpose()?.unwrap_or(0.0);
                let captures = match tracer {
                    Tracer::AgentEscalating => captures_written(Path::new(CAPTURES_DIR)),
                    _ => (0, 0),
                };
                let r = Run {
                    round,
                    load,
                    tracer,
                    ops,
                    wall_s,
                    cpu_s,
                    tracer_cpu_s,
                    captures,
                };
                eprintln!(
                    "[{:>4.0} s] agent round {}/{rounds}: {:<40} {:<34} {:>8.0} ops/s, {:.2} us CPU/op",
                    began.elapsed().as_secs_f64(),
                    round + 1,
                    load.name(),
                    tracer.name(),
                    r.ops_per_s(),
                    r.cpu_per_op() * 1e6
                );
                runs.push(r);
            }
        }
    }
    Ok(runs)
}
