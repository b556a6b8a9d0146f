//! `mmaplock-prof demo`: the investigation's finding in one command. The bundled Node.js
//! workload runs twice under the profiler, as k Worker threads of one process (one mm, one
//! mmap_lock) and as k processes, doing the same `fs.readFileSync` loop; the two runs'
//! throughput and write waits are shown side by side.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io,
    path::{Path, PathBuf},
};

use serde::Serialize;
use tokio::process::Command;

use crate::{
    cli::Format,
    kernel::collector::CollectorError,
    nodework::{NodeRunError, NodeSpec, WORKLOAD_JS, run_node},
    output::{
        JsonLines, Output,
        report::{Dist, Report, Stats},
        text::{fmt_ns, histogram_lines, side_by_side},
    },
    run::{SessionError, Sink},
};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot run Node.js ({0}): {1}; install Node.js or pass --node PATH")]
    NoNode(PathBuf, io::Error),
    #[error(transparent)]
    Run(#[from] NodeRunError),
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

pub use crate::nodework::NodeRun as DemoRun;

/// The demo's report: its JSON line (`"type":"demo"`, docs/report-format.md) or its view.
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

fn write_stats(r: &DemoRun) -> Stats {
    Stats::new(&r.write)
}

/// Write counts of a run by cause, by thread role and by code (sampled stacks).
fn tallies(r: &Report) -> [BTreeMap<String, u64>; 3] {
    let mut out: [BTreeMap<String, u64>; 3] = Default::default();
    for p in &r.processes {
        for c in &p.lock.causes {
            *out[0].entry(c.cause.to_string()).or_default() += c.write.count;
        }
        for t in &p.threads {
            if t.lock.write.count > 0 {
                *out[1].entry(t.role.as_str().to_string()).or_default() += t.lock.write.count;
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

/// The demo's view for people: the two runs side by side.
struct View;

impl Output<DemoReport<'_>> for View {
    fn emit(&mut self, report: &DemoReport<'_>, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_all(text(report).as_bytes())
    }
}

fn text(r: &DemoReport<'_>) -> String {
    let [w, p] = r.runs;
    let (ws, ps) = (write_stats(w), write_stats(p));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nmmaplock-prof demo: {k} Worker threads in one process vs {k} processes,\n\
         each doing {n} x fs.readFileSync of a {kib} KiB file\n",
        k = r.workers,
        n = r.iterations,
        kib = r.file_kib
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
    // Durations in nanoseconds (exact as f64 below 2^53 ns, 104 days).
    type Figure = fn(&Stats) -> f64;
    let durations: [(&str, Figure); 5] = [
        ("total write wait", |s| s.wait_ns.sum as f64),
        ("mean write wait", |s| s.wait_ns.mean),
        ("p99 write wait", |s| s.wait_ns.p99 as f64),
        ("max write wait", |s| s.wait_ns.max as f64),
        ("mean write hold", |s| s.hold().mean),
    ];
    for (label, figure) in durations {
        let (a, b) = (figure(&ws), figure(&ps));
        out += &row(label, fmt_ns(a as u64), fmt_ns(b as u64), ratio(a, b));
    }
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
    // What it means and what to change, for the Workers' process.
    if let Some(f) = w.report.findings.as_ref().filter(|f| !f.is_empty()) {
        out.push_str(&crate::output::findings::to_text(f).replace(
            "findings (docs/findings.md):",
            "findings for the Worker threads' process (docs/findings.md):",
        ));
    }
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
    let spec = |mode| NodeSpec {
        node: &cfg.node,
        script: &script,
        mode,
        k: cfg.workers,
        args: vec![
            file.to_string_lossy().into_owned(),
            cfg.iterations.to_string(),
        ],
        env: vec![],
        // The demo's writes are few: take every one's stack.
        stack_sample: 1,
        // Who made the Workers wait: the demo's point, where the kernel has bpf_loop.
        blockers: crate::kernel::features::Features::running().blockers(),
    };
    let workers = run_node(&spec("workers")).await?;
    let processes = run_node(&spec("processes")).await?;
    {
        let report = DemoReport {
            kind: "demo",
            schema_version: crate::output::report::SCHEMA_VERSION,
            workers: cfg.workers,
            file_kib: cfg.file_kib,
            iterations: cfg.iterations,
            runs: [&workers, &processes],
        };
        let mut output: Box<dyn Output<DemoReport<'_>>> = match sink.format() {
            Format::Json => Box::new(JsonLines),
            Format::Text => Box::new(View),
        };
        sink.write_final(&mut *output, &report)?;
    }
    // Reported above with what it gathered; the exit says it too.
    match workers.failure.or(processes.failure) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
