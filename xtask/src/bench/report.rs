//! From the runs to the figures (medians over rounds, with their range), the ratios to the
//! floor measured in the same round, the targets, and their JSON and markdown forms.

use serde_json::{Value, json};

use super::{
    BenchArgs,
    cost::{Tp, TracerCost},
    json::{machine, row_json, sample_json},
    load::{LoadFigures, load_figures},
    scale::ScaleRound,
    stats::{Spread, json_of, show},
    tracer::Mode,
    workload::{Sample, Workload},
};

/// mmaplock-prof's default `--stack-sample` (profiler/src/cli/mod.rs `Config::STACK_SAMPLE`).
const DEFAULT_STACK_SAMPLE: u32 = 64;

/// The programs whose cost is compared with the floor's, program by program.
const PER_PROGRAM: [Tp; 5] = [Tp::Start, Tp::Acquire, Tp::Released, Tp::Exit, Tp::Other];

/// One tracepoint's program: ns per run, and per round its ratio to the floor's.
#[derive(Clone, Debug, Default)]
pub(super) struct ProgramFigures {
    pub(super) ns_per_run: Option<Spread>,
    pub(super) vs_floor: Option<Spread>,
}

/// The figures of one mode on one workload, over the rounds.
#[derive(Clone, Debug, Default)]
pub(super) struct Row {
    pub(super) ops_per_s: Option<Spread>,
    /// Per round, against the same round's run without tracing.
    pub(super) slowdown_pct: Option<Spread>,
    pub(super) ns_per_event: Option<Spread>,
    pub(super) ns_per_event_vs_floor: Option<Spread>,
    pub(super) programs: Vec<(Tp, ProgramFigures)>,
    pub(super) events_per_s: Option<Spread>,
    pub(super) attach_ms: Option<Spread>,
    pub(super) cpu_pct: Option<Spread>,
    pub(super) peak_rss_mib: Option<Spread>,
    pub(super) lost: Option<u64>,
    /// mmaplock-prof's userspace work per sampled stack (unwinding, naming, V8 heap reads),
    /// microseconds, and sampled stacks per second.
    pub(super) us_per_stack: Option<Spread>,
    pub(super) stacks_per_s: Option<Spread>,
    /// mmaplock-prof's own account of its attach: total, each step, and each program's
    /// verification (instructions the verifier processed, ms), over the rounds.
    pub(super) load: Option<LoadFigures>,
}

/// Per round, a cost of mode `m` over the same cost of the clock floor in the same round
/// (the reference of every target: any program that times acquisitions reads the clock).
fn floor_ratios(
    samples: &[Sample],
    w: Workload,
    m: Mode,
    f: &dyn Fn(&TracerCost) -> f64,
) -> Vec<f64> {
    ratios(samples, w, m, Mode::FloorClock, f)
}

/// Per round, a cost of mode `m` over the same cost of mode `base` in the same round.
fn ratios(
    samples: &[Sample],
    w: Workload,
    m: Mode,
    base: Mode,
    f: &dyn Fn(&TracerCost) -> f64,
) -> Vec<f64> {
    samples
        .iter()
        .filter(|s| s.workload == w && s.mode == m)
        .filter_map(|s| {
            let b = samples
                .iter()
                .find(|b| b.workload == w && b.mode == base && b.round == s.round)?;
            Some(f(s.cost.as_ref()?) / f(b.cost.as_ref()?))
        })
        .filter(|r| r.is_finite())
        .collect()
}

/// What an option costs beside the full profile: a ratio per round, for context (no target).
fn option_cost(what: String, per_round: &[f64]) -> Target {
    let s = Spread::of(per_round.iter().copied());
    Target {
        what,
        measured: s.map_or("-".into(), |s| s.show_x()),
        met: None,
        rounds: None,
    }
}

fn row(samples: &[Sample], w: Workload, m: Mode) -> Row {
    let of = |mode: Mode, round: usize| {
        samples
            .iter()
            .find(|s| s.workload == w && s.mode == mode && s.round == round)
    };
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.workload == w && s.mode == m)
        .collect();
    // A figure per round, as a spread; `f` gets this mode's sample and the same round's floor.
    let spread = |f: &dyn Fn(&Sample, Option<&Sample>) -> Option<f64>| {
        Spread::of(mine.iter().filter_map(|s| f(s, of(Mode::Floor, s.round))))
    };
    let cost_ratio = |f: &dyn Fn(&TracerCost) -> f64| Spread::of(floor_ratios(samples, w, m, f));
    let mut r = Row {
        ops_per_s: spread(&|s, _| Some(s.ops_per_s)),
        slowdown_pct: spread(&|s, _| {
            let base = of(Mode::None, s.round)?.ops_per_s;
            Some((1.0 - s.ops_per_s / base) * 100.0)
        }),
        ..Row::default()
    };
    if m == Mode::None {
        return r;
    }
    r.ns_per_event = spread(&|s, _| Some(s.cost.as_ref()?.ns_per_event()));
    r.ns_per_event_vs_floor = cost_ratio(&|c| c.ns_per_event());
    for tp in PER_PROGRAM {
        let figures = ProgramFigures {
            ns_per_run: spread(&|s, _| Some(s.cost.as_ref()?.ns_per_run(tp))),
            vs_floor: cost_ratio(&|c| c.ns_per_run(tp)),
        };
        if figures.ns_per_run.is_some() {
            r.programs.push((tp, figures));
        }
    }
    r.events_per_s = spread(&|s, _| {
        let c = s.cost.as_ref()?;
        Some(c.lock_events() as f64 / c.wall.as_secs_f64())
    });
    r.attach_ms = spread(&|s, _| Some(s.cost.as_ref()?.attach.as_secs_f64() * 1e3));
    r.cpu_pct = spread(&|s, _| {
        let c = s.cost.as_ref()?;
        Some(c.cpu.as_secs_f64() / c.wall.as_secs_f64() * 100.0)
    });
    r.peak_rss_mib = spread(&|s, _| Some(s.cost.as_ref()?.peak_rss_kib as f64 / 1024.0));
    r.lost = mine.iter().filter_map(|s| s.cost.as_ref()?.lost).max();
    r.us_per_stack = spread(&|s, _| s.cost.as_ref()?.stack_work.as_ref()?["us_per_stack"].as_f64());
    r.stacks_per_s = spread(&|s, _| {
        let c = s.cost.as_ref()?;
        Some(c.stack_work.as_ref()?["stacks"].as_f64()? / c.wall.as_secs_f64())
    });
    let loads: Vec<&Value> = mine
        .iter()
        .filter_map(|s| s.cost.as_ref()?.load.as_ref())
        .collect();
    r.load = load_figures(&loads);
    r
}

/// A performance target and how this run did.
pub(super) struct Target {
    pub(super) what: String,
    pub(super) measured: String,
    /// On the medians; None when it could not be measured.
    pub(super) met: Option<bool>,
    /// Rounds that, each on its own, met it: (met, rounds).
    pub(super) rounds: Option<(usize, usize)>,
}

/// A cost ratio to the floor at most `limit`, judged on the median of the rounds' ratios.
fn ratio_target(what: String, per_round: &[f64], limit: f64) -> Target {
    let s = Spread::of(per_round.iter().copied());
    Target {
        what,
        measured: s.map_or("-".into(), |s| s.show_x()),
        met: s.map(|s| s.median <= limit),
        rounds: Some((
            per_round.iter().filter(|&&r| r <= limit).count(),
            per_round.len(),
        )),
    }
}

pub struct Results {
    pub json: Value,
    pub markdown: String,
}

pub fn summarize(
    args: &BenchArgs,
    samples: &[Sample],
    scale: &[ScaleRound],
    // `/proc/loadavg` before and after the workload rounds.
    load: [&str; 2],
) -> Results {
    let rows: Vec<(Workload, Mode, Row)> = Workload::ALL
        .iter()
        .flat_map(|&w| Mode::ALL.iter().map(move |&m| (w, m)))
        .map(|(w, m)| (w, m, row(samples, w, m)))
        .collect();
    let find = |w: Workload, m: Mode| {
        rows.iter()
            .find(|(rw, rm, _)| *rw == w && *rm == m)
            .map(|(_, _, r)| r)
            .expect("every workload and mode has a row")
    };

    // The targets (issue 14), on the medians, each ratio taken per round against the same
    // round's clock floor (programs that only read the clock: the least any program timing
    // acquisitions pays under the lock) or against the mode an option adds to.
    let mut targets = Vec::new();
    let vs_clock = |w: Workload, m: Mode, f: &dyn Fn(&TracerCost) -> f64| {
        ratios(samples, w, m, Mode::FloorClock, f)
    };
    for w in Workload::ALL {
        let prof = find(w, Mode::Prof);
        for (tp, limit) in [(Tp::Acquire, 1.25), (Tp::Released, 1.25), (Tp::Start, 1.5)] {
            targets.push(ratio_target(
                format!(
                    "{}: {} ns per run at most {limit}x the clock floor's",
                    w.name(),
                    tp.name()
                ),
                &vs_clock(w, Mode::Prof, &|c| c.ns_per_run(tp)),
                limit,
            ));
        }
        targets.push(ratio_target(
            format!(
                "{}: full profile, BPF ns per event at most 1.6x the clock floor's",
                w.name()
            ),
            &vs_clock(w, Mode::Prof, &|c| c.ns_per_event()),
            1.6,
        ));
        targets.push(ratio_target(
            format!(
                "{}: --writes-only, BPF ns per event at most 1.25x the clock floor's",
                w.name()
            ),
            &vs_clock(w, Mode::ProfWritesOnly, &|c| c.ns_per_event()),
            1.25,
        ));
        targets.push(slowdown_target(samples, w, prof, find(w, Mode::Bpftrace)));
        targets.push(ratio_target(
            format!(
                "{}: --blockers, BPF ns per event at most 1.15x the full profile's",
                w.name()
            ),
            &ratios(samples, w, Mode::ProfBlockers, Mode::Prof, &|c| {
                c.ns_per_event()
            }),
            1.15,
        ));
        targets.push(ratio_target(
            format!(
                "{}: default code attribution (1 write in {} sampled), BPF ns per event at most 1.05x --stack-sample 0's",
                w.name(),
                DEFAULT_STACK_SAMPLE
            ),
            &ratios(samples, w, Mode::Prof, Mode::ProfNoStacks, &|c| {
                c.ns_per_event()
            }),
            1.05,
        ));
        targets.push(option_cost(
            format!(
                "{}: default code attribution, workload throughput, ratio to --stack-sample 0",
                w.name()
            ),
            &samples
                .iter()
                .filter(|s| s.workload == w && s.mode == Mode::Prof)
                .filter_map(|s| {
                    let b = samples.iter().find(|b| {
                        b.workload == w && b.mode == Mode::ProfNoStacks && b.round == s.round
                    })?;
                    Some(s.ops_per_s / b.ops_per_s)
                })
                .collect::<Vec<f64>>(),
        ));
        // What per-thread timing costs at the least: a clock read stored in task storage,
        // beside the per-program targets above.
        for tp in [Tp::Acquire, Tp::Released, Tp::Start] {
            targets.push(option_cost(
                format!(
                    "{}: storage floor, {} ns per run, ratio to the clock floor's",
                    w.name(),
                    tp.name()
                ),
                &vs_clock(w, Mode::FloorStorage, &|c| c.ns_per_run(tp)),
            ));
        }
        targets.push(option_cost(
            format!(
                "{}: --blockers, released ns per run (under the lock), ratio to the full profile's",
                w.name()
            ),
            &ratios(samples, w, Mode::ProfBlockers, Mode::Prof, &|c| {
                c.ns_per_run(Tp::Released)
            }),
        ));
    }
    let attach = Workload::ALL
        .iter()
        .filter_map(|&w| find(w, Mode::Prof).attach_ms)
        .max_by(|a, b| a.median.total_cmp(&b.median));
    targets.push(Target {
        what: "attach (start until each mmap_lock program has run) at most 100 ms".into(),
        measured: show(attach, 1) + " ms",
        met: attach.map(|a| a.median <= 100.0),
        rounds: None,
    });
    let n = scale.first().map_or(0, |r| r.threads_tracked);
    let cpu = Spread::of(scale.iter().map(|r| r.cpu_pct));
    let rss = Spread::of(scale.iter().map(|r| r.rss_max_mib));
    let count = |ok: &dyn Fn(&ScaleRound) -> bool| {
        Some((scale.iter().filter(|r| ok(r)).count(), scale.len()))
    };
    targets.push(Target {
        what: format!("{n} threads at --interval 1: userspace at most 1% of one CPU, steady state"),
        measured: show(cpu, 2) + "%",
        met: cpu.map(|c| c.median <= 1.0),
        rounds: count(&|r| r.cpu_pct <= 1.0),
    });
    const MB_PER_MIB: f64 = 1.048576;
    targets.push(Target {
        what: format!("{n} threads: RSS at most 30 MB, steady state (largest sample)"),
        measured: format!(
            "{} MiB = {:.1} MB",
            show(rss, 1),
            rss.map_or(f64::NAN, |r| r.median * MB_PER_MIB)
        ),
        met: rss.map(|r| r.median * MB_PER_MIB <= 30.0),
        rounds: count(&|r| r.rss_max_mib * MB_PER_MIB <= 30.0),
    });

    let json = json!({
        "rounds": args.rounds,
        "threads": args.threads,
        "node_iterations": args.node_iterations,
        "churn_iterations": args.churn_iterations,
        "machine": machine(load),
        "rows": rows.iter().map(|(w, m, r)| row_json(*w, *m, r)).collect::<Vec<_>>(),
        "many_threads": {
            "threads": args.scale_threads,
            "window_s": args.scale_secs,
            "userspace_cpu_pct": json_of(cpu, 3),
            "rss_max_mib": json_of(rss, 1),
            "peak_rss_mib": json_of(Spread::of(scale.iter().map(|r| r.peak_rss_mib)), 1),
            "rounds": scale.iter().map(ScaleRound::json).collect::<Vec<_>>(),
        },
        "targets": targets.iter().map(|t| json!({
            "target": t.what,
            "measured": t.measured,
            "met": t.met,
            "rounds_met": t.rounds.map(|(k, n)| format!("{k}/{n}")),
        })).collect::<Vec<_>>(),
        "samples": samples.iter().map(sample_json).collect::<Vec<_>>(),
    });
    let markdown = super::markdown::render(args, &json, &rows, scale, &targets);
    Results { json, markdown }
}

/// Full profile's slowdown against bpftrace's: on the medians, and round by round.
fn slowdown_target(samples: &[Sample], w: Workload, prof: &Row, bpftrace: &Row) -> Target {
    let (p, b) = (prof.slowdown_pct, bpftrace.slowdown_pct);
    let ratio = match (p, b) {
        (Some(p), Some(b)) if b.median > 0.0 => Some(p.median.max(0.0) / b.median),
        _ => None,
    };
    let rounds: Vec<bool> = samples
        .iter()
        .filter(|s| s.workload == w && s.mode == Mode::None)
        .filter_map(|base| {
            let ops = |m: Mode| {
                samples
                    .iter()
                    .find(|s| s.workload == w && s.mode == m && s.round == base.round)
                    .map(|s| 1.0 - s.ops_per_s / base.ops_per_s)
            };
            Some(ops(Mode::Prof)?.max(0.0) <= 0.5 * ops(Mode::Bpftrace)?)
        })
        .collect();
    Target {
        what: format!(
            "{}: full profile's slowdown at most 1/2 of bpftrace's",
            w.name()
        ),
        measured: format!(
            "{}% vs {}% = {}",
            show(p, 1),
            show(b, 1),
            ratio.map_or("-".into(), |r| format!("{r:.2}x"))
        ),
        met: ratio.map(|r| r <= 0.5),
        rounds: Some((rounds.iter().filter(|&&ok| ok).count(), rounds.len())),
    }
}
