//! What a holder's stack costs per sampled wait, from the kernel's own accounting: the
//! blockers' long holder (40 mprotects of 256 MiB while 3 churners wait behind it) under the
//! one-shot profiler in contention mode, with every contended wait sampled (`--stack-sample
//! 1`: the waiter's stack and, behind a writer of its process, the holder's) and with none
//! (`--stack-sample 0`), interleaved. Both stacks are taken in the `contention_begin` program
//! that runs in the waiter, so its extra run time over the stack records sent is the cost of
//! one stack record; a holder's is one such record per sampled wait, paid by the waiter
//! (nothing runs on the holder's path: it is not waiting).

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::{
    capture::{started_with_stdout, wait},
    procfs::{BpfStats, bpf_programs_named},
    stats::{Spread, json_of, show},
    workload::start_ready,
};

/// One run.
#[derive(Clone, Debug)]
pub struct HolderRun {
    pub stack_sample: u32,
    /// The `contention_begin` programs' runs and run time (ns) over the run.
    pub runs: u64,
    pub ns: u64,
    /// Stack records the run's summary accounts for: waiters' and holders' (sent, or lost).
    pub waiter_stacks: u64,
    pub holder_stacks: u64,
}

/// Sums the `count` of `samples` rows of every process, holders' apart.
fn sampled(summary: &Value) -> (u64, u64) {
    let (mut waiters, mut holders) = (0, 0);
    for p in summary["processes"].as_array().into_iter().flatten() {
        for s in p["samples"]["stacks"].as_array().into_iter().flatten() {
            let n = s["count"].as_u64().unwrap_or(0);
            if s["holder"] == true {
                holders += n;
            } else {
                waiters += n;
            }
        }
        let cut = p["samples"]["cut"]["count"].as_u64().unwrap_or(0);
        waiters += cut;
    }
    let lost = &summary["lost"];
    (
        waiters + lost["stacks"].as_u64().unwrap_or(0),
        holders + lost["holder_stacks"].as_u64().unwrap_or(0),
    )
}

fn one(prof: &Path, dir: &Path, stack_sample: u32) -> Result<HolderRun> {
    let bin = prof.parent().context("bin dir")?;
    let (mut w, mut wout) = start_ready(Command::new(bin.join("long-holder")).args(["40", "3"]))?;
    let pid = w.0.id().to_string();
    let out = dir.join(format!("holder-{stack_sample}.json"));
    let mut cmd = Command::new(prof);
    cmd.args(["-p", &pid, "--mode", "contention", "-f", "json", "-o"])
        .arg(&out)
        .args(["--stack-sample", &stack_sample.to_string()])
        .stdout(Stdio::null());
    let mut p = started_with_stdout(cmd, "attached in")?;
    let ppid = p.0.id();
    // The profiler ends with its target: its programs' statistics are read until then.
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(Mutex::new((0u64, 0u64)));
    let poller = {
        let (stop, last) = (stop.clone(), last.clone());
        std::thread::spawn(move || {
            let mut names = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                let progs = bpf_programs_named(ppid, &mut names);
                let begin = progs
                    .iter()
                    .filter(|p| p.name.starts_with("contention_beg"));
                let (runs, ns) = begin.fold((0, 0), |(r, n), p| (r + p.runs, n + p.ns));
                if runs > 0 {
                    *last.lock().unwrap() = (runs, ns);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    w.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut rest = String::new();
    let _ = wout.read_to_string(&mut rest);
    let _ = w.0.wait();
    wait(&mut p, Duration::from_secs(120))?;
    stop.store(true, Ordering::Relaxed);
    let _ = poller.join();
    let text = std::fs::read_to_string(&out)?;
    let summary: Value = serde_json::from_str(text.lines().last().context("no summary")?)?;
    let (waiter_stacks, holder_stacks) = sampled(&summary);
    let (runs, ns) = *last.lock().unwrap();
    Ok(HolderRun {
        stack_sample,
        runs,
        ns,
        waiter_stacks,
        holder_stacks,
    })
}

/// `rounds` rounds, each without stacks then with every wait sampled.
pub fn run(rounds: usize, prof: &Path, dir: &Path) -> Result<Vec<HolderRun>> {
    let _stats = BpfStats::enable()?;
    let mut runs = Vec::new();
    for round in 0..rounds {
        for s in [0, 1] {
            let r = one(prof, dir, s)?;
            eprintln!(
                "holder round {}/{rounds}, --stack-sample {s}: contention_begin {} runs, {} ns; {} waiters' and {} holders' stacks",
                round + 1,
                r.runs,
                r.ns,
                r.waiter_stacks,
                r.holder_stacks
            );
            runs.push(r);
        }
    }
    Ok(runs)
}

/// The section's JSON and markdown: per round, the sampled run's extra `contention_begin`
/// time over its stack records, against the same round's run without stacks (per run of the
/// program, so that the two runs' different numbers of waits do not count).
pub fn summarize(runs: &[HolderRun]) -> (Value, String) {
    let per_run = |r: &HolderRun| r.ns as f64 / r.runs.max(1) as f64;
    let mut per_record = Vec::new();
    let mut base = Vec::new();
    let mut sampled_ns = Vec::new();
    let mut holders = Vec::new();
    for pair in runs.chunks(2) {
        let [none, every] = pair else { continue };
        if (none.stack_sample, every.stack_sample) != (0, 1) {
            continue;
        }
        let records = every.waiter_stacks + every.holder_stacks;
        if records == 0 || none.runs == 0 {
            continue;
        }
        // What the sampled run's program would have cost without stacks, at its own runs.
        let extra = every.ns as f64 - per_run(none) * every.runs as f64;
        per_record.push(extra / records as f64);
        base.push(per_run(none));
        sampled_ns.push(per_run(every));
        holders.push(every.holder_stacks as f64);
    }
    let record = Spread::of(per_record);
    let base = Spread::of(base);
    let sampled = Spread::of(sampled_ns);
    let holders = Spread::of(holders);
    let md = format!(
        "## What a holder's stack costs per sampled wait\n\n\
         The blockers' long holder (40 mprotects of 256 MiB, 3 churners waiting behind it) \
         under the one-shot profiler in contention mode, without stacks (`--stack-sample 0`) \
         and with every contended wait sampled (`--stack-sample 1`), interleaved; the kernel's \
         run time of the `contention_begin` programs (`kernel.bpf_stats_enabled`), median \
         (min - max) over the rounds. A stack record (the waiter's, or the holder's behind a \
         writer of its process: registers and the top of the user stack, copied without \
         faulting into the ring) costs the sampled run's extra time over its records; the \
         holder's is one record per sampled wait, taken in the waiter's program: the holder, \
         which is not waiting, runs nothing for it.\n\n\
         | contention_begin per run, no stacks (ns) | per run, every wait sampled (ns) | holders' stacks per run of the workload | one stack record, per sampled wait (ns) |\n\
         |---:|---:|---:|---:|\n\
         | {} | {} | {} | {} |\n",
        show(base, 0),
        show(sampled, 0),
        show(holders, 0),
        show(record, 0)
    );
    (
        json!({
            "begin_ns_per_run_without_stacks": json_of(base, 1),
            "begin_ns_per_run_sampled": json_of(sampled, 1),
            "holder_stacks": json_of(holders, 0),
            "ns_per_stack_record": json_of(record, 1),
        }),
        md,
    )
}
