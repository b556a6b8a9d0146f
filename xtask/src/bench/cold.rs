//! What a cold start costs the sampled stacks: `mmaplock-prof demo` (every write's stack
//! sampled, node's V8 metadata read for the first time by a new profiler process), on an idle
//! host and on one whose two cores are kept busy by two loops for the run, this build against
//! a baseline build (one before a change), interleaved. The Workers' run's sampled stacks kept
//! and dropped (`lost.stacks`), and its Workers' reads per second (what the profiling costs
//! the workload, beside the baseline's).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::stats::{Spread, json_of, show};

/// One demo run.
#[derive(Clone, Debug)]
pub struct ColdRun {
    pub build: &'static str,
    pub busy: bool,
    /// The Workers' run: stacks unwound, dropped, and its reads per second.
    pub sampled: u64,
    pub dropped: u64,
    pub reads_per_s: f64,
}

/// Busy loops, one per core asked, killed on drop.
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn start(n: usize) -> Result<Self> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .context("a busy loop")?,
            );
        }
        Ok(Busy(v))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn one(build: &'static str, prof: &Path, busy: bool) -> Result<ColdRun> {
    let _busy = Busy::start(if busy { 2 } else { 0 })?;
    let out = Command::new(prof)
        .args(["demo", "-f", "json"])
        .current_dir(std::env::temp_dir())
        .output()
        .context("mmaplock-prof demo")?;
    if !out.status.success() {
        bail!("demo: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let demo: Value = serde_json::from_str(text.lines().last().context("no demo line")?)?;
    let workers = &demo["runs"][0];
    let report = &workers["report"];
    Ok(ColdRun {
        build,
        busy,
        sampled: report["stack_work"]["stacks"].as_u64().unwrap_or(0),
        dropped: report["lost"]["stacks"].as_u64().unwrap_or(0),
        reads_per_s: workers["reads_per_s"].as_f64().unwrap_or(0.0),
    })
}

/// `rounds` rounds, each on an idle then a busy host, each build in turn.
pub fn run(rounds: usize, prof: &Path, baseline: Option<&Path>) -> Result<Vec<ColdRun>> {
    let mut builds = vec![("this build", prof)];
    builds.extend(baseline.map(|b| ("baseline", b)));
    let mut runs = Vec::new();
    for round in 0..rounds {
        for busy in [false, true] {
            for &(build, bin) in &builds {
                let r = one(build, bin, busy)?;
                eprintln!(
                    "cold round {}/{rounds}, {build}, {}: {} of {} sampled stacks dropped, {:.0} reads/s",
                    round + 1,
                    if busy { "busy host" } else { "idle host" },
                    r.dropped,
                    r.sampled + r.dropped,
                    r.reads_per_s
                );
                runs.push(r);
            }
        }
    }
    Ok(runs)
}

/// The section's JSON and markdown.
pub fn summarize(runs: &[ColdRun]) -> (Value, String) {
    let mut md = String::from(
        "## The cold start (the demo's sampled stacks)\n\n\
         `mmaplock-prof demo` (4 Workers, every write's stack sampled, a new profiler process \
         each run, so node's unwind tables and V8 metadata are read cold), on an idle host and \
         with both cores kept busy by two loops; the Workers' run, median (min - max) over \
         the rounds, and the runs that dropped any. A baseline is another build, given by \
         `--reader-baseline`.\n\n\
         | build | host | sampled stacks dropped | runs dropping any | Workers' reads/s |\n\
         |---|---|---:|---:|---:|\n",
    );
    let mut rows = Vec::new();
    for (build, busy) in ["this build", "baseline"]
        .into_iter()
        .flat_map(|b| [(b, false), (b, true)])
    {
        let rs: Vec<&ColdRun> = (runs.iter())
            .filter(|r| r.busy == busy && r.build == build)
            .collect();
        if rs.is_empty() {
            continue;
        }
        let dropped = Spread::of(rs.iter().map(|r| r.dropped as f64));
        let reads = Spread::of(rs.iter().map(|r| r.reads_per_s));
        let dropping = rs.iter().filter(|r| r.dropped > 0).count();
        let host = if busy { "busy" } else { "idle" };
        md.push_str(&format!(
            "| {build} | {host} | {} | {dropping} of {} | {} |\n",
            show(dropped, 0),
            rs.len(),
            show(reads, 0)
        ));
        rows.push(json!({
            "build": build,
            "host": host,
            "dropped": json_of(dropped, 0),
            "runs": rs.len(),
            "runs_dropping": dropping,
            "sampled": rs.iter().map(|r| r.sampled).collect::<Vec<_>>(),
            "reads_per_s": json_of(reads, 0),
        }));
    }
    (json!({ "rows": rows }), md)
}
