//! The benchmark's figures and runs as JSON (results.json), beside their markdown tables.

use serde_json::{Value, json};

use super::{
    report::Row,
    stats::{json_of, round},
    tracer::Mode,
    workload::{Sample, Workload},
};

/// A row of figures, for the JSON's `rows`.
pub(super) fn row_json(w: Workload, m: Mode, r: &Row) -> Value {
    json!({
        "workload": w.name(),
        "mode": m.name(),
        "ops_per_s": json_of(r.ops_per_s, 0),
        "slowdown_pct": json_of(r.slowdown_pct, 1),
        "bpf_ns_per_event": json_of(r.ns_per_event, 1),
        "bpf_ns_per_event_vs_clock_floor": json_of(r.ns_per_event_vs_floor, 2),
        "programs": r.programs.iter().map(|(tp, f)| json!({
            "tracepoint": tp.name(),
            "ns_per_run": json_of(f.ns_per_run, 1),
            "vs_clock_floor": json_of(f.vs_floor, 2),
        })).collect::<Vec<_>>(),
        "load": r.load.as_ref().map(|l| json!({
            "total_ms": json_of(l.total_ms, 1),
            "steps": l.steps.iter().map(|(n, ms)| json!({"step": n, "ms": json_of(*ms, 1)})).collect::<Vec<_>>(),
            "programs": l.programs.iter().map(|(n, i, ms)| json!({
                "program": n, "verified_insns": json_of(*i, 0), "ms": json_of(*ms, 1),
            })).collect::<Vec<_>>(),
        })),
        "events_per_s": json_of(r.events_per_s, 0),
        "attach_ms": json_of(r.attach_ms, 1),
        "tracer_cpu_pct": json_of(r.cpu_pct, 2),
        "tracer_peak_rss_mib": json_of(r.peak_rss_mib, 1),
        "us_per_sampled_stack": json_of(r.us_per_stack, 1),
        "sampled_stacks_per_s": json_of(r.stacks_per_s, 0),
        "lost": r.lost,
    })
}

/// A run as measured, for the JSON's `samples`.
pub(super) fn sample_json(s: &Sample) -> Value {
    json!({
        "round": s.round + 1,
        "workload": s.workload.name(),
        "mode": s.mode.name(),
        "ops_per_s": s.ops_per_s.round(),
        "tracer": s.cost.as_ref().map(|c| json!({
            "attach_ms": round(c.attach.as_secs_f64() * 1e3, 2),
            "wall_s": round(c.wall.as_secs_f64(), 3),
            "cpu_s": c.cpu.as_secs_f64(),
            "peak_rss_kib": c.peak_rss_kib,
            "lost": c.lost,
            "programs": c.programs.iter().map(|p| json!({
                "name": p.name, "runs": p.runs, "ns": p.ns,
            })).collect::<Vec<_>>(),
        })),
    })
}

/// The machine and its load around the workload rounds.
pub(super) fn machine(load: [&str; 2]) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg_before_workloads": load[0],
        "loadavg_after_workloads": load[1],
    })
}
