//! The tracers compared: mmaplock-prof's empty floor programs, mmaplock-prof (full and
//! `--writes-only`), and the reference bpftrace script; how each is started, found attached,
//! stopped and measured.

use std::{
    collections::HashMap,
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    cost::{Tp, TracerCost},
    procfs::{self, Guard},
};

/// The reference method, as in the published investigation: wait time per acquisition
/// (start_locking -> acquire_returned), per process and lock side, which is what comparing
/// Worker threads with processes needs.
const BPFTRACE_SCRIPT: &str = r#"
tracepoint:mmap_lock:mmap_lock_start_locking { @start[tid] = nsecs; }
tracepoint:mmap_lock:mmap_lock_acquire_returned /@start[tid]/ {
  $w = nsecs - @start[tid];
  @wait[pid, args->write] = hist($w);
  @wait_sum[pid, args->write] = sum($w);
  @acquisitions[pid, args->write] = count();
  delete(@start[tid]);
}
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    None,
    /// `mmaplock-prof --floor`: empty programs of our own on the same three tracepoints.
    Floor,
    /// `mmaplock-prof --floor-clock`: one clock read per run, the least a program that times
    /// acquisitions does (for context: no target is set on it).
    FloorClock,
    /// `mmaplock-prof --floor-storage`: one clock read stored in the thread's task storage,
    /// the least a program that times acquisitions per thread (as the profiler does) does.
    FloorStorage,
    /// The profile as `sudo mmaplock-prof --pid PID` runs it: code attribution on at its
    /// default rate.
    Prof,
    /// The same without code attribution (`--stack-sample 0`): what the default rate costs.
    ProfNoStacks,
    ProfWritesOnly,
    /// `mmaplock-prof --blockers`: waits charged to their blockers (an option: its cost is
    /// shown here beside the full profile's).
    ProfBlockers,
    Bpftrace,
}

impl Mode {
    pub const ALL: [Mode; 9] = [
        Mode::None,
        Mode::Floor,
        Mode::FloorClock,
        Mode::FloorStorage,
        Mode::Prof,
        Mode::ProfNoStacks,
        Mode::ProfWritesOnly,
        Mode::ProfBlockers,
        Mode::Bpftrace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "no tracing",
            Mode::Floor => "floor (empty programs)",
            Mode::FloorClock => "clock floor (one clock read)",
            Mode::FloorStorage => "storage floor (clock read into task storage)",
            Mode::Prof => "mmaplock-prof",
            Mode::ProfNoStacks => "mmaplock-prof --stack-sample 0",
            Mode::ProfWritesOnly => "mmaplock-prof --writes-only",
            Mode::ProfBlockers => "mmaplock-prof --blockers",
            Mode::Bpftrace => "bpftrace",
        }
    }

    /// mmaplock-prof's arguments for this mode (None: not mmaplock-prof).
    fn prof_args(self) -> Option<&'static [&'static str]> {
        match self {
            Mode::Floor => Some(&["--floor"]),
            Mode::FloorClock => Some(&["--floor-clock"]),
            Mode::FloorStorage => Some(&["--floor-storage"]),
            Mode::Prof => Some(&[]),
            Mode::ProfNoStacks => Some(&["--stack-sample", "0"]),
            Mode::ProfWritesOnly => Some(&["--writes-only"]),
            Mode::ProfBlockers => Some(&["--blockers"]),
            Mode::None | Mode::Bpftrace => None,
        }
    }

    /// The mmap_lock tracepoints the tracer has programs on.
    fn lock_tracepoints(self) -> &'static [Tp] {
        match self {
            Mode::Bpftrace => &[Tp::Start, Tp::Acquire],
            _ => &Tp::LOCK,
        }
    }

    fn output(self) -> &'static str {
        match self {
            Mode::Floor => "floor.jsonl",
            Mode::FloorClock => "floor-clock.jsonl",
            Mode::FloorStorage => "floor-storage.jsonl",
            Mode::ProfWritesOnly => "prof-writes-only.jsonl",
            Mode::ProfNoStacks => "prof-no-stacks.jsonl",
            Mode::ProfBlockers => "prof-blockers.jsonl",
            Mode::Bpftrace => "bpftrace.out",
            Mode::None | Mode::Prof => "prof.jsonl",
        }
    }
}

/// A tracer that has attached.
pub struct Running {
    guard: Guard,
    mode: Mode,
    started: Instant,
    attach: Duration,
    output: std::path::PathBuf,
}

/// Starts a tracer and waits until its programs have run once (None: no tracing).
pub fn start(mode: Mode, prof: &Path, out_dir: &Path) -> Result<Option<Running>> {
    let output = out_dir.join(mode.output());
    let t0 = Instant::now();
    let child = if let Some(extra) = mode.prof_args() {
        Command::new(prof)
            .args(["-q", "-i", "1", "-f", "json", "--bpf-stats"])
            .args(extra)
            .arg("-o")
            .arg(&output)
            .stdin(Stdio::null())
            .spawn()
            .context("start mmaplock-prof")?
    } else if mode == Mode::Bpftrace {
        Command::new("bpftrace")
            .args(["-e", BPFTRACE_SCRIPT, "-o"])
            .arg(&output)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // bpftrace 0.17 warns about RLIMIT_MEMLOCK on memcg-accounted kernels; harmless.
            .stderr(Stdio::null())
            .spawn()
            .context("start bpftrace")?
    } else {
        return Ok(None);
    };
    let mut guard = Guard(child);
    let pid = guard.0.id();
    // Attached = each of its programs on the mmap_lock tracepoints has run. Take the lock
    // ourselves while we wait, so that an idle machine does not delay the first events.
    let mut names = HashMap::new();
    loop {
        touch_mmap_lock();
        let progs = procfs::bpf_programs_named(pid, &mut names);
        let ran = |tp: Tp| progs.iter().any(|p| Tp::of(&p.name) == tp && p.runs > 0);
        if mode.lock_tracepoints().iter().all(|&tp| ran(tp)) {
            return Ok(Some(Running {
                guard,
                mode,
                started: t0,
                attach: t0.elapsed(),
                output,
            }));
        }
        if let Some(s) = guard.0.try_wait()? {
            bail!("{} exited before attaching: {s}", mode.name());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("{} did not attach within 60 s", mode.name());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// One mmap and munmap: write acquisitions of our own mmap_lock.
pub fn touch_mmap_lock() {
    // SAFETY: an anonymous mapping, unmapped right away, never dereferenced.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p != libc::MAP_FAILED {
            libc::munmap(p, 4096);
        }
    }
}

/// Reads the tracer's cost, then stops it (SIGINT) and waits for it.
pub fn stop(mut t: Running) -> Result<TracerCost> {
    let pid = t.guard.0.id();
    let programs = procfs::bpf_programs(pid);
    let cpu = procfs::cpu_time(pid);
    let peak_rss_kib = procfs::peak_rss_kib(pid);
    let wall = t.started.elapsed();
    // A tracer that failed mid-run measured nothing.
    if let Some(status) = t.guard.0.try_wait()? {
        bail!("{} ended during the run: {status}", t.mode.name());
    }
    // Its cost is read: a tracer slow to write its last output (bpftrace prints every map on
    // a busy machine) is waited for a while, then killed, and the run kept.
    let stopped = match interrupt_and_wait(&mut t.guard, Duration::from_secs(60)) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("xtask bench: {}: {e:#}; killed", t.mode.name());
            false
        }
    };
    let summary = (stopped && t.mode.prof_args().is_some())
        .then(|| last_report(&t.output))
        .flatten();
    let lost = summary.as_ref().and_then(summary_lost);
    let load = summary
        .as_ref()
        .map(|s| s["overhead"]["load"].clone())
        .filter(|l| !l.is_null());
    let stack_work = summary
        .as_ref()
        .map(|s| s["stack_work"].clone())
        .filter(|w| !w.is_null());
    Ok(TracerCost {
        attach: t.attach,
        programs,
        cpu,
        peak_rss_kib,
        wall,
        lost,
        load,
        stack_work,
    })
}

/// SIGINT, then waits up to `timeout` for the process to end.
pub fn interrupt_and_wait(guard: &mut Guard, timeout: Duration) -> Result<()> {
    let pid = guard.0.id();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = guard.0.try_wait()? {
            if !status.success() {
                bail!("tracer {pid} failed: {status}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("tracer {pid} did not stop on SIGINT within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last line of a mmaplock-prof JSON output, which is its summary.
pub fn last_report(path: &Path) -> Option<Value> {
    let text = fs::read_to_string(path).ok()?;
    serde_json::from_str(text.lines().last()?).ok()
}

/// Acquisitions the summary reports as lost: `lost.events` (every reason but a full map, added
/// up) and `lost.map_full`.
fn summary_lost(s: &Value) -> Option<u64> {
    let lost = &s["lost"];
    Some(lost["events"].as_u64()? + lost["map_full"].as_u64().unwrap_or(0))
}
