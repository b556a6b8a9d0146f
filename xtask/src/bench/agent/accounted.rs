//! The agent's cost as the kernel and the scheduler account it, where the interleaved rounds'
//! CPU per operation cannot resolve 1% (their A/A spread is several percent): runs of the
//! same workloads under the agent with `kernel.bpf_stats_enabled` on, each program's run time
//! read from the agent's fds before and after (the programs run in the node threads), and the
//! agent's own CPU from the scheduler. The cost is their sum over what the node processes used
//! themselves (their CPU less the programs' run time in it), once the agent has seen node
//! (the Workers' workload once first: an agent on a host read node's binary long ago). The statistics'
//! own clock reads are counted in the programs' time: an upper bound.

use std::path::Path;

use anyhow::Result;
use serde_json::{Value, json};

use super::{Load, Tracer, cpu_s, run_load, start, stop};
use crate::bench::{
    procfs::{self, BpfStats},
    stats::Spread,
};

/// The tracers accounted: the default agent, with the trigger on (stacks sampled: the
/// waiters' and the holders'), and with every feature armed, pushes included.
const TRACERS: [Tracer; 3] = [
    Tracer::AgentContention,
    Tracer::AgentEscalateIdle,
    Tracer::AgentArmed,
];

/// The push targets of [`Tracer::AgentArmed`], killed on drop: the push tests' Collector and
/// Pyroscope ingest stand-in (`cargo xtask test` builds them; None when they are not built).
type PushSinks = Vec<procfs::Guard>;

fn push_sinks(dir: &Path) -> Result<Option<PushSinks>> {
    crate::packages::ensure_push_servers()?;
    let bin = |name: &str| crate::packages::cache_dir(name).join(name);
    let (otlp, pyroscope) = super::PUSH_PORTS;
    if !bin("otelcol").exists() || !bin("pyroscope-ingest").exists() {
        return Ok(None);
    }
    let config = dir.join("otelcol-bench.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{otlp}\n\
             exporters:\n  file:\n    path: {}\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n\
             \x20   profiles: {{receivers: [otlp], exporters: [file]}}\n\
             \x20   metrics: {{receivers: [otlp], exporters: [file]}}\n",
            dir.join("otelcol-bench.jsonl").display()
        ),
    )?;
    let spawn = |c: &mut std::process::Command| -> Result<procfs::Guard> {
        Ok(procfs::Guard(
            c.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?,
        ))
    };
    let sinks = PushSinks::from([
        spawn(
            std::process::Command::new(bin("otelcol"))
                .arg("--config")
                .arg(&config)
                .arg("--feature-gates=service.profilesSupport"),
        )?,
        spawn(
            std::process::Command::new(bin("pyroscope-ingest"))
                .arg(format!("127.0.0.1:{pyroscope}"))
                .arg(dir.join("pyroscope-bench.jsonl")),
        )?,
    ]);
    // Both listening before the agent's first push.
    for port in [otlp, pyroscope] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                anyhow::bail!("the push sink on port {port} did not start");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    Ok(Some(sinks))
}

/// One accounted run.
#[derive(Clone, Debug)]
pub struct Accounted {
    pub load: Load,
    pub tracer: Tracer,
    pub ops: f64,
    /// The node processes' CPU, the agent's programs' run time in it, and the agent's own CPU,
    /// seconds.
    pub cpu_s: f64,
    pub bpf_s: f64,
    pub tracer_cpu_s: f64,
}

impl Accounted {
    /// What the agent added, over what the workload used itself.
    fn cost(&self) -> f64 {
        (self.bpf_s + self.tracer_cpu_s) / (self.cpu_s - self.bpf_s).max(f64::MIN_POSITIVE)
    }
}

/// The run time of every BPF program `pid` holds, seconds.
fn programs_s(pid: u32) -> f64 {
    procfs::bpf_programs(pid).iter().map(|p| p.ns).sum::<u64>() as f64 * 1e-9
}

/// The Workers' workload once before the measured run (4 processes, contended enough that
/// stacks are sampled and named): the agent reads node's binary (its V8 layout, its unwind
/// tables, blazesym's index of its symbols: once per binary, when its first stack is
/// unwound) as an agent on a host did long ago, so what is measured is what each operation and
/// each new process cost it, not its first look at node (the interleaved rounds' fresh agent
/// pays that in every run: 30-40% of its CPU there, `perf record` says).
fn warm_up(file: &Path) -> Result<()> {
    run_load(Load::Workers, file)?;
    settle();
    Ok(())
}

/// Two of the agent's polls (its interval is 1 s): what the warm-up's processes left it (the
/// stacks of their last second, named at the next poll) is done before its CPU is read.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(2500));
}

/// `rounds` rounds: each workload under each accounted tracer.
pub fn run(rounds: usize, prof: &Path, out_dir: &Path) -> Result<Vec<Accounted>> {
    if rounds == 0 {
        return Ok(Vec::new());
    }
    let _stats = BpfStats::enable()?;
    let file = out_dir.join("data.bin");
    let sinks = push_sinks(out_dir)?;
    let mut runs = Vec::new();
    for round in 0..rounds {
        for load in Load::ALL {
            for tracer in TRACERS {
                if tracer == Tracer::AgentArmed && sinks.is_none() {
                    continue;
                }
                let Some(mut started) = start(tracer, prof)? else {
                    continue;
                };
                let pid = started.child.0.id();
                warm_up(&file)?;
                started.cpu0 = cpu_s(pid);
                let bpf0 = programs_s(pid);
                let (ops, _, cpu) = run_load(load, &file)?;
                let bpf_s = programs_s(pid) - bpf0;
                let tracer_cpu_s = stop(started)?;
                let r = Accounted {
                    load,
                    tracer,
                    ops,
                    cpu_s: cpu,
                    bpf_s,
                    tracer_cpu_s,
                };
                eprintln!(
                    "agent, accounted, round {}/{rounds}: {:<40} {:<34} programs {:.1} ms, agent {:.1} ms, node {:.2} s: {:+.2}%",
                    round + 1,
                    load.name(),
                    tracer.name(),
                    r.bpf_s * 1e3,
                    r.tracer_cpu_s * 1e3,
                    r.cpu_s,
                    r.cost() * 100.0
                );
                runs.push(r);
            }
        }
    }
    Ok(runs)
}

/// The accounted cost as a table (appended to the agent's section) and JSON.
pub fn summarize(runs: &[Accounted]) -> (Value, String) {
    let mut md = String::from(
        "\nAccounted by the kernel and the scheduler (`kernel.bpf_stats_enabled` on, in runs \
         of their own): the agent's programs' run time in the node threads plus the agent's \
         own CPU, over what the node processes used themselves, the agent warm (the Workers' \
         workload run under it first, and two of its polls after it: it has read node's binary); median (min - max) over the runs. The statistics' own clock reads are in the programs' time: an upper \
         bound.\n\n\
         | workload | tracer | programs (ms per run) | programs per operation (ns) | agent's own CPU (ms per run) | accounted cost |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let mut rows = Vec::new();
    for load in Load::ALL {
        for tracer in TRACERS {
            let rs: Vec<&Accounted> = (runs.iter())
                .filter(|r| r.load == load && r.tracer == tracer)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let bpf = Spread::of(rs.iter().map(|r| r.bpf_s * 1e3));
            let own = Spread::of(rs.iter().map(|r| r.tracer_cpu_s * 1e3));
            let per_op = Spread::of(rs.iter().map(|r| r.bpf_s * 1e9 / r.ops.max(1.0)));
            let cost = Spread::of(rs.iter().map(|r| r.cost() * 100.0));
            let show = |s: Option<Spread>, d: usize| s.map_or("-".into(), |s| s.show(d));
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | +{}% |\n",
                load.name(),
                tracer.name(),
                show(bpf, 1),
                show(per_op, 0),
                show(own, 1),
                show(cost, 2)
            ));
            let j = |s: Option<Spread>| s.map_or(Value::Null, |s| s.json(4));
            rows.push(json!({
                "workload": load.name(), "tracer": tracer.name(), "runs": rs.len(),
                "programs_ms": j(bpf), "programs_ns_per_op": j(per_op), "agent_cpu_ms": j(own), "cost_pct": j(cost),
            }));
        }
    }
    (json!(rows), md)
}
