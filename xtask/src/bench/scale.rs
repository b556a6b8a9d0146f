//! The many-threads case: a process of 10,000 threads that each took its mmap_lock a few
//! times, then stay alive and idle while mmaplock-prof profiles it at `--interval 1`. What
//! is measured is the profiler's userspace cost once it knows every thread: CPU and memory in
//! the steady state.
//!
//! Where the steady state starts is decided from the profiler's own output, never from its
//! CPU use (which is what is measured): after the threads have done their work, the profiler
//! classifies them and writes a first report listing all of them; the steady state starts
//! once two consecutive interval reports list (almost) none. The window then lasts a whole
//! number of full-map readings (the profiler reads every entry every 30 polls), so that its
//! mean is the long-run mean, and it ends before the profiler is stopped (its final summary,
//! which lists every thread again, is not part of the steady state).

use std::{
    fs,
    io::{BufRead, Read, Write},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    BenchArgs,
    procfs::{self, Guard},
    stats::round,
    tracer,
    workload::{self, start_ready},
};

/// At least this long between the threads' last work and the steady window.
const MIN_WARMUP: Duration = Duration::from_secs(2);
/// If the reports have not gone quiet by then, measure anyway (and say so).
const MAX_WARMUP: Duration = Duration::from_secs(30);
/// Memory is sampled this often in the window.
const RSS_EVERY: Duration = Duration::from_millis(200);

/// One round of the many-threads case.
#[derive(Clone, Debug)]
pub struct ScaleRound {
    /// Threads in the summary (the helper's, plus its main thread if it took the lock).
    pub threads_tracked: usize,
    /// From the threads' last work to the start of the window.
    pub warmup: Duration,
    /// Did two consecutive interval reports list under 1% of the threads before MAX_WARMUP?
    pub settled: bool,
    pub warmup_cpu_pct: f64,
    /// Threads listed by the largest interval report.
    pub largest_report_threads: usize,
    pub window: Duration,
    pub cpu_pct: f64,
    /// Resident memory over the window: its largest and its median sample.
    pub rss_max_mib: f64,
    pub rss_median_mib: f64,
    /// VmHWM at the end of the window: the peak of the whole run so far.
    pub peak_rss_mib: f64,
    /// Largest interval report inside the window.
    pub window_report_threads: usize,
    pub lost: Value,
    /// Kernel memory the profiler's per-thread state took, per thread: the kmalloc caches'
    /// growth from before the threads' work to the end of the warm-up, over the threads.
    pub kernel_bytes_per_thread: Option<f64>,
}

impl ScaleRound {
    pub fn json(&self) -> Value {
        json!({
            "threads_tracked": self.threads_tracked,
            "warmup_s": round(self.warmup.as_secs_f64(), 1),
            "settled": self.settled,
            "warmup_cpu_pct": round(self.warmup_cpu_pct, 2),
            "largest_report_threads": self.largest_report_threads,
            "window_s": round(self.window.as_secs_f64(), 1),
            "userspace_cpu_pct": round(self.cpu_pct, 3),
            "rss_max_mib": round(self.rss_max_mib, 1),
            "rss_median_mib": round(self.rss_median_mib, 1),
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "window_report_threads": self.window_report_threads,
            "lost": self.lost,
            "kernel_bytes_per_thread": self.kernel_bytes_per_thread.map(|b| round(b, 0)),
        })
    }
}

/// New complete lines of a file that another process appends to.
struct Tail {
    file: fs::File,
    partial: String,
}

impl Tail {
    fn open(path: &Path) -> Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match fs::File::open(path) {
                Ok(file) => {
                    return Ok(Tail {
                        file,
                        partial: String::new(),
                    });
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
            }
        }
    }

    /// Threads listed by each report line completed since the last call.
    fn new_reports(&mut self) -> Result<Vec<usize>> {
        let mut buf = String::new();
        self.file.read_to_string(&mut buf)?;
        self.partial.push_str(&buf);
        let mut out = Vec::new();
        while let Some(nl) = self.partial.find('\n') {
            out.push(threads_listed(&self.partial[..nl]));
            self.partial.drain(..=nl);
        }
        Ok(out)
    }
}

/// Threads in a report line, without parsing megabytes of JSON: each has one `"tid":`.
fn threads_listed(line: &str) -> usize {
    line.matches("\"tid\":").count()
}

/// The `lost` object of a report line.
fn lost_of(line: &str) -> Value {
    line.find("\"lost\":")
        .and_then(|i| {
            serde_json::Deserializer::from_str(&line[i + 7..])
                .into_iter::<Value>()
                .next()?
                .ok()
        })
        .unwrap_or(Value::Null)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One round: start the threads, profile them, measure the steady state, stop.
pub fn run(args: &BenchArgs, prof: &Path, dir: &Path, round_no: usize) -> Result<ScaleRound> {
    // The threads stay alive (SIZE 64 KiB, NAME unchanged, LINGER_SECS an hour) until the
    // helper is killed at the end of the round.
    let (mut helper, mut out) =
        start_ready(workload::churn(prof, args.scale_threads, 2).args(["65536", "-", "3600"]))
            .context("start the many-threads helper")?;
    let pid = helper.0.id().to_string();
    let report = dir.join(format!("scale-{round_no}.jsonl"));
    let _ = fs::remove_file(&report);
    let mut tracer = Guard(
        Command::new(prof)
            .args(["-q", "-i", "1", "-f", "json", "-p", &pid, "-o"])
            .arg(&report)
            .stdin(Stdio::null())
            .spawn()
            .context("start mmaplock-prof")?,
    );
    let tpid = tracer.0.id();
    // Attached once its three mmap_lock programs are (the kernel's BPF statistics are off
    // here: the profiler is measured as it runs in production).
    let t0 = Instant::now();
    while procfs::mmap_lock_links(tpid) < 3 {
        if let Some(s) = tracer.0.try_wait()? {
            bail!("mmaplock-prof exited before attaching: {s}");
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("mmaplock-prof did not attach within 60 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut tail = Tail::open(&report)?;
    let slab0 = procfs::slab_bytes();
    helper.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut l = String::new();
    out.read_line(&mut l)?; // "done": every thread has taken the lock
    if !l.starts_with("done") {
        bail!("the many-threads helper ended early");
    }

    // Warm-up: until two consecutive interval reports list under 1% of the threads.
    let done = Instant::now();
    let cpu_done = procfs::cpu_time(tpid);
    let quiet = (args.scale_threads as usize / 100).max(1);
    let (mut largest, mut quiet_in_a_row) = (0usize, 0);
    let settled = loop {
        for n in tail.new_reports()? {
            largest = largest.max(n);
            quiet_in_a_row = if n < quiet { quiet_in_a_row + 1 } else { 0 };
        }
        // The threads' first report has been written, and two quiet ones after it.
        if largest >= quiet && quiet_in_a_row >= 2 && done.elapsed() >= MIN_WARMUP {
            break true;
        }
        if done.elapsed() >= MAX_WARMUP {
            break false;
        }
        if let Some(s) = tracer.0.try_wait()? {
            bail!("mmaplock-prof ended during the many-threads case: {s}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let warmup = done.elapsed();
    let cpu0 = procfs::cpu_time(tpid);
    let kernel_bytes_per_thread = slab0
        .zip(procfs::slab_bytes())
        .map(|(a, b)| b.saturating_sub(a) as f64 / f64::from(args.scale_threads.max(1)));
    let warmup_cpu_pct = (cpu0 - cpu_done).as_secs_f64() / warmup.as_secs_f64() * 100.0;

    // The steady window.
    let start = Instant::now();
    let window = Duration::from_secs(args.scale_secs.max(1));
    let mut rss = Vec::new();
    let mut window_report_threads = 0;
    while start.elapsed() < window {
        rss.push(procfs::rss_kib(tpid));
        for n in tail.new_reports()? {
            window_report_threads = window_report_threads.max(n);
        }
        std::thread::sleep(RSS_EVERY.min(window.saturating_sub(start.elapsed())));
    }
    let cpu1 = procfs::cpu_time(tpid);
    let wall = start.elapsed();
    rss.push(procfs::rss_kib(tpid));
    let peak = procfs::peak_rss_kib(tpid);
    if let Some(s) = tracer.0.try_wait()? {
        bail!("mmaplock-prof ended during the many-threads case: {s}");
    }

    // Stop it (its summary lists every thread again), then the threads.
    tracer::interrupt_and_wait(&mut tracer, Duration::from_secs(60))?;
    drop(helper);
    let summary = fs::read_to_string(&report)?;
    let last = summary.trim_end().rsplit('\n').next().unwrap_or("");
    let spread = super::stats::Spread::of(rss.iter().map(|&k| mib(k)));
    Ok(ScaleRound {
        threads_tracked: threads_listed(last),
        warmup,
        settled,
        warmup_cpu_pct,
        largest_report_threads: largest,
        window: wall,
        cpu_pct: (cpu1 - cpu0).as_secs_f64() / wall.as_secs_f64() * 100.0,
        rss_max_mib: spread.map_or(0.0, |s| s.max),
        rss_median_mib: spread.map_or(0.0, |s| s.median),
        peak_rss_mib: mib(peak),
        window_report_threads,
        lost: lost_of(last),
        kernel_bytes_per_thread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_are_read_cheaply() {
        let line = r#"{"kind":"interval","processes":[{"pid":1,"threads":[{"tid":2},{"tid":3}]}],"lost":{"events":0,"map_full":1,"stacks":0},"overhead":null}"#;
        assert_eq!(threads_listed(line), 2);
        assert_eq!(lost_of(line), json!({"events":0,"map_full":1,"stacks":0}));
        assert_eq!(lost_of("{}"), Value::Null);
    }
}
