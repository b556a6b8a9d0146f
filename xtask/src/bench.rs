//! `cargo xtask bench`: what mmaplock-prof costs, side by side with the floor (empty BPF
//! programs of our own on the same tracepoints), no tracing, and the reference method (a
//! bpftrace script timing start_locking -> acquire_returned), in one run.
//!
//! Rounds are interleaved (every round runs every workload under every mode, the mode order
//! rotating), so drift in the machine's state hits all modes alike; every figure is a median
//! with its range, and every cost is also a ratio to the floor measured in the same round.
//! BPF cost comes from the kernel's own statistics (`kernel.bpf_stats_enabled`, restored
//! afterwards), read per program from the tracer's fdinfo, so all tracers are measured the
//! same way. Nothing here asserts: the targets are printed with their verdict.

mod advice;
mod agent;
mod capture;
mod cold;
mod cost;
mod escalate;
mod holder;
mod json;
mod load;
mod markdown;
mod procfs;
mod reader;
mod reads;
mod report;
mod scale;
mod stats;
mod tracer;
mod workload;

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::{build, workspace_root};
use tracer::Mode;
use workload::Workload;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds (each runs every workload under every mode; about 15 s each on
    /// 2 cores, 20 s on a busy machine).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Worker threads of the Node.js workload, and threads of the mmap/munmap helper.
    #[arg(long, default_value_t = 4)]
    threads: u32,
    /// fs.readFileSync calls per Worker (enough for half a second of work, past the JIT's
    /// warm-up).
    #[arg(long, default_value_t = 12000)]
    node_iterations: u32,
    /// (mmap; touch; munmap) per helper thread.
    #[arg(long, default_value_t = 20000)]
    churn_iterations: u32,
    /// Threads of the many-threads case.
    #[arg(long, default_value_t = 10_000)]
    scale_threads: u32,
    /// Steady-state window of the many-threads case, in seconds (a multiple of 30 covers the
    /// profiler's periodic full reading of its map evenly).
    #[arg(long, default_value_t = 30)]
    scale_secs: u64,
    /// Rounds of the many-threads case (0: skip it).
    #[arg(long, default_value_t = 3)]
    scale_rounds: usize,
    /// Interleaved rounds of what the agent costs on Node hosts, in each mode, beside no
    /// tracing and the floors (about 35 s each; 0: skip it).
    #[arg(long, default_value_t = 9)]
    agent_rounds: usize,
    /// Runs of the agent accounted by the kernel's BPF statistics and the scheduler, after
    /// the interleaved rounds (each workload under each accounted tracer; 0: skip them).
    #[arg(long, default_value_t = 2)]
    agent_accounted_rounds: usize,
    /// Rounds of what contention mode captures of the wait, both modes on the same runs
    /// (about 40 s each; 0: skip it).
    #[arg(long, default_value_t = 3)]
    capture_rounds: usize,
    /// Rounds of what the profiler's own reads of a process cost its lock, on a Node process
    /// starting 250 Workers (about 8 s each; 0: skip it).
    #[arg(long, default_value_t = 3)]
    reads_rounds: usize,
    /// Rounds of a reader that falls behind: the profiler's output read at once, then left
    /// unread for 10 s, under thread churn (about 25 s each; 0: skip it).
    #[arg(long, default_value_t = 3)]
    reader_rounds: usize,
    /// Another build of mmaplock-prof (one before a change) run beside this one in the
    /// reader and cold rounds.
    #[arg(long, value_name = "PATH")]
    reader_baseline: Option<PathBuf>,
    /// Only these sections: `agent` (what the agent costs), `capture` (what contention mode
    /// captures), `reads` (what the profiler's reads cost), `reader` (a reader that falls
    /// behind), `cold` (the demo's sampled stacks at a cold start, idle and busy host),
    /// `holder` (what a holder's stack costs per sampled wait, from the kernel's accounting),
    /// `escalate` (what the agent's triggered capture costs while it runs), `advice` (what a
    /// finding's advice gives back against its prediction); repeatable.
    /// Default: everything but `escalate`.
    #[arg(long, value_parser = ["agent", "capture", "reads", "reader", "cold", "holder", "escalate", "advice"])]
    only: Vec<String>,
    /// Rounds of the cold start: the demo on an idle host, then a busy one (about 10 s each;
    /// 0: skip it).
    #[arg(long, default_value_t = 5)]
    cold_rounds: usize,
    /// Rounds of what a holder's stack costs: the long holder without stacks, then with
    /// every wait sampled (about 15 s each; 0: skip it).
    #[arg(long, default_value_t = 3)]
    holder_rounds: usize,
    /// Rounds of `--only escalate` (each 3 runs of 20 s: none, the agent capturing, none again).
    #[arg(long, default_value_t = 3)]
    escalate_rounds: usize,
    /// Interleaved rounds of what a finding's advice gives back against its prediction, on
    /// the lanes fixture's two shapes (each round the base, the advice, the base again; about
    /// 17 s each; a multiple of 3 puts each run at each place of the order equally often; 0:
    /// skip it).
    #[arg(long, default_value_t = 6)]
    advice_rounds: usize,
    /// Where results.json and results.md go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

pub fn run(linker_dir: &std::path::Path, args: BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!("the benchmark loads eBPF programs: run `sudo -E cargo xtask bench`");
    }
    if args.rounds == 0 && args.only.is_empty() {
        bail!("--rounds must be at least 1");
    }
    build(linker_dir, true)?;
    crate::packages::ensure_bpftrace()?;
    crate::packages::ensure_tracefs()?;
    let out_dir = workspace_root().join(&args.out);
    fs::create_dir_all(&out_dir)?;
    fs::write(out_dir.join("data.bin"), vec![0x5au8; 64 * 1024])?;
    let prof = pin_binaries(&out_dir)?;
    if !args.only.is_empty() {
        return sections_only(&args, &prof, &out_dir);
    }
    let stats = procfs::BpfStats::enable()?;

    let load_at_start = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let began = std::time::Instant::now();
    let mut samples = Vec::new();
    for round in 0..args.rounds {
        for (wi, &w) in Workload::ALL.iter().enumerate() {
            for k in 0..Mode::ALL.len() {
                let mode = Mode::ALL[(round + wi + k) % Mode::ALL.len()];
                let s = workload::run(round, w, mode, &args, &out_dir, &prof)?;
                eprintln!(
                    "[{:>4.0} s] round {}/{}: {:<34} {:<28} {:>9.0} ops/s{}",
                    began.elapsed().as_secs_f64(),
                    round + 1,
                    args.rounds,
                    w.name(),
                    mode.name(),
                    s.ops_per_s,
                    s.cost.as_ref().map_or(String::new(), |c| format!(
                        ", {:.1} BPF ns/event",
                        c.ns_per_event()
                    ))
                );
                samples.push(s);
            }
        }
    }
    // The many-threads case measures the profiler as it runs in production: without the
    // kernel's BPF statistics (which add two clock reads to every program run, its flush
    // iterator's included).
    drop(stats);
    // Before the many-threads case, whose 10,000 threads raise the load average by themselves.
    let load_after = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut scale_rounds = Vec::new();
    for i in 0..args.scale_rounds {
        let r = scale::run(&args, &prof, &out_dir, i + 1)?;
        eprintln!(
            "[{:>4.0} s] many threads {}/{}: {} tracked, warm-up {:.1} s, steady {:.2}% CPU, RSS max {:.1} MiB",
            began.elapsed().as_secs_f64(),
            i + 1,
            args.scale_rounds,
            r.threads_tracked,
            r.warmup.as_secs_f64(),
            r.cpu_pct,
            r.rss_max_mib
        );
        scale_rounds.push(r);
    }
    // The agent as it runs on a host: without the kernel's BPF statistics too.
    let agent_runs = agent::run(args.agent_rounds, &prof, &out_dir)?;
    let mut results = report::summarize(
        &args,
        &samples,
        &scale_rounds,
        [load_at_start.trim(), load_after.trim()],
    );
    if !agent_runs.is_empty() {
        let (mut json, mut md) = agent::summarize(&agent_runs);
        let accounted = agent::accounted::run(args.agent_accounted_rounds, &prof, &out_dir)?;
        let (j, m) = agent::accounted::summarize(&accounted);
        json["accounted"] = j;
        md.push_str(&m);
        results.json["agent"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    let captures = capture::run(args.capture_rounds, &prof, &out_dir)?;
    if !captures.is_empty() {
        let (json, md) = capture::summarize(&captures);
        results.json["capture"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    let reads = reads::run(args.reads_rounds, &prof, &out_dir)?;
    if !reads.is_empty() {
        let (json, md) = reads::summarize(&reads);
        results.json["reads"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    let readers = reader::run(args.reader_rounds, &prof, args.reader_baseline.as_deref())?;
    if !readers.is_empty() {
        let (json, md) = reader::summarize(&readers);
        results.json["reader"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    let holders = holder::run(args.holder_rounds, &prof, &out_dir)?;
    if !holders.is_empty() {
        let (json, md) = holder::summarize(&holders);
        results.json["holder"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    let colds = cold::run(args.cold_rounds, &prof, args.reader_baseline.as_deref())?;
    if !colds.is_empty() {
        let (json, md) = cold::summarize(&colds);
        results.json["cold"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    if args.advice_rounds > 0 {
        let (json, md) = advice::summarize(&advice::run(args.advice_rounds, &prof, &out_dir)?);
        results.json["advice"] = json;
        results.markdown.push('\n');
        results.markdown.push_str(&md);
    }
    fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&results.json)?,
    )?;
    fs::write(out_dir.join("results.md"), &results.markdown)?;
    println!("{}", results.markdown);
    eprintln!("written: {}/results.{{json,md}}", out_dir.display());
    Ok(())
}

/// `--only`: the sections asked for, each written to `SECTION.{json,md}`.
fn sections_only(
    args: &BenchArgs,
    prof: &std::path::Path,
    out_dir: &std::path::Path,
) -> Result<()> {
    let write = |name: &str, (json, md): (serde_json::Value, String)| -> Result<()> {
        fs::write(
            out_dir.join(format!("{name}.json")),
            serde_json::to_string_pretty(&json)?,
        )?;
        fs::write(out_dir.join(format!("{name}.md")), &md)?;
        println!("{md}");
        eprintln!("written: {}/{name}.{{json,md}}", out_dir.display());
        Ok(())
    };
    if args.only.iter().any(|s| s == "agent") {
        let runs = agent::run(args.agent_rounds, prof, out_dir)?;
        let (mut json, mut md) = if runs.is_empty() {
            (
                serde_json::json!({}),
                "## What the agent costs\n".to_string(),
            )
        } else {
            agent::summarize(&runs)
        };
        let accounted = agent::accounted::run(args.agent_accounted_rounds, prof, out_dir)?;
        let (j, m) = agent::accounted::summarize(&accounted);
        json["accounted"] = j;
        md.push_str(&m);
        write("agent", (json, md))?;
    }
    if args.only.iter().any(|s| s == "capture") {
        let captures = capture::run(args.capture_rounds.max(1), prof, out_dir)?;
        write("capture", capture::summarize(&captures))?;
    }
    if args.only.iter().any(|s| s == "reads") {
        let rounds = reads::run(args.reads_rounds.max(1), prof, out_dir)?;
        write("reads", reads::summarize(&rounds))?;
    }
    if args.only.iter().any(|s| s == "escalate") {
        let runs = escalate::run(args.escalate_rounds.max(1), prof, out_dir)?;
        write("escalate", escalate::summarize(&runs))?;
    }
    if args.only.iter().any(|s| s == "reader") {
        let runs = reader::run(
            args.reader_rounds.max(1),
            prof,
            args.reader_baseline.as_deref(),
        )?;
        write("reader", reader::summarize(&runs))?;
    }
    if args.only.iter().any(|s| s == "holder") {
        let runs = holder::run(args.holder_rounds.max(1), prof, out_dir)?;
        write("holder", holder::summarize(&runs))?;
    }
    if args.only.iter().any(|s| s == "cold") {
        let runs = cold::run(
            args.cold_rounds.max(1),
            prof,
            args.reader_baseline.as_deref(),
        )?;
        write("cold", cold::summarize(&runs))?;
    }
    if args.only.iter().any(|s| s == "advice") {
        let outcome = advice::run(args.advice_rounds.max(1), prof, out_dir)?;
        write("advice", advice::summarize(&outcome))?;
    }
    Ok(())
}

/// Copies the binaries just built next to the results and returns the profiler's copy (the
/// helper `mmap-churn` is beside it): the target directory is shared, and a build during the
/// run must not change what is measured half-way.
fn pin_binaries(out_dir: &std::path::Path) -> Result<PathBuf> {
    let bin = out_dir.join("bin");
    fs::create_dir_all(&bin)?;
    for name in ["mmaplock-prof", "mmap-churn", "long-holder", "thread-waves"] {
        let to = bin.join(name);
        // Never write through a hard link into the target directory.
        let _ = fs::remove_file(&to);
        fs::copy(crate::target_dir().join("release").join(name), &to)
            .with_context(|| format!("copy {name} to {}", bin.display()))?;
    }
    Ok(bin.join("mmaplock-prof"))
}
