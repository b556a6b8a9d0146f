//! The agent's cost as a table and JSON: each tracer's ratios to its round's untraced runs,
//! and the targets' verdicts.

use serde_json::{Value, json};

use super::{Load, Run, Tracer};
use crate::bench::stats::Spread;

/// A tracer's figures on one workload: ratios to the same round's untraced runs.
struct Row {
    cpu_ratio: Option<Spread>,
    tput_ratio: Option<Spread>,
    tput: Option<Spread>,
    tracer_cpu_pct: Option<Spread>,
}

fn row(runs: &[Run], load: Load, t: Tracer) -> Row {
    let untraced = |round: usize, which: Tracer| {
        runs.iter()
            .find(|r| r.round == round && r.load == load && r.tracer == which)
    };
    // The baseline of a round: the mean of its two untraced runs; for the second of them,
    // the first alone (the A/A comparison).
    let base = |round: usize, f: &dyn Fn(&Run) -> f64| -> Option<f64> {
        let first = f(untraced(round, Tracer::None)?);
        if t == Tracer::NoneAgain {
            return Some(first);
        }
        Some(untraced(round, Tracer::NoneAgain).map_or(first, |again| (first + f(again)) / 2.0))
    };
    let mine: Vec<&Run> = runs
        .iter()
        .filter(|r| r.load == load && r.tracer == t)
        .collect();
    let ratio = |f: &dyn Fn(&Run) -> f64| {
        Spread::of(mine.iter().filter_map(|r| Some(f(r) / base(r.round, f)?)))
    };
    Row {
        cpu_ratio: ratio(&Run::cpu_per_op),
        tput_ratio: ratio(&Run::ops_per_s),
        tput: Spread::of(mine.iter().map(|r| r.ops_per_s())),
        tracer_cpu_pct: Spread::of(mine.iter().map(|r| r.tracer_cpu_s / r.wall_s * 100.0)),
    }
}

/// The section's JSON and its markdown, with the target's verdict: the agent in contention
/// mode at most +1% CPU per operation, its throughput within the A/A comparison's range.
pub fn summarize(runs: &[Run]) -> (Value, String) {
    let rounds = runs.iter().map(|r| r.round).max().map_or(0, |m| m + 1);
    let mut md = format!(
        "## What the agent costs (interleaved rounds: {rounds})\n\n\
         Each round runs each workload with no tracing, with the agent in each mode (default \
         selection: every node process) and with the floors, in rotating order. CPU per \
         operation is the node processes' CPU (the BPF programs run in their threads) plus \
         the tracer's own, over the operations; each figure is a ratio to the mean of the same \
         round's two untraced runs: median (min - max). The second untraced run against the \
         first is this machine's own noise: differences inside its spread are not resolved.\n\n\
         | workload | tracer | CPU per op | throughput | tracer's own CPU (% of a core) |\n\
         |---|---|---|---|---|\n"
    );
    let mut json_rows = Vec::new();
    let mut targets = Vec::new();
    let show = |s: &Option<Spread>, pct: bool| {
        s.as_ref().map_or("-".into(), |s| {
            if pct {
                s.show(2)
            } else {
                let p = |x: f64| format!("{:+.1}%", (x - 1.0) * 100.0);
                if s.n < 2 {
                    p(s.median)
                } else {
                    format!("{} ({} - {})", p(s.median), p(s.min), p(s.max))
                }
            }
        })
    };
    for load in Load::ALL {
        let aa = row(runs, load, Tracer::NoneAgain);
        for t in Tracer::ALL.into_iter().filter(|&t| t != Tracer::None) {
            let r = row(runs, load, t);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                load.name(),
                t.name(),
                show(&r.cpu_ratio, false),
                show(&r.tput_ratio, false),
                show(&r.tracer_cpu_pct, true),
            ));
            let j = |s: &Option<Spread>| s.as_ref().map_or(Value::Null, |s| s.json(4));
            json_rows.push(json!({
                "workload": load.name(), "tracer": t.name(),
                "cpu_per_op_ratio": j(&r.cpu_ratio), "throughput_ratio": j(&r.tput_ratio),
                "ops_per_s": j(&r.tput), "tracer_cpu_pct": j(&r.tracer_cpu_pct),
            }));
            if t == Tracer::AgentEscalateIdle {
                targets.push((
                    format!(
                        "{}: the agent with --escalate-dir on and nothing crossing costs at most +1% CPU per op",
                        load.name()
                    ),
                    r.cpu_ratio.is_some_and(|s| s.median <= 1.01),
                ));
            }
            if t == Tracer::AgentContention {
                let cpu_ok = r.cpu_ratio.is_some_and(|s| s.median <= 1.01);
                let tput_ok = match (r.tput_ratio, aa.tput_ratio) {
                    (Some(a), Some(n)) => a.median >= n.min.min(1.0) && a.median <= n.max.max(1.0),
                    _ => false,
                };
                targets.push((
                    format!(
                        "{}: the agent in contention mode costs at most +1% CPU per op, its throughput within the A/A range",
                        load.name()
                    ),
                    cpu_ok && tput_ok,
                ));
            }
        }
    }
    // What the capturing agent wrote.
    let (n, bytes) = (runs.iter()).fold((0, 0), |(n, b), r| (n + r.captures.0, b + r.captures.1));
    if n > 0 {
        md.push_str(&format!(
            "\nCaptures written by the capturing agent: {n} in all, {:.0} KiB each on average \
             (report.ndjson, report.html, profile.pb.gz and before.pb.gz).\n",
            bytes as f64 / n as f64 / 1024.0
        ));
    }
    md.push_str("\nTargets:\n\n");
    for (what, met) in &targets {
        md.push_str(&format!(
            "- {what}: {}\n",
            if *met { "met" } else { "NOT met" }
        ));
    }
    let json = json!({
        "rounds": rounds,
        "rows": json_rows,
        "targets": targets.iter().map(|(w, m)| json!({"target": w, "met": m})).collect::<Vec<_>>(),
        "runs": runs.iter().map(|r| json!({
            "round": r.round, "workload": r.load.name(), "tracer": r.tracer.name(),
            "ops": r.ops, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "tracer_cpu_s": r.tracer_cpu_s,
            "captures": r.captures.0, "capture_bytes": r.captures.1,
        })).collect::<Vec<_>>(),
    });
    (json, md)
}
