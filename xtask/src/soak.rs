//! `cargo xtask soak`: the agent on every node process of the host for a long run (30
//! minutes by default, in its default mode unless `--mode` says) under a churning Node
//! workload (Worker threads doing readFileSync, each process living a few seconds),
//! measuring the agent's CPU, its RSS drift after warm-up, what it lost, and the workload's
//! throughput against no tracing: rounds of the same workload in processes the agent does
//! not select (node under another name), interleaved with its rounds all along, and rounds
//! with no agent at all before and after. Results: target/bench/soak.{json,md}.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

#[derive(Args)]
pub struct SoakArgs {
    /// Length of the soak, in minutes.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Worker threads per node process.
    #[arg(short = 'k', long, default_value_t = 4)]
    workers: u32,
    /// readFileSync calls per Worker per node process (sets each process's life: a few s).
    #[arg(long, default_value_t = 8000)]
    iterations: u32,
    /// Rounds of the workload without the agent, before and after the soak each.
    #[arg(long, default_value_t = 5)]
    baseline_rounds: u32,
    /// The agent's `--mode` (default: its own default, contention where the kernel can).
    #[arg(long)]
    mode: Option<String>,
}

/// Kills its child on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One node process of the workload (`node` the binary to run): k Workers, `iterations`
/// reads each; ops per second.
fn node_round(root: &Path, node: &Path, file: &Path, k: u32, iterations: u32) -> Result<f64> {
    let mut child = Guard(
        Command::new(node)
            .arg(root.join("profiler/demo/workload.js"))
            .args(["workers", &k.to_string()])
            .arg(file)
            .arg(iterations.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start node")?,
    );
    let mut out = BufReader::new(child.0.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("workload said {line:?}");
    }
    child.0.stdin.as_mut().expect("piped").write_all(b"go\n")?;
    line.clear();
    out.read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line).context("workload result")?;
    let _ = child.0.wait();
    let ops = v["ops"].as_f64().unwrap_or(0.0);
    let ms = v["elapsed_ms"].as_f64().unwrap_or(0.0);
    Ok(if ms > 0.0 { ops / ms * 1e3 } else { 0.0 })
}

/// utime + stime of a process, in seconds, and its RSS in MiB.
fn cpu_and_rss(pid: u32) -> Option<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((ticks, kib / 1024.0))
}

/// The node binary on PATH, resolved.
fn which_node() -> Result<std::path::PathBuf> {
    let out = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .context("look for node")?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if p.is_empty() {
        bail!("no node on PATH");
    }
    Ok(fs::canonicalize(p)?)
}

fn scrape(port: u16) -> Result<String> {
    let out = Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .context("curl")?;
    if !out.status.success() {
        bail!("scrape failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sum of a metric's samples (all label sets) in an exposition.
fn total(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .filter(|l| l[metric.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub fn run(linker_dir: &Path, args: SoakArgs) -> Result<()> {
    if !crate::is_root() {
        bail!("the soak loads eBPF programs: run it as root");
    }
    crate::build(linker_dir, true)?;
    let root = crate::workspace_root();
    let out_dir = root.join("target/bench");
    fs::create_dir_all(&out_dir)?;
    // A private copy: the target directory is shared with builds that may run meanwhile.
    let bin = out_dir.join("mmaplock-prof-soak");
    fs::copy(root.join("target/release/mmaplock-prof"), &bin)?;
    let file = out_dir.join("soak-64k.bin");
    fs::write(&file, vec![7u8; 64 * 1024])?;
    // The same workload in processes the agent does not select (its default selection is
    // the executables named node): node under another name, interleaved with the agent's
    // rounds. Its programs stay attached: what an unselected process pays (contention mode:
    // a flag test and an address compare per contended wait of any lock) is in it.
    let untraced_node = out_dir.join("node-untraced");
    let node_path = which_node()?;
    let _ = fs::remove_file(&untraced_node);
    fs::copy(&node_path, &untraced_node).context("copy node")?;
    let round = || node_round(&root, &node_path, &file, args.workers, args.iterations);
    let untraced_round = || node_round(&root, &untraced_node, &file, args.workers, args.iterations);
    // Rounds without the agent, before and after it ran: the spread its slowdown is read against.
    let baseline = |when: &str| -> Result<Vec<f64>> {
        eprintln!(
            "xtask soak: {} baseline rounds without the agent{when}",
            args.baseline_rounds
        );
        (0..args.baseline_rounds).map(|_| round()).collect()
    };

    let before = baseline("")?;

    let port = 19_464;
    let mut cmd = Command::new(&bin);
    cmd.args([
        "agent",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--bpf-stats",
        "-q",
    ]);
    if let Some(m) = &args.mode {
        cmd.args(["--mode", m]);
    }
    let mut agent = Guard(
        cmd.stdin(Stdio::null())
            .spawn()
            .context("start the agent")?,
    );
    let pid = agent.0.id();
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(args.minutes * 60.0);
    let warmup = Duration::from_secs_f64((args.minutes * 60.0 / 10.0).clamp(10.0, 180.0));
    let mut samples: Vec<(f64, f64, f64)> = Vec::new(); // (s since start, cpu s, rss MiB)
    let mut during = Vec::new();
    let mut interleaved = Vec::new();
    let mut processes = 0u64;
    let mut next_sample = Instant::now();
    while Instant::now() < end {
        if let Some(status) = agent.0.try_wait()? {
            bail!("the agent exited during the soak: {status}");
        }
        during.push(round()?);
        processes += 1;
        // Every other round, one in a process the agent does not select.
        if processes.is_multiple_of(2) {
            interleaved.push(untraced_round()?);
        }
        if Instant::now() >= next_sample {
            if let Some((cpu, rss)) = cpu_and_rss(pid) {
                samples.push((t0.elapsed().as_secs_f64(), cpu, rss));
            }
            next_sample += Duration::from_secs(10);
        }
    }
    let text = scrape(port)?;
    let mode = text
        .lines()
        .find(|l| l.starts_with("mmaplock_build_info{"))
        .and_then(|l| l.split("mode=\"").nth(1)?.split('"').next())
        .unwrap_or("?")
        .to_string();
    // Full mode: three programs per mmap_lock operation; contention mode: two per contended
    // wait of any lock.
    let per_event = if mode == "contention" { 2.0 } else { 3.0 };
    let events = total(&text, "mmaplock_bpf_runs_total") / per_event;
    let lost = total(&text, "mmaplock_lost_total{reason=\"events\"}");
    let lost_all: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("mmaplock_lost_total{"))
        .map(str::to_string)
        .collect();
    let writes = total(&text, "mmaplock_acquisitions_total");
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    let elapsed = t0.elapsed().as_secs_f64();
    drop(agent);

    let after = baseline(", again")?;

    // Steady state: after the warm-up.
    let steady: Vec<&(f64, f64, f64)> = samples
        .iter()
        .filter(|s| s.0 >= warmup.as_secs_f64())
        .collect();
    let (first, last) = (steady.first(), steady.last());
    let (cpu_pct, rss_first, rss_last, rss_max) = match (first, last) {
        (Some(a), Some(b)) if b.0 > a.0 => (
            (b.1 - a.1) / (b.0 - a.0) * 100.0,
            a.2,
            b.2,
            steady.iter().map(|s| s.2).fold(0.0, f64::max),
        ),
        _ => (f64::NAN, f64::NAN, f64::NAN, f64::NAN),
    };
    let drift = (rss_last - rss_first) / rss_first * 100.0;
    let mut all_base: Vec<f64> = before.iter().chain(after.iter()).copied().collect();
    let base = median(&mut all_base);
    let soak_ops = median(&mut during.clone());
    let slowdown = (1.0 - soak_ops / base) * 100.0;
    let inter = median(&mut interleaved.clone());
    let inter_slowdown = (1.0 - soak_ops / inter) * 100.0;
    let (imin, imax) = (
        interleaved.iter().copied().fold(f64::INFINITY, f64::min),
        interleaved.iter().copied().fold(0.0, f64::max),
    );
    let (bmin, bmax) = (
        all_base.iter().copied().fold(f64::INFINITY, f64::min),
        all_base.iter().copied().fold(0.0, f64::max),
    );
    let (dmin, dmax) = (
        during.iter().copied().fold(f64::INFINITY, f64::min),
        during.iter().copied().fold(0.0, f64::max),
    );
    let md = format!(
        "## Agent soak ({mode} mode): {:.1} min, node Workers (k={}) readFileSync 64 KiB, a new node process every ~{:.1} s\n\n\
| figure | measured | target | verdict |\n|---|---:|---:|---|\n\
| events/s the programs handled (BPF runs / {per_event}: {}) | {:.0} | | {} |\n\
| node processes started and exited | {} | hundreds | - |\n\
| agent CPU, steady (after {:.0} s warm-up), % of one core | {:.2} | <= 0.5 | {} |\n\
| agent RSS, steady: first / last / max (MiB) | {:.1} / {:.1} / {:.1} | drift <= 5% | {:.1}% {} |\n\
| lost acquisitions (reason events) | {} | 0 unaccounted | {} |\n\
| workload ops/s, no tracing: median (min - max) over {} rounds | {:.0} ({:.0} - {:.0}) | | |\n\
| workload ops/s, agent on every node process: median (min - max) over {} rounds | {:.0} ({:.0} - {:.0}) | | |\n\
| workload ops/s, interleaved in processes the agent does not select: median (min - max) over {} rounds | {:.0} ({:.0} - {:.0}) | | |\n\
| slowdown with the agent, against the rounds with no agent | {:.1}% | <= 2% | {} |\n\
| slowdown with the agent, against the interleaved rounds | {:.1}% | <= 2% | {} |\n\
| acquisitions counted | {:.0} | | |\n\
| exposition lines at the end (bounded labels) | {} | | |\n\n\
Lost by reason at the end: {}\n",
        elapsed / 60.0,
        args.workers,
        elapsed / processes.max(1) as f64,
        if mode == "contention" {
            "contention events of every lock"
        } else {
            "mmap_lock operations"
        },
        events / elapsed,
        "-",
        processes,
        warmup.as_secs_f64(),
        cpu_pct,
        if cpu_pct <= 0.5 { "met" } else { "NOT met" },
        rss_first,
        rss_last,
        rss_max,
        drift,
        if drift.abs() <= 5.0 { "met" } else { "NOT met" },
        lost,
        if lost == 0.0 {
            "met"
        } else {
            "NOT met (see reasons)"
        },
        all_base.len(),
        base,
        bmin,
        bmax,
        during.len(),
        soak_ops,
        dmin,
        dmax,
        interleaved.len(),
        inter,
        imin,
        imax,
        slowdown,
        if slowdown <= 2.0 { "met" } else { "NOT met" },
        inter_slowdown,
        if inter_slowdown <= 2.0 {
            "met"
        } else {
            "NOT met"
        },
        writes,
        series,
        lost_all.join(", "),
    );
    let json = serde_json::json!({
        "minutes": elapsed / 60.0, "workers": args.workers, "processes": processes,
        "events_per_s": events / elapsed, "agent_cpu_pct": cpu_pct,
        "rss_mib": {"first": rss_first, "last": rss_last, "max": rss_max, "drift_pct": drift},
        "mode": mode, "lost_events": lost, "baseline_ops": all_base, "soak_ops": during,
        "interleaved_ops": interleaved, "slowdown_pct": slowdown,
        "interleaved_slowdown_pct": inter_slowdown, "samples": samples, "series": series,
    });
    fs::write(out_dir.join("soak.md"), &md)?;
    fs::write(
        out_dir.join("soak.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    println!("{md}");
    Ok(())
}
