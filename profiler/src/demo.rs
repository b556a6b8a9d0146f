//! `mmaplock-prof demo`: the investigation's finding in one command. The bundled Node.js
//! workload runs twice under the profiler, as k Worker threads of one process (one mm, one
//! mmap_lock) and as k processes, doing the same `fs.readFileSync` loop; the two runs'
//! throughput and write waits are shown side by side.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use crate::{
    aggregation::SideStats,
    cli::Format,
    kernel::collector::{Collector, CollectorConfig, CollectorError},
    output::report::{Dist, Report, Stats},
    output::text::{fmt_ns, histogram_lines, side_by_side},
    run::{Driver, LoopConfig, Profile, Rings, SessionError, Sink, Targets, run_loop},
};

const WORKLOAD_JS: &str = include_str!("../demo/workload.js");

/// Give up on a workload that does not answer (a broken node, a stuck machine).
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot run Node.js ({0}): {1}; install Node.js or pass --node PATH")]
    NoNode(PathBuf, io::Error),
    #[error("the demo workload failed: {0}")]
    Workload(String),
    #[error("cannot prepare the demo's files: {0}")]
    Files(io::Error),
    #[error(transparent)]
    Collector(#[from] CollectorError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl DemoError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DemoError::Session(e) => e.exit_code(),
            _ => 1,
        }
    }
}

pub struct DemoConfig {
    pub workers: u32,
    pub file_kib: u32,
    pub iterations: u32,
    pub node: PathBuf,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub verbose: bool,
}

/// One side of the comparison.
#[derive(Debug, Serialize)]
pub struct DemoRun {
    pub mode: &'static str,
    pub reads: u64,
    pub elapsed_s: f64,
    pub reads_per_s: f64,
    /// The profiler's summary of the run's process(es).
    pub report: Report,
    /// Write side over all of the run's processes.
    #[serde(skip)]
    pub write: SideStats,
}

#[derive(Debug, Serialize)]
struct DemoReport<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema_version: u32,
    workers: u32,
    file_kib: u32,
    iterations: u32,
    runs: [&'a DemoRun; 2],
}

struct Participant {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

async fn next_line(p: &mut Participant) -> Result<String, DemoError> {
    match tokio::time::timeout(STEP_TIMEOUT, p.lines.next_line()).await {
        Ok(Ok(Some(l))) => Ok(l),
        Ok(Ok(None)) => Err(DemoError::Workload("node exited early".into())),
        Ok(Err(e)) => Err(DemoError::Workload(e.to_string())),
        Err(_) => Err(DemoError::Workload("no answer from node in 300 s".into())),
    }
}

async fn spawn(node: &Path, args: &[&str]) -> Result<Participant, DemoError> {
    let mut child = Command::new(node)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| DemoError::NoNode(node.to_path_buf(), e))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut p = Participant {
        child,
        lines: BufReader::new(stdout).lines(),
    };
    let l = next_line(&mut p).await?;
    if l != "ready" {
        return Err(DemoError::Workload(format!("unexpected output {l:?}")));
    }
    Ok(p)
}

/// Runs one mode under a freshly attached profiler restricted to its processes.
async fn run_mode(
    cfg: &DemoConfig,
    mode: &'static str,
    script: &Path,
    file: &Path,
) -> Result<DemoRun, DemoError> {
    let (n_procs, k_arg) = if mode == "workers" {
        (1, cfg.workers)
    } else {
        (cfg.workers, 1)
    };
    let k = k_arg.to_string();
    let it = cfg.iterations.to_string();
    let script = script.to_string_lossy();
    let file_s = file.to_string_lossy();
    let mut procs = Vec::new();
    for _ in 0..n_procs {
        let wmode = if mode == "workers" {
            "workers"
        } else {
            "process"
        };
        procs.push(spawn(&cfg.node, &[&script, wmode, &k, &file_s, &it]).await?);
    }
    let pids: Vec<u32> = procs.iter().filter_map(|p| p.child.id()).collect();
    let mut collector = Collector::start(&CollectorConfig {
        pids: pids.clone(),
        comms: vec![],
        max_threads: crate::cli::Config::MAX_THREADS,
        bpf_stats: false,
        // The demo's writes are few: take every one's stack.
        stack_sample: 1,
        writes_only: false,
        floor: crate::kernel::collector::Floor::Off,
        selection: false,
        children: false,
        // Who made the Workers wait: the demo's point.
        blockers: true,
    })?;
    let mut rings = Rings::open(&mut collector)?;
    let mut profile = Profile::new(collector, false);
    profile.prepare_stacks(&pids);
    // Start everyone together.
    for p in &mut procs {
        if let Some(stdin) = p.child.stdin.as_mut() {
            stdin
                .write_all(b"go\n")
                .await
                .map_err(|e| DemoError::Workload(e.to_string()))?;
        }
    }
    // The shared run loop, until every participant has exited (each has printed its one
    // result line, which waits in its pipe), classifying threads and taking stacks as they
    // come.
    struct Quiet;
    impl Driver for Quiet {
        fn after_poll(&mut self, _: &mut Profile) -> Result<(), SessionError> {
            Ok(())
        }
    }
    let targets = Targets::open(&pids)?;
    run_loop(
        &mut profile,
        &mut rings,
        LoopConfig {
            period: std::time::Duration::from_secs(1),
            duration: None,
            targets: Some(&targets),
        },
        &mut Quiet,
    )
    .await??;
    let mut reads = 0u64;
    let mut elapsed_ms = 0f64;
    for p in &mut procs {
        let line = next_line(p).await?;
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| DemoError::Workload(format!("bad result {line:?}: {e}")))?;
        reads += v["ops"].as_u64().unwrap_or(0);
        elapsed_ms = elapsed_ms.max(v["elapsed_ms"].as_f64().unwrap_or(0.0));
        let status = p
            .child
            .wait()
            .await
            .map_err(|e| DemoError::Workload(e.to_string()))?;
        if !status.success() {
            return Err(DemoError::Workload(format!("node exited with {status}")));
        }
    }
    // Every participant has exited, its exit_mmap included: the kernel maps are complete.
    rings.drain(&mut profile);
    profile.finish().await?;
    rings.drain(&mut profile);
    let mut report = profile.summary();
    report.processes.retain(|p| pids.contains(&p.pid));
    let mut write = SideStats::default();
    for t in profile
        .total_window()
        .processes
        .iter()
        .filter(|(p, _)| pids.contains(&p.pid))
        .flat_map(|(_, threads)| threads.values())
    {
        write.merge(&t.write());
    }
    let elapsed_s = elapsed_ms / 1e3;
    Ok(DemoRun {
        mode,
        reads,
        elapsed_s,
        reads_per_s: if elapsed_s > 0.0 {
            reads as f64 / elapsed_s
        } else {
            0.0
        },
        report,
        write,
    })
}

fn write_stats(r: &DemoRun) -> Stats {
    Stats::new(&r.write, &mut crate::aggregation::new_hdr())
}

/// Write counts of a run by cause, by thread role and by code (sampled stacks).
fn tallies(r: &Report) -> [BTreeMap<String, u64>; 3] {
    let mut out: [BTreeMap<String, u64>; 3] = Default::default();
    for p in &r.processes {
        for c in &p.causes {
            *out[0].entry(c.cause.to_string()).or_default() += c.write.count;
        }
        for t in &p.threads {
            if t.write.count > 0 {
                *out[1].entry(t.role.as_str().to_string()).or_default() += t.write.count;
            }
        }
        for d in p.dsos.iter().flatten() {
            let name = Path::new(&d.dso)
                .file_name()
                .map_or(d.dso.clone(), |n| n.to_string_lossy().into_owned());
            *out[2].entry(name).or_default() += d.write.count;
        }
    }
    out
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.1}x", a / b)
    } else {
        "-".into()
    }
}

fn text(cfg: &DemoConfig, w: &DemoRun, p: &DemoRun) -> String {
    let (ws, ps) = (write_stats(w), write_stats(p));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nmmaplock-prof demo: {k} Worker threads in one process vs {k} processes,\n\
         each doing {n} x fs.readFileSync of a {kib} KiB file\n",
        k = cfg.workers,
        n = cfg.iterations,
        kib = cfg.file_kib
    );
    let _ = writeln!(
        out,
        "  {:<28} {:>14} {:>14} {:>9}",
        "", "workers", "processes", "w/p"
    );
    let row = |label: &str, a: String, b: String, r: String| {
        format!("  {label:<28} {a:>14} {b:>14} {r:>9}")
            .trim_end()
            .to_string()
            + "\n"
    };
    out += &row(
        "throughput (reads/s)",
        format!("{:.0}", w.reads_per_s),
        format!("{:.0}", p.reads_per_s),
        ratio(w.reads_per_s, p.reads_per_s),
    );
    out += &row(
        "elapsed",
        format!("{:.3}s", w.elapsed_s),
        format!("{:.3}s", p.elapsed_s),
        ratio(w.elapsed_s, p.elapsed_s),
    );
    out += &row(
        "write acquisitions",
        ws.count.to_string(),
        ps.count.to_string(),
        ratio(ws.count as f64, ps.count as f64),
    );
    out += &row(
        "total write wait",
        fmt_ns(ws.wait_ns.sum),
        fmt_ns(ps.wait_ns.sum),
        ratio(ws.wait_ns.sum as f64, ps.wait_ns.sum as f64),
    );
    out += &row(
        "mean write wait",
        fmt_ns(ws.wait_ns.mean as u64),
        fmt_ns(ps.wait_ns.mean as u64),
        ratio(ws.wait_ns.mean, ps.wait_ns.mean),
    );
    out += &row(
        "p99 write wait",
        fmt_ns(ws.wait_ns.p99),
        fmt_ns(ps.wait_ns.p99),
        ratio(ws.wait_ns.p99 as f64, ps.wait_ns.p99 as f64),
    );
    out += &row(
        "max write wait",
        fmt_ns(ws.wait_ns.max),
        fmt_ns(ps.wait_ns.max),
        ratio(ws.wait_ns.max as f64, ps.wait_ns.max as f64),
    );
    out += &row(
        "mean write hold",
        fmt_ns(ws.hold_ns.mean as u64),
        fmt_ns(ps.hold_ns.mean as u64),
        ratio(ws.hold_ns.mean, ps.hold_ns.mean),
    );
    let (wt, pt) = (tallies(&w.report), tallies(&p.report));
    for (title, i) in [
        ("write acquisitions by cause", 0),
        ("by thread role", 1),
        ("by code (sampled stacks)", 2),
    ] {
        let _ = writeln!(out, "\n  {title}");
        let mut keys: Vec<&String> = wt[i].keys().chain(pt[i].keys()).collect();
        keys.sort();
        keys.dedup();
        // Biggest first, by the workers' count.
        keys.sort_by_key(|k| std::cmp::Reverse(wt[i].get(*k).copied().unwrap_or(0)));
        for k in keys {
            let (a, b) = (
                wt[i].get(k).copied().unwrap_or(0),
                pt[i].get(k).copied().unwrap_or(0),
            );
            out += &row(
                &format!("  {k}"),
                a.to_string(),
                b.to_string(),
                String::new(),
            );
        }
    }
    let hists: Vec<&Dist> = vec![&ws.wait_ns, &ps.wait_ns];
    let width = 8 + 1 + 24 + 1 + 8;
    let mut cols = vec![
        vec![format!("{:<width$}", "write wait, workers")],
        vec!["write wait, processes".to_string()],
    ];
    for (c, h) in cols.iter_mut().zip(histogram_lines(&hists)) {
        c.extend(h);
    }
    out.push('\n');
    out.push_str(&side_by_side(&cols, width));
    // Who made the Workers wait (the processes' locks are each their own).
    for proc in &w.report.processes {
        let _ = write!(out, "\nworkers (pid {}):", proc.pid);
        out.push_str(&crate::output::text::blockers_text(proc));
    }
    let _ = writeln!(
        out,
        "\nWorker threads share one mm_struct, so every mmap/munmap/mprotect/brk of any of them\n\
         takes the same mmap_lock for write, and they queue behind each other; separate processes\n\
         each have their own lock. Profile your own process with: sudo mmaplock-prof --pid PID"
    );
    out
}

pub async fn run(cfg: DemoConfig) -> Result<(), DemoError> {
    let mut sink = Sink::open(cfg.output.as_ref(), cfg.format)?;
    // Fail early and clearly without node.
    let probe = Command::new(&cfg.node)
        .arg("--version")
        .output()
        .await
        .map_err(|e| DemoError::NoNode(cfg.node.clone(), e))?;
    if !probe.status.success() {
        return Err(DemoError::NoNode(
            cfg.node.clone(),
            io::Error::other(format!("`--version` exited with {}", probe.status)),
        ));
    }
    let dir = tempfile::tempdir().map_err(DemoError::Files)?;
    let script = dir.path().join("workload.js");
    std::fs::write(&script, WORKLOAD_JS).map_err(DemoError::Files)?;
    let file = dir.path().join("data.bin");
    // Content does not matter, size does; a simple pattern avoids reading /dev/urandom.
    let data: Vec<u8> = (0..cfg.file_kib as usize * 1024)
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(&file, data).map_err(DemoError::Files)?;

    if cfg.verbose {
        eprintln!(
            "mmaplock-prof demo: node {}, files in {}",
            String::from_utf8_lossy(&probe.stdout).trim(),
            dir.path().display()
        );
    }
    eprintln!(
        "mmaplock-prof demo: running {} Worker threads, then {} processes...",
        cfg.workers, cfg.workers
    );
    let workers = run_mode(&cfg, "workers", &script, &file).await?;
    let processes = run_mode(&cfg, "processes", &script, &file).await?;
    match sink.format() {
        Format::Json => {
            let r = DemoReport {
                kind: "demo",
                schema_version: crate::output::report::SCHEMA_VERSION,
                workers: cfg.workers,
                file_kib: cfg.file_kib,
                iterations: cfg.iterations,
                runs: [&workers, &processes],
            };
            let line = serde_json::to_string(&r).expect("serialisable") + "\n";
            sink.write_str(&line)?;
        }
        Format::Text => {
            sink.write_str(&text(&cfg, &workers, &processes))?;
        }
    }
    Ok(())
}
