//! `cargo xtask bench`: what mmaplock-prof costs, side by side with no tracing and with the
//! reference method (a bpftrace script timing start_locking -> acquire_returned), in one run.
//!
//! Rounds are interleaved (every round runs every workload under every mode, the mode order
//! rotating), so drift in the machine's state hits all modes alike; results are medians with
//! their spread. BPF cost comes from the kernel's own statistics (`kernel.bpf_stats_enabled`,
//! restored afterwards), read per program from the tracer's fdinfo, so both tracers are
//! measured the same way. Nothing here asserts: the targets are printed with their verdict.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{build, workspace_root};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds (each runs every workload under every mode).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Worker threads of the Node.js workload, and threads of the mmap/munmap helper.
    #[arg(long, default_value_t = 4)]
    threads: u32,
    /// fs.readFileSync calls per Worker.
    #[arg(long, default_value_t = 4000)]
    node_iterations: u32,
    /// (mmap; touch; munmap) per helper thread.
    #[arg(long, default_value_t = 20000)]
    churn_iterations: u32,
    /// Threads of the many-threads case.
    #[arg(long, default_value_t = 10_000)]
    scale_threads: u32,
    /// How long the many-threads case is profiled (at --interval 1).
    #[arg(long, default_value_t = 10)]
    scale_secs: u64,
    /// Where results.json and results.md go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

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
enum Mode {
    None,
    Prof,
    ProfWritesOnly,
    Bpftrace,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::None, Mode::Prof, Mode::ProfWritesOnly, Mode::Bpftrace];
    fn name(self) -> &'static str {
        match self {
            Mode::None => "no tracing",
            Mode::Prof => "mmaplock-prof",
            Mode::ProfWritesOnly => "mmaplock-prof --writes-only",
            Mode::Bpftrace => "bpftrace",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    NodeWorkers,
    Churn,
}

impl Workload {
    const ALL: [Workload; 2] = [Workload::NodeWorkers, Workload::Churn];
    fn name(self) -> &'static str {
        match self {
            Workload::NodeWorkers => "node Workers, readFileSync 64 KiB",
            Workload::Churn => "mmap/munmap helper",
        }
    }
}

/// One tracer run's measurements.
#[derive(Clone, Debug, Default)]
struct TracerCost {
    attach: Duration,
    /// Per program: (name, run count, run time ns).
    programs: Vec<(String, u64, u64)>,
    cpu: Duration,
    rss_kib: u64,
    wall: Duration,
}

impl TracerCost {
    fn events_and_ns(&self) -> (u64, u64) {
        self.programs
            .iter()
            .fold((0, 0), |(e, n), p| (e + p.1, n + p.2))
    }
}

#[derive(Clone, Debug)]
struct Sample {
    workload: Workload,
    mode: Mode,
    ops_per_s: f64,
    cost: Option<TracerCost>,
}

/// Restores `kernel.bpf_stats_enabled` when dropped.
struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";
    fn enable() -> Result<Self> {
        let before = fs::read_to_string(Self::PATH).context("kernel.bpf_stats_enabled")?;
        fs::write(Self::PATH, "1").context("enable kernel.bpf_stats_enabled")?;
        Ok(BpfStats(before.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(Self::PATH, &self.0);
    }
}

/// Kills a child when dropped (an interrupted benchmark leaves nothing running).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ensure_bpftrace() -> Result<()> {
    if Command::new("bpftrace").arg("--version").output().is_ok() {
        return Ok(());
    }
    eprintln!("xtask bench: installing bpftrace from the OS packages");
    let _ = Command::new("apt-get").args(["update", "-qq"]).status();
    crate::run(Command::new("apt-get").args(["install", "-y", "-qq", "bpftrace"]))
}

/// bpftrace's tracepoint probes need tracefs.
fn ensure_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events/mmap_lock").exists() {
        return Ok(());
    }
    crate::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}

/// BPF programs a process holds, with the kernel's statistics, from its fdinfo.
fn bpf_programs(pid: u32) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(info) = fs::read_to_string(e.path()) else {
            continue;
        };
        if !info.contains("prog_type:") {
            continue;
        }
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let id = field("prog_id:").unwrap_or(0);
        out.push((
            format!("prog {id}"),
            field("run_cnt:").unwrap_or(0),
            field("run_time_ns:").unwrap_or(0),
        ));
    }
    out.sort();
    out
}

/// Resident memory now (VmRSS), in KiB.
fn current_rss(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time used and peak resident memory (VmHWM, KiB).
fn cpu_and_rss(pid: u32) -> (Duration, u64) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may contain spaces: utime is the 12th of them.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (Duration::from_millis(ticks * 1000 / hz), rss)
}

/// Starts a tracer and waits until it counts its first event.
fn start_tracer(
    mode: Mode,
    prof: &Path,
    out_dir: &Path,
) -> Result<Option<(Guard, Instant, Duration)>> {
    let t0 = Instant::now();
    let child = match mode {
        Mode::None => return Ok(None),
        Mode::Prof | Mode::ProfWritesOnly => {
            let mut c = Command::new(prof);
            c.args(["-q", "-i", "1", "-f", "json", "-o"])
                .arg(out_dir.join("prof.jsonl"))
                .stdin(Stdio::null());
            if mode == Mode::ProfWritesOnly {
                c.arg("--writes-only");
            }
            c.spawn().context("start mmaplock-prof")?
        }
        Mode::Bpftrace => Command::new("bpftrace")
            .args(["-e", BPFTRACE_SCRIPT, "-o"])
            .arg(out_dir.join("bpftrace.out"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // bpftrace 0.17 warns about RLIMIT_MEMLOCK on memcg-accounted kernels; harmless.
            .stderr(Stdio::null())
            .spawn()
            .context("start bpftrace")?,
    };
    let mut guard = Guard(child);
    let pid = guard.0.id();
    // Attached = its programs have run at least once. Take the lock ourselves while we wait,
    // so that an idle machine does not delay the first event.
    loop {
        touch_mmap_lock();
        if bpf_programs(pid).iter().any(|p| p.1 > 0) {
            return Ok(Some((guard, t0, t0.elapsed())));
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

/// One mmap and munmap: two write acquisitions of our own mmap_lock.
fn touch_mmap_lock() {
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

fn stop_tracer(mut guard: Guard, started: Instant, attach: Duration) -> Result<TracerCost> {
    let pid = guard.0.id();
    let programs = bpf_programs(pid);
    let (cpu, rss_kib) = cpu_and_rss(pid);
    let wall = started.elapsed();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while guard.0.try_wait()?.is_none() {
        if Instant::now() > deadline {
            bail!("tracer {pid} did not stop on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(TracerCost {
        attach,
        programs,
        cpu,
        rss_kib,
        wall,
    })
}

fn read_ready(child: &mut Child) -> Result<BufReader<std::process::ChildStdout>> {
    let mut r = BufReader::new(child.stdout.take().context("stdout")?);
    let mut l = String::new();
    loop {
        l.clear();
        if r.read_line(&mut l)? == 0 {
            bail!("workload exited before it was ready");
        }
        if l.starts_with("ready") {
            return Ok(r);
        }
    }
}

/// Runs one workload to completion; returns operations per second.
fn run_workload(
    w: Workload,
    args: &BenchArgs,
    dir: &Path,
    tracer: Mode,
    prof: &Path,
) -> Result<Sample> {
    let root = workspace_root();
    let mut cmd = match w {
        Workload::NodeWorkers => {
            let mut c = Command::new("node");
            c.arg(root.join("profiler/demo/workload.js"))
                .arg("workers")
                .arg(args.threads.to_string())
                .arg(dir.join("data.bin"))
                .arg(args.node_iterations.to_string());
            c
        }
        Workload::Churn => {
            let mut c = Command::new(root.join("target/release/mmap-churn"));
            c.arg(args.threads.to_string())
                .arg(args.churn_iterations.to_string());
            c
        }
    };
    let mut child = Guard(
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {cmd:?}"))?,
    );
    let mut out = read_ready(&mut child.0)?;
    let tracer_state = start_tracer(tracer, prof, dir)?;
    let t0 = Instant::now();
    child.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest)?;
    let status = child.0.wait()?;
    let wall = t0.elapsed();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    let ops_per_s = match w {
        Workload::NodeWorkers => {
            let v: Value = serde_json::from_str(rest.lines().last().unwrap_or(""))
                .context("node result line")?;
            v["ops"].as_f64().unwrap_or(0.0) / (v["elapsed_ms"].as_f64().unwrap_or(1.0) / 1e3)
        }
        Workload::Churn => {
            f64::from(args.threads) * f64::from(args.churn_iterations) / wall.as_secs_f64()
        }
    };
    let cost = match tracer_state {
        Some((g, started, attach)) => Some(stop_tracer(g, started, attach)?),
        None => None,
    };
    Ok(Sample {
        workload: w,
        mode: tracer,
        ops_per_s,
        cost,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Seconds of the many-threads case before measuring: the threads are classified and the
/// first report, which lists all of them, is written.
const SCALE_WARMUP_SECS: u64 = 3;

/// The many-threads case: `scale_threads` threads that each took the lock a few times, alive
/// while mmaplock-prof reports every second; its userspace CPU and memory in the steady state
/// (after the warm-up), and its peak memory.
fn scale_case(args: &BenchArgs, prof: &Path, dir: &Path) -> Result<Value> {
    let churn = workspace_root().join("target/release/mmap-churn");
    let run_secs = SCALE_WARMUP_SECS + args.scale_secs + 2;
    let linger = run_secs as f64 + 5.0;
    let mut child = Guard(
        Command::new(&churn)
            .args([
                args.scale_threads.to_string(),
                "2".into(),
                "65536".into(),
                "-".into(),
                linger.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the many-threads helper")?,
    );
    let mut out = read_ready(&mut child.0)?;
    let pid = child.0.id().to_string();
    let report = dir.join("scale.jsonl");
    let mut tracer = Guard(
        Command::new(prof)
            .args(["-q", "-i", "1", "-f", "json", "-p", &pid, "-o"])
            .arg(&report)
            .args(["-d", &run_secs.to_string()])
            .spawn()
            .context("start mmaplock-prof")?,
    );
    std::thread::sleep(Duration::from_millis(300));
    child.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut l = String::new();
    out.read_line(&mut l)?; // "done": every thread has taken the lock
    let t0 = Instant::now();
    let (cpu_start, _) = cpu_and_rss(tracer.0.id());
    std::thread::sleep(Duration::from_secs(SCALE_WARMUP_SECS));
    let started = Instant::now();
    let (cpu0, _) = cpu_and_rss(tracer.0.id());
    let warmup_cpu = (cpu0 - cpu_start).as_secs_f64();
    let warmup_wall = t0.elapsed().as_secs_f64();
    // Measure the steady state: every thread known, reported every second.
    std::thread::sleep(Duration::from_secs(args.scale_secs.max(1)));
    let (cpu1, peak_kib) = cpu_and_rss(tracer.0.id());
    let rss_kib = current_rss(tracer.0.id());
    let wall = started.elapsed();
    let status = tracer.0.wait()?;
    if !status.success() {
        bail!("mmaplock-prof failed in the many-threads case: {status}");
    }
    let text = fs::read_to_string(&report)?;
    let summary: Value = serde_json::from_str(text.lines().last().unwrap_or("{}"))?;
    let threads = summary["processes"][0]["threads"]
        .as_array()
        .map_or(0, Vec::len);
    let cpu_pct = (cpu1 - cpu0).as_secs_f64() / wall.as_secs_f64() * 100.0;
    Ok(json!({
        "threads_tracked": threads,
        "userspace_cpu_pct": (cpu_pct * 1000.0).round() / 1000.0,
        "rss_mib": (rss_kib as f64 / 1024.0 * 10.0).round() / 10.0,
        "peak_rss_mib": (peak_kib as f64 / 1024.0 * 10.0).round() / 10.0,
        "measured_s": (wall.as_secs_f64() * 10.0).round() / 10.0,
        "warmup_cpu_pct": (warmup_cpu / warmup_wall * 1000.0).round() / 10.0,
        "lost": summary["lost"].clone(),
    }))
}

pub fn run(linker_dir: &Path, args: BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!("the benchmark loads eBPF programs: run `sudo -E cargo xtask bench`");
    }
    build(linker_dir, true)?;
    ensure_bpftrace()?;
    ensure_tracefs()?;
    let out_dir = workspace_root().join(&args.out);
    fs::create_dir_all(&out_dir)?;
    let data = out_dir.join("data.bin");
    fs::write(&data, vec![0x5au8; 64 * 1024])?;
    let prof = workspace_root().join("target/release/mmaplock-prof");
    let _stats = BpfStats::enable()?;

    let mut samples = Vec::new();
    for round in 0..args.rounds {
        for (wi, &w) in Workload::ALL.iter().enumerate() {
            for k in 0..Mode::ALL.len() {
                let mode = Mode::ALL[(round + wi + k) % Mode::ALL.len()];
                let s = run_workload(w, &args, &out_dir, mode, &prof)?;
                eprintln!(
                    "round {}/{}: {:<36} {:<14} {:>12.0} ops/s",
                    round + 1,
                    args.rounds,
                    w.name(),
                    mode.name(),
                    s.ops_per_s
                );
                samples.push(s);
            }
        }
    }
    eprintln!(
        "many-threads case: {} threads, {} s...",
        args.scale_threads, args.scale_secs
    );
    let scale = scale_case(&args, &prof, &out_dir)?;
    let results = summarize(&args, &samples, scale);
    let md = markdown(&results);
    fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    fs::write(out_dir.join("results.md"), &md)?;
    println!("{md}");
    eprintln!("written: {}/results.{{json,md}}", out_dir.display());
    Ok(())
}

fn summarize(args: &BenchArgs, samples: &[Sample], scale: Value) -> Value {
    let mut rows = Vec::new();
    for w in Workload::ALL {
        let mut base: Vec<f64> = samples
            .iter()
            .filter(|s| s.workload == w && s.mode == Mode::None)
            .map(|s| s.ops_per_s)
            .collect();
        let base_med = median(&mut base);
        for m in Mode::ALL {
            let ss: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.workload == w && s.mode == m)
                .collect();
            let mut ops: Vec<f64> = ss.iter().map(|s| s.ops_per_s).collect();
            let med = median(&mut ops);
            let (min, max) = (
                ops.first().copied().unwrap_or(0.0),
                ops.last().copied().unwrap_or(0.0),
            );
            let costs: Vec<&TracerCost> = ss.iter().filter_map(|s| s.cost.as_ref()).collect();
            let mut row = json!({
                "workload": w.name(),
                "mode": m.name(),
                "ops_per_s_median": med.round(),
                "ops_per_s_min": min.round(),
                "ops_per_s_max": max.round(),
                "slowdown_pct": if base_med > 0.0 { ((1.0 - med / base_med) * 1000.0).round() / 10.0 } else { 0.0 },
            });
            if !costs.is_empty() {
                let mut ns_per_event: Vec<f64> = costs
                    .iter()
                    .map(|c| {
                        let (e, ns) = c.events_and_ns();
                        if e == 0 { 0.0 } else { ns as f64 / e as f64 }
                    })
                    .collect();
                let mut events_per_s: Vec<f64> = costs
                    .iter()
                    .map(|c| {
                        // Events per tracepoint hit: the most-run program sees every hit of its
                        // tracepoint; report hits of acquire_returned-like programs as the max.
                        let max_prog = c.programs.iter().map(|p| p.1).max().unwrap_or(0);
                        max_prog as f64 / c.wall.as_secs_f64()
                    })
                    .collect();
                let mut attach_ms: Vec<f64> =
                    costs.iter().map(|c| c.attach.as_secs_f64() * 1e3).collect();
                let mut cpu_pct: Vec<f64> = costs
                    .iter()
                    .map(|c| c.cpu.as_secs_f64() / c.wall.as_secs_f64() * 100.0)
                    .collect();
                let mut rss: Vec<f64> = costs.iter().map(|c| c.rss_kib as f64 / 1024.0).collect();
                let per_program: Vec<Value> = {
                    // Program ids differ per run: index programs by position.
                    let n = costs[0].programs.len();
                    (0..n)
                        .map(|i| {
                            let mut v: Vec<f64> = costs
                                .iter()
                                .filter_map(|c| c.programs.get(i))
                                .filter(|p| p.1 > 0)
                                .map(|p| p.2 as f64 / p.1 as f64)
                                .collect();
                            json!((median(&mut v) * 10.0).round() / 10.0)
                        })
                        .collect()
                };
                row["bpf_ns_per_event"] = json!((median(&mut ns_per_event) * 10.0).round() / 10.0);
                row["bpf_ns_per_event_by_program"] = json!(per_program);
                row["events_per_s"] = json!(median(&mut events_per_s).round());
                row["attach_ms"] = json!((median(&mut attach_ms) * 10.0).round() / 10.0);
                row["userspace_cpu_pct"] = json!((median(&mut cpu_pct) * 100.0).round() / 100.0);
                row["rss_mib"] = json!((median(&mut rss) * 10.0).round() / 10.0);
            }
            rows.push(row);
        }
    }
    json!({
        "rounds": args.rounds,
        "threads": args.threads,
        "node_iterations": args.node_iterations,
        "churn_iterations": args.churn_iterations,
        "machine": machine(),
        "rows": rows,
        "many_threads": scale,
    })
}

fn machine() -> Value {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_string();
    let load = read("/proc/loadavg");
    json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg_at_end": load,
    })
}

fn markdown(r: &Value) -> String {
    let mut s = String::new();
    let m = &r["machine"];
    let _ = writeln!(
        s,
        "## mmaplock-prof overhead: {} interleaved rounds, {} CPUs, Linux {}\n",
        r["rounds"],
        m["cpus"],
        m["kernel"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "| workload | mode | ops/s median | min - max | slowdown | BPF ns/event | per program | events/s | attach | tracer CPU | tracer RSS |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for row in r["rows"].as_array().into_iter().flatten() {
        let opt = |k: &str, unit: &str| {
            row.get(k)
                .filter(|v| !v.is_null())
                .map_or("-".to_string(), |v| format!("{v}{unit}"))
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} - {} | {}% | {} | {} | {} | {} | {} | {} |",
            row["workload"].as_str().unwrap_or(""),
            row["mode"].as_str().unwrap_or(""),
            row["ops_per_s_median"],
            row["ops_per_s_min"],
            row["ops_per_s_max"],
            row["slowdown_pct"],
            opt("bpf_ns_per_event", ""),
            opt("bpf_ns_per_event_by_program", ""),
            opt("events_per_s", ""),
            opt("attach_ms", " ms"),
            opt("userspace_cpu_pct", "%"),
            opt("rss_mib", " MiB"),
        );
    }
    let sc = &r["many_threads"];
    let _ = writeln!(
        s,
        "\nMany threads: {} threads tracked, mmaplock-prof at --interval 1 used {}% of one CPU in the steady state ({}% in the first {SCALE_WARMUP_SECS} s, classifying every thread and writing the first report, which lists them all), RSS {} MiB in the steady state (peak {} MiB), over {} s; lost {}.\n",
        sc["threads_tracked"],
        sc["userspace_cpu_pct"],
        sc["warmup_cpu_pct"],
        sc["rss_mib"],
        sc["peak_rss_mib"],
        sc["measured_s"],
        sc["lost"]
    );
    // Targets, as ratios measured in this run.
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let get = |w: &str, mode: &str, k: &str| {
        rows.iter()
            .find(|x| x["workload"] == w && x["mode"] == mode)
            .and_then(|x| x[k].as_f64())
            .unwrap_or(f64::NAN)
    };
    let _ = writeln!(s, "| target | measured | verdict |\n|---|---|---|");
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for w in Workload::ALL {
        let wn = w.name();
        for mode in ["mmaplock-prof", "mmaplock-prof --writes-only"] {
            let ns_ratio =
                get(wn, mode, "bpf_ns_per_event") / get(wn, "bpftrace", "bpf_ns_per_event");
            let slow_p = get(wn, mode, "slowdown_pct").max(0.0);
            let slow_b = get(wn, "bpftrace", "slowdown_pct");
            let slow_ratio = if slow_b > 0.0 {
                slow_p / slow_b
            } else {
                f64::NAN
            };
            let _ = writeln!(
                s,
                "| {wn}, {mode}: BPF ns/event at most 1/4 of bpftrace's | {ns_ratio:.2}x | {} |",
                verdict(ns_ratio <= 0.25)
            );
            let _ = writeln!(
                s,
                "| {wn}, {mode}: slowdown at most 1/2 of bpftrace's | {slow_p:.1}% vs {slow_b:.1}% = {slow_ratio:.2}x | {} |",
                verdict(slow_ratio <= 0.5)
            );
        }
    }
    let attach = get(Workload::ALL[0].name(), "mmaplock-prof", "attach_ms").max(get(
        Workload::ALL[1].name(),
        "mmaplock-prof",
        "attach_ms",
    ));
    let _ = writeln!(
        s,
        "| attach (start to first event counted) under 100 ms | {attach:.1} ms | {} |",
        verdict(attach < 100.0)
    );
    let cpu = sc["userspace_cpu_pct"].as_f64().unwrap_or(f64::NAN);
    let rss = sc["rss_mib"].as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "| userspace at most 1% of one CPU with {} threads at --interval 1 | {cpu:.2}% | {} |",
        sc["threads_tracked"],
        verdict(cpu <= 1.0)
    );
    let _ = writeln!(
        s,
        "| RSS at most 30 MB (steady state, {} threads) | {rss:.1} MiB = {:.1} MB | {} |",
        sc["threads_tracked"],
        rss * 1.048576,
        verdict(rss * 1.048576 <= 30.0)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn own_cpu_and_rss_are_read_from_proc() {
        let (_, rss) = cpu_and_rss(std::process::id());
        assert!(rss > 0);
        // This test process holds no BPF programs.
        assert!(bpf_programs(std::process::id()).is_empty());
    }
}
