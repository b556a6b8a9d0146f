//! What the profiler's own reads of a process cost its lock (issue 34: at most 1% of the
//! process's wait): a Node process starting 250 Workers in waves of 4 (`tests/fixtures/
//! waves.js`, each Worker a new isolate, new code), profiled with stacks sampled as by
//! default. Per round: the profiler's read holds of the process's lock over the wait of the
//! process's own threads, and what it read (`read_by_profiler`). tests/tests/maps_reads.rs
//! asserts the counts; the share, a ratio of times, is measured here only.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    capture::{last_line, started},
    procfs::Guard,
    stats::Spread,
};
use crate::workspace_root;

const WORKERS: u32 = 250;
const WAVE: u32 = 4;
const ITERATIONS: u32 = 200;

/// One round's figures for the node process.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub duration_s: f64,
    /// Its own threads' wait on its lock (write and read), ns.
    pub wait_ns: u64,
    /// The profiler's read acquisitions of the lock, and their holds, ns.
    pub acquisitions: u64,
    pub hold_ns: u64,
    /// `read_by_profiler`: maps read whole, mappings asked for, memory reads and ranges, and
    /// the V8 objects taken from the copies made at the samples instead of read.
    pub maps: u64,
    pub map_queries: u64,
    pub memory: u64,
    pub memory_ranges: u64,
    pub v8_copied: u64,
    /// The profiler's peak resident memory (its maximum RSS as the kernel kept it), MiB.
    pub peak_rss_mib: f64,
}

impl Round {
    fn share_pct(&self) -> f64 {
        100.0 * self.hold_ns as f64 / self.wait_ns as f64
    }
}

fn sum(v: &Value, side: &str, field: &str) -> u64 {
    v[side][field]["sum"].as_u64().unwrap_or(0)
}

/// The round's figures from the summary's entry for process `pid`.
fn figures(summary: &Value, pid: u64) -> Result<Round> {
    let p = summary["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pid"] == pid)
        .context("the node process in the summary")?;
    let ours = &p["profiler"];
    let read = &p["read_by_profiler"];
    let n = |v: &Value, f: &str| v[f].as_u64().unwrap_or(0);
    Ok(Round {
        duration_s: summary["duration_s"].as_f64().unwrap_or(0.0),
        wait_ns: sum(p, "write", "wait_ns") + sum(p, "read", "wait_ns"),
        acquisitions: n(&ours["read"], "count"),
        hold_ns: sum(ours, "read", "hold_ns") + sum(ours, "write", "hold_ns"),
        maps: n(read, "maps"),
        map_queries: n(read, "map_queries"),
        memory: n(read, "memory"),
        memory_ranges: n(read, "memory_ranges"),
        v8_copied: n(read, "v8_copied"),
        peak_rss_mib: 0.0,
    })
}

/// One round: the workload ready, the profiler on its pid, go, done, the profiler stopped.
fn round(prof: &Path, dir: &Path) -> Result<Round> {
    let mut w = Guard(
        Command::new("node")
            .arg(workspace_root().join("tests/fixtures/waves.js"))
            .args([WORKERS, WAVE, ITERATIONS].map(|n| n.to_string()))
            .arg(dir.join("data.bin"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start waves.js")?,
    );
    let mut out = BufReader::new(w.0.stdout.take().context("stdout")?);
    let mut line = || -> Result<String> {
        let mut l = String::new();
        out.read_line(&mut l)?;
        Ok(l.trim().to_string())
    };
    // {"main":PID}, then ready.
    let first = line()?;
    if line()? != "ready" {
        bail!("waves.js said {first:?}, not ready");
    }
    let pid = w.0.id();
    let file = dir.join("reads.json");
    let mut c = Command::new(prof);
    c.args(["-p", &pid.to_string(), "-i", "0", "-f", "json", "-o"])
        .arg(&file);
    let mut p = started(c, "attached in")?;
    let mut stdin = w.0.stdin.take().context("stdin")?;
    stdin.write_all(b"go\n")?;
    let done = line()?;
    if done != "done" {
        bail!("waves.js said {done:?}, not done");
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGINT) };
    let peak_kib = reap(&mut p, Duration::from_secs(60))?;
    stdin.write_all(b"exit\n")?;
    let _ = w.0.wait();
    let mut r = figures(&last_line(&file)?, u64::from(pid))?;
    r.peak_rss_mib = peak_kib as f64 / 1024.0;
    Ok(r)
}

/// Waits for the profiler to end and reaps it: its maximum resident memory, KiB.
fn reap(g: &mut Guard, within: Duration) -> Result<u64> {
    let pid = g.0.id() as i32;
    let t0 = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data for wait4 to fill; our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above, with valid pointers.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if got == pid {
            // ru_maxrss is in KiB.
            return Ok(ru.ru_maxrss as u64);
        }
        if got < 0 {
            bail!("wait4: {}", std::io::Error::last_os_error());
        }
        if t0.elapsed() > within {
            bail!("a profiler did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `rounds` rounds.
pub fn run(rounds: usize, prof: &Path, dir: &Path) -> Result<Vec<Round>> {
    let mut out = Vec::new();
    for i in 0..rounds {
        let r = round(prof, dir)?;
        eprintln!(
            "reads round {}/{rounds}: {:.2}% ({:.2} ms held over {:.1} ms of wait, {} read \
             acquisitions); map read whole {}, {} mappings asked for, {} memory reads ({} ranges), \
             {} V8 objects copied at the samples; the profiler's peak RSS {:.1} MiB",
            i + 1,
            r.share_pct(),
            r.hold_ns as f64 / 1e6,
            r.wait_ns as f64 / 1e6,
            r.acquisitions,
            r.maps,
            r.map_queries,
            r.memory,
            r.memory_ranges,
            r.v8_copied,
            r.peak_rss_mib
        );
        out.push(r);
    }
    Ok(out)
}

/// The section's JSON and markdown.
pub fn summarize(rounds: &[Round]) -> (Value, String) {
    let sp = |f: &dyn Fn(&Round) -> f64| Spread::of(rounds.iter().map(f));
    let rows: [(&str, Option<Spread>, usize, &str); 11] = [
        ("run (s)", sp(&|r| r.duration_s), 1, "duration_s"),
        (
            "process's wait (ms)",
            sp(&|r| r.wait_ns as f64 / 1e6),
            1,
            "wait_ms",
        ),
        (
            "profiler's read acquisitions",
            sp(&|r| r.acquisitions as f64),
            0,
            "acquisitions",
        ),
        (
            "their holds (ms)",
            sp(&|r| r.hold_ns as f64 / 1e6),
            2,
            "hold_ms",
        ),
        (
            "holds over wait (target: at most 1%)",
            sp(&|r| r.share_pct()),
            2,
            "share_pct",
        ),
        ("map read whole", sp(&|r| r.maps as f64), 0, "maps"),
        (
            "mappings asked for (PROCMAP_QUERY)",
            sp(&|r| r.map_queries as f64),
            0,
            "map_queries",
        ),
        (
            "memory reads (process_vm_readv)",
            sp(&|r| r.memory as f64),
            0,
            "memory",
        ),
        (
            "their ranges",
            sp(&|r| r.memory_ranges as f64),
            0,
            "memory_ranges",
        ),
        (
            "V8 objects copied at the samples (not read)",
            sp(&|r| r.v8_copied as f64),
            0,
            "v8_copied",
        ),
        (
            "the profiler's peak RSS (MiB; target: under 100)",
            sp(&|r| r.peak_rss_mib),
            1,
            "peak_rss_mib",
        ),
    ];
    let mut md = format!(
        "## What the profiler's reads cost the process's lock\n\n\
         A Node process starting {WORKERS} Workers, {WAVE} at a time, each doing {ITERATIONS} \
         `readFileSync` of 64 KiB (`tests/fixtures/waves.js`), profiled with stacks sampled \
         as by default; the profiler's read holds of the process's lock over the wait of the \
         process's own threads, and what it read (`read_by_profiler`); median (min - max) \
         over the rounds.\n\n| figure | value |\n|---|---:|\n"
    );
    let mut j = serde_json::Map::new();
    for (name, s, digits, key) in rows {
        md.push_str(&format!("| {name} | {} |\n", super::stats::show(s, digits)));
        j.insert(key.into(), super::stats::json_of(s, 3));
    }
    (json!(j), md)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures come from the node process's entry, not another's, and its profiler
    /// entry and reads may be absent (the profiler took the lock not once).
    #[test]
    fn a_rounds_figures_are_the_node_process() {
        let stats = |count: u64, wait: u64, hold: u64| json!({"count": count, "wait_ns": {"sum": wait}, "hold_ns": {"sum": hold}});
        let summary = json!({"duration_s": 6.5, "processes": [
            {"pid": 7, "write": stats(1, 999, 0), "read": stats(1, 999, 0)},
            {"pid": 42, "write": stats(10, 3_000_000, 0), "read": stats(5, 1_000_000, 0),
             "profiler": {"read": stats(40, 0, 20_000), "write": stats(0, 0, 0)},
             "read_by_profiler": {"maps": 2, "map_queries": 9, "memory": 30, "memory_ranges": 40, "v8_copied": 12}},
            {"pid": 43, "write": stats(1, 5, 0), "read": stats(0, 0, 0)}
        ]});
        let r = figures(&summary, 42).unwrap();
        assert_eq!(
            (
                r.wait_ns,
                r.acquisitions,
                r.hold_ns,
                r.maps,
                r.map_queries,
                r.memory
            ),
            (4_000_000, 40, 20_000, 2, 9, 30)
        );
        assert_eq!((r.memory_ranges, r.v8_copied, r.duration_s), (40, 12, 6.5));
        assert!((r.share_pct() - 0.5).abs() < 1e-9);
        let bare = figures(&summary, 43).unwrap();
        assert_eq!((bare.acquisitions, bare.maps, bare.wait_ns), (0, 0, 5));
        assert!(figures(&summary, 44).is_err());
    }
}
