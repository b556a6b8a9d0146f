//! The measured workloads: each is started, waits until the tracer has attached, then runs
//! to completion; its throughput is what tracing slows down.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::Path,
    process::{Child, ChildStdout, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    BenchArgs,
    cost::TracerCost,
    procfs::Guard,
    tracer::{self, Mode},
};
use crate::workspace_root;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    NodeWorkers,
    Churn,
}

impl Workload {
    pub const ALL: [Workload; 2] = [Workload::NodeWorkers, Workload::Churn];

    pub fn name(self) -> &'static str {
        match self {
            Workload::NodeWorkers => "node Workers, readFileSync 64 KiB",
            Workload::Churn => "mmap/munmap helper",
        }
    }
}

/// One run of one workload under one mode.
#[derive(Clone, Debug)]
pub struct Sample {
    pub round: usize,
    pub workload: Workload,
    pub mode: Mode,
    pub ops_per_s: f64,
    pub cost: Option<TracerCost>,
}

/// Reads the child's output up to its "ready" line.
pub fn read_ready(child: &mut Child) -> Result<BufReader<ChildStdout>> {
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

/// The `mmap-churn` helper built beside `prof`: `threads` threads, each mapping, touching and
/// unmapping 64 KiB `iterations` times once told to go.
pub fn churn(prof: &Path, threads: u32, iterations: u32) -> Command {
    let mut c = Command::new(prof.with_file_name("mmap-churn"));
    c.args([threads.to_string(), iterations.to_string()]);
    c
}

/// Starts `cmd` with its stdin and stdout piped (killed on drop), and reads its output up to
/// its "ready" line.
pub fn start_ready(cmd: &mut Command) -> Result<(Guard, BufReader<ChildStdout>)> {
    let mut child = Guard(
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {cmd:?}"))?,
    );
    let out = read_ready(&mut child.0)?;
    Ok((child, out))
}

/// Runs one workload to completion under `mode`.
pub fn run(
    round: usize,
    w: Workload,
    mode: Mode,
    args: &BenchArgs,
    dir: &Path,
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
        Workload::Churn => churn(prof, args.threads, args.churn_iterations),
    };
    let (mut child, mut out) = start_ready(&mut cmd)?;
    let running = tracer::start(mode, prof, dir)?;
    let t0 = Instant::now();
    child.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut rest = String::new();
    out.read_to_string(&mut rest)?;
    let status = child.0.wait()?;
    let wall = t0.elapsed();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    let ops_per_s = match w {
        // The workload times itself, from "go" to the last Worker's end.
        Workload::NodeWorkers => {
            let v: Value = serde_json::from_str(rest.lines().last().unwrap_or(""))
                .context("node result line")?;
            v["ops"].as_f64().unwrap_or(0.0) / (v["elapsed_ms"].as_f64().unwrap_or(1.0) / 1e3)
        }
        Workload::Churn => {
            f64::from(args.threads) * f64::from(args.churn_iterations) / wall.as_secs_f64()
        }
    };
    let cost = running.map(tracer::stop).transpose()?;
    Ok(Sample {
        round,
        workload: w,
        mode,
        ops_per_s,
        cost,
    })
}
