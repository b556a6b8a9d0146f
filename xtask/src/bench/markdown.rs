//! The benchmark's results as markdown tables: throughput, BPF cost with ratios to the
//! floor, the tracer processes, the many-threads case, and the targets.

use std::fmt::Write as _;

use serde_json::Value;

use super::{
    BenchArgs,
    cost::Tp,
    report::{Row, Target},
    scale::ScaleRound,
    stats::{Spread, show},
    tracer::Mode,
    workload::Workload,
};

/// The three load averages of a `/proc/loadavg` line.
fn first3(v: &Value) -> String {
    let l: Vec<&str> = v
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .take(3)
        .collect();
    l.join(" ")
}

/// `52.3 (50.1 - 55.0); 1.21x (1.15 - 1.30)`: a figure and its ratio to the floor.
fn with_ratio(v: Option<Spread>, ratio: Option<Spread>) -> String {
    match (v, ratio) {
        (None, _) => "-".into(),
        (Some(v), None) => v.show(1),
        (Some(v), Some(r)) => format!("{}; {}", v.show(1), r.show_x()),
    }
}

pub(super) fn render(
    args: &BenchArgs,
    j: &Value,
    rows: &[(Workload, Mode, Row)],
    scale: &[ScaleRound],
    targets: &[Target],
) -> String {
    let mut s = String::new();
    let m = &j["machine"];
    let _ = writeln!(
        s,
        "## mmaplock-prof overhead: {} interleaved rounds, {} CPUs, Linux {}\n",
        args.rounds,
        m["cpus"],
        m["kernel"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "Load average (1, 5, 15 min) before the workload rounds: {}; after them: {}.\n",
        first3(&m["loadavg_before_workloads"]),
        first3(&m["loadavg_after_workloads"])
    );
    let _ = writeln!(
        s,
        "Every figure is the median over the rounds, with (min - max). Ratios (`x`) are taken \
         per round against the clock floor (mmaplock-prof's programs that only read the clock) \
         on the same workload in the same round; slowdowns per round against the same round's \
         run without tracing.\n"
    );
    let _ = writeln!(s, "### Throughput\n");
    let _ = writeln!(
        s,
        "| workload | mode | ops/s | slowdown % |\n|---|---|---:|---:|"
    );
    for (w, mode, r) in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            w.name(),
            mode.name(),
            show(r.ops_per_s, 0),
            show(r.slowdown_pct, 1)
        );
    }
    let _ = writeln!(
        s,
        "\n### BPF time per event and per program run (ns, kernel statistics), and x clock floor\n"
    );
    let _ = writeln!(
        s,
        "| workload | mode | all programs, per mmap_lock event | start_locking | acquire_returned | released | exit programs | other programs | events/s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---:|");
    for (w, mode, r) in rows.iter().filter(|(_, m, _)| *m != Mode::None) {
        let prog = |tp: Tp| {
            r.programs
                .iter()
                .find(|(t, _)| *t == tp)
                .map_or("-".into(), |(_, f)| with_ratio(f.ns_per_run, f.vs_floor))
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            w.name(),
            mode.name(),
            with_ratio(r.ns_per_event, r.ns_per_event_vs_floor),
            prog(Tp::Start),
            prog(Tp::Acquire),
            prog(Tp::Released),
            prog(Tp::Exit),
            prog(Tp::Other),
            show(r.events_per_s, 0),
        );
    }
    let _ = writeln!(s, "\n### Tracer process\n");
    let _ = writeln!(
        s,
        "| workload | mode | attach ms | CPU % of one core | peak RSS MiB | µs per sampled stack (stacks/s) | lost |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for (w, mode, r) in rows.iter().filter(|(_, m, _)| *m != Mode::None) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            w.name(),
            mode.name(),
            show(r.attach_ms, 1),
            show(r.cpu_pct, 2),
            show(r.peak_rss_mib, 1),
            match r.us_per_stack {
                Some(_) => format!("{} ({})", show(r.us_per_stack, 1), show(r.stacks_per_s, 0)),
                None => "-".into(),
            },
            r.lost.map_or("-".into(), |l| l.to_string())
        );
    }
    if let Some((w, l)) = rows
        .iter()
        .find_map(|(w, m, r)| (*m == Mode::Prof).then_some((w, r.load.as_ref()?)))
    {
        let _ = writeln!(
            s,
            "\n### Attach: where the time goes (mmaplock-prof's own account, `overhead.load`, {})\n",
            w.name()
        );
        let _ = writeln!(s, "Total: {} ms.\n", show(l.total_ms, 1));
        let _ = writeln!(s, "| step | ms |\n|---|---:|");
        for (n, ms) in &l.steps {
            let _ = writeln!(s, "| {n} | {} |", show(*ms, 1));
        }
        let _ = writeln!(
            s,
            "\n| program | instructions verified | verification, ms (programs verified in parallel) |\n|---|---:|---:|"
        );
        for (n, i, ms) in &l.programs {
            let _ = writeln!(s, "| {n} | {} | {} |", show(*i, 0), show(*ms, 1));
        }
    }
    let _ = writeln!(
        s,
        "\n### Many threads: {} threads, mmaplock-prof -p PID --interval 1, {} s steady window\n",
        args.scale_threads, args.scale_secs
    );
    let _ = writeln!(
        s,
        "| round | threads tracked | warm-up s (settled) | warm-up CPU % | steady CPU % | steady RSS MiB, max (median) | peak RSS MiB | largest report: before / in window | kernel memory per thread | lost |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (i, r) in scale.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} ({}) | {:.1} | {:.2} | {:.1} ({:.1}) | {:.1} | {} / {} | {} | {} |",
            i + 1,
            r.threads_tracked,
            r.warmup.as_secs_f64(),
            if r.settled { "yes" } else { "no" },
            r.warmup_cpu_pct,
            r.cpu_pct,
            r.rss_max_mib,
            r.rss_median_mib,
            r.peak_rss_mib,
            r.largest_report_threads,
            r.window_report_threads,
            r.kernel_bytes_per_thread
                .map_or("-".into(), |b| format!("{:.0} B", b)),
            r.lost
        );
    }
    let _ = writeln!(s, "\n### Targets\n");
    let _ = writeln!(
        s,
        "| target | measured: median (min - max) | rounds within | verdict |\n|---|---|---:|---|"
    );
    for t in targets {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t.what,
            t.measured,
            t.rounds.map_or("-".into(), |(k, n)| format!("{k}/{n}")),
            match t.met {
                Some(true) => "met",
                Some(false) => "NOT met",
                // A figure for context (an option's cost), measured but with no target.
                None if t.rounds.is_none() && t.measured != "-" => "for context",
                None => "not measured",
            }
        );
    }
    s
}
