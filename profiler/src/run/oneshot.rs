//! The one-shot profile (`mmaplock-prof [OPTIONS]`, and `-- COMMAND`): attach, report every
//! interval, stop on duration, signal or the targets' exit, and always finish with a complete
//! summary; with a COMMAND, run it gated until it is selected, pass signals on to it, and end
//! with its exit status.

use std::{path::PathBuf, time::Duration};

use super::{
    Driver, LoopConfig, Profile, Session, SessionError, Sink, Targets,
    command::{self, Forwarder, Gated, Status},
    targets,
};
use crate::{
    kernel::collector::{Collector, CollectorConfig},
    output::{lines::Pending, report::Report},
    vocab::{
        Format,
        ids::{self, ProcId},
    },
};

/// What a run needs.
pub struct SessionConfig {
    pub collector: CollectorConfig,
    pub duration: Option<Duration>,
    /// None: summary only.
    pub interval: Option<Duration>,
    pub format: Format,
    pub output: Option<PathBuf>,
    /// Folded stacks go there at the end.
    pub stacks_file: Option<PathBuf>,
    /// The HTML report goes there at the end.
    pub html: Option<PathBuf>,
    /// The pprof profile of the sampled stacks goes there at the end.
    pub pprof: Option<PathBuf>,
    /// A study of this host, for the findings' measured effects.
    pub study: Option<PathBuf>,
    /// `--all-processes`: the summary lists every process, the text shows each.
    pub all_processes: bool,
    /// The start time the (one) `--pid` process must have (the agent's captures).
    pub pid_start_ticks: Option<u64>,
    /// `-- COMMAND [ARGS...]`: run it, profiled with its descendants (empty: none).
    pub command: Vec<std::ffi::OsString>,
    /// `--fail-above PCT`: the share of the threads' time waiting above which the run fails.
    pub fail_above: Option<f64>,
    pub verbose: bool,
    pub quiet: bool,
}

/// Before Linux 6.14 the kernel formats the memory cgroup's path (under a global lock) for
/// every mmap_lock event once a program is attached: full mode is dearer there. Said from
/// the tracepoints' prototype (`memcg_path` in their BTF), never from the version.
fn memcg_path_cost(c: &Collector) -> Option<&'static str> {
    (c.mode == crate::vocab::Mode::Full
        && c.kernel.tracepoints == crate::kernel::btf::TracepointLayout::WithMemcgPath)
        .then_some(
            "this kernel's mmap_lock tracepoints format the memory cgroup's path on every event while full mode is attached (they carry memcg_path: fixed in Linux 6.14), which costs every acquisition more; --mode contention is the cheap choice",
        )
}

fn names_get(names: &crate::registry::names::ProcessNames, p: ProcId) -> String {
    names.cached(p).unwrap_or("?").to_string()
}

fn describe_targets(c: &CollectorConfig, command: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(name) = command {
        let pid = c.pids.first().copied().unwrap_or(0);
        parts.push(format!("{name} (pid {pid}) and its descendants"));
    } else if !c.pids.is_empty() {
        let pids: Vec<String> = c.pids.iter().map(u32::to_string).collect();
        parts.push(format!("pid {}", pids.join(", ")));
    }
    if !c.comms.is_empty() {
        parts.push(format!("comm {}", c.comms.join(", ")));
    }
    if parts.is_empty() {
        "all processes".into()
    } else {
        parts.join(" and ")
    }
}

/// How a run ended, for its exit status.
#[derive(Debug, Default)]
pub struct Ended {
    /// The COMMAND's status, when one was run.
    pub command: Option<Status>,
    /// `--fail-above`: the threads' share of their time waiting was over it.
    pub over: bool,
}

impl Ended {
    /// Its exit status: the command's when it failed, else 3 when `--fail-above` was
    /// passed, else 0 (docs/cli.md, "Exit status").
    pub fn code(&self) -> u8 {
        match self.command {
            Some(s) if !s.success() => s.code(),
            _ if self.over => FAIL_ABOVE_STATUS,
            _ => 0,
        }
    }
}

/// The exit status of a run whose threads waited more than `--fail-above` said.
pub const FAIL_ABOVE_STATUS: u8 = 3;

/// The share `--fail-above` judges: every listed process's own threads' wait for its lock
/// (write and read) over their wall time alive, pooled (waits summed over times summed), as
/// each process's `time_share` counts them. None when no time was counted.
pub fn pooled_share(r: &Report) -> Option<(u64, u64)> {
    let (mut wait, mut alive) = (0u64, 0u64);
    for s in r.processes.iter().filter_map(|p| p.time_share.as_ref()) {
        wait = wait.saturating_add(s.wait_ns);
        alive = alive.saturating_add(s.alive_ns);
    }
    (alive > 0).then_some((wait, alive))
}

/// `--fail-above`'s verdict on a summary, said on standard error (when over, even with -q):
/// whether it was over.
fn judge(summary: &Report, pct: f64, quiet: bool) -> bool {
    let (wait, alive) = pooled_share(summary).unwrap_or((0, 0));
    let share = if alive == 0 {
        0.0
    } else {
        wait as f64 / alive as f64
    };
    let over = share * 100.0 > pct;
    if over || !quiet {
        eprintln!(
            "mmaplock-prof: the profiled threads waited {} of their time for their processes' mmap_lock ({} of {:.2} s alive): {} --fail-above {pct}%{}",
            crate::output::text::fmt_share(share),
            crate::output::text::fmt_ns(wait),
            alive as f64 / 1e9,
            if over { "over" } else { "within" },
            if over {
                format!(" (exit status {FAIL_ABOVE_STATUS})")
            } else {
                String::new()
            },
        );
    }
    over
}

pub async fn run(mut cfg: SessionConfig) -> Result<Ended, SessionError> {
    // A command is forked first, before anything is loaded, and waits at its gate; signals
    // are passed on to it from now on.
    let mut launched: Option<(Gated, Forwarder)> = None;
    if !cfg.command.is_empty() {
        let gated = command::Prepared::new(&cfg.command)?.fork()?;
        let forwarder = Forwarder::start(gated.pid).map_err(SessionError::Signals)?;
        cfg.collector.pids = vec![gated.pid];
        cfg.collector.children = true;
        launched = Some((gated, forwarder));
    }
    let profiled = profile(&cfg, launched.as_mut().map(|(g, _)| g)).await;
    let Some((mut gated, forwarder)) = launched else {
        return profiled.map(|over| Ended {
            command: None,
            over,
        });
    };
    // The profile may have ended before the command (--duration, a failure): the command
    // goes on, and the profiler with it, passing signals on, until it exits.
    gated.abort();
    gated.exited().await;
    forwarder.stop();
    let status = gated.wait();
    if cfg.verbose {
        eprintln!("mmaplock-prof: {} {status}", gated.name());
    }
    profiled.map(|over| Ended {
        command: Some(status),
        over,
    })
}

/// The profile itself; returns whether `--fail-above` was passed.
async fn profile(
    cfg: &SessionConfig,
    mut command: Option<&mut Gated>,
) -> Result<bool, SessionError> {
    // Validate everything the user gave before touching the kernel.
    let targets = Targets::open(&cfg.collector.pids)?;
    // Checked once the pidfds are open: from here they follow that process, not its pid.
    if let Some(ticks) = cfg.pid_start_ticks {
        for &pid in &cfg.collector.pids {
            if ProcId::of_live(pid).is_none_or(|p| p.start != ticks) {
                return Err(SessionError::PidReused(pid, ticks));
            }
        }
    }
    let study = cfg
        .study
        .as_deref()
        .map(crate::output::findings::StudyEffects::load)
        .transpose()?;
    // Say now, not at the end, if an output cannot be written; but change none of them
    // before the programs are attached (output/lines.rs).
    let mut sink = if command.is_some() && cfg.output.is_none() {
        Sink::stderr(cfg.format)
    } else {
        Sink::open(cfg.output.as_ref(), cfg.format)?
    };
    let mut later = Vec::new();
    for path in cfg.stacks_file.iter().chain(&cfg.html).chain(&cfg.pprof) {
        later.push(Pending::open(path).map_err(|e| SessionError::OpenOutput(path.clone(), e))?);
    }
    sink.html = cfg.html.clone().map(crate::output::html::HtmlRecorder::new);
    let mut collector = Collector::start(&cfg.collector)?;
    // The command's pid is selected (its forks followed) before it may exec.
    targets::select_at_start(&mut collector, &cfg.collector)?;
    sink.begin()?;
    later.into_iter().for_each(Pending::keep);
    if cfg.verbose {
        let l = collector.kernel.layout;
        eprintln!(
            "mmaplock-prof: tracepoint layout {}; task_struct offsets mm={} tgid={} group_leader={} comm={}; mm_struct.owner={}",
            collector.kernel.tracepoints,
            l.task_mm,
            l.task_tgid,
            l.task_group_leader,
            l.task_comm,
            if l.mm_owner == 0 {
                "absent (no CONFIG_MEMCG: foreign takers charged to pid 0)".to_string()
            } else {
                l.mm_owner.to_string()
            },
        );
    }
    if cfg.verbose {
        let r = &collector.load_report;
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|(name, ms)| format!("{name} {ms:.1} ms"))
            .collect();
        let insns: Vec<String> = r
            .programs
            .iter()
            .filter_map(|p| Some(format!("{} {}", p.name, p.verified_insns?)))
            .collect();
        eprintln!("mmaplock-prof: attach: {}", steps.join("; "));
        eprintln!("mmaplock-prof: instructions verified: {}", insns.join("; "));
    }
    if !cfg.quiet {
        crate::kernel::privilege::warn_if_lacking_ptrace();
        if let Some(w) = memcg_path_cost(&collector) {
            eprintln!("mmaplock-prof: {w}");
        }
    }
    // A command at its gate is a copy of the profiler: its stacks are prepared once it has
    // exec'd, as any selected process's.
    let stack_pids: &[u32] = if command.is_some() {
        &[]
    } else {
        &cfg.collector.pids
    };
    let mut session = Session::new(collector, cfg.interval, stack_pids)?;
    let live: Vec<ProcId> = (cfg.collector.pids.iter())
        .filter_map(|&pid| ProcId::of_live(pid))
        .collect();
    if command.is_none() {
        for &p in &live {
            session.profile.registry.names.prime(p);
        }
    }
    // The reports say why each process is in them.
    session
        .profile
        .name_selection(cfg.collector.comms.clone(), &live, command.is_some());
    if let Some(g) = command.as_deref_mut() {
        g.release()?;
    }
    // Said once the targets' unwind tables and V8 layouts are read: their stacks are named
    // from then on without delay.
    if !cfg.quiet {
        eprintln!(
            "mmaplock-prof: attached in {:.1} ms, profiling {}{}",
            session.profile.collector.attach_time.as_secs_f64() * 1e3,
            describe_targets(&cfg.collector, command.as_deref().map(Gated::name)),
            if command.is_some() {
                ""
            } else {
                "; Ctrl-C to stop"
            }
        );
    }

    /// The one-shot profile: an interval report after each reading, if asked.
    struct OneShot<'a> {
        sink: &'a mut Sink,
        intervals: bool,
        children: bool,
        all: bool,
        /// A COMMAND's run ends when the command does, whatever its descendants do.
        command: bool,
    }
    impl Driver for OneShot<'_> {
        fn after_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError> {
            if self.intervals {
                let mut r = profile.interval_report();
                r.show_all = self.all;
                self.sink.write_report(r)?;
            }
            Ok(())
        }
        fn may_end(&mut self, profile: &mut Profile) -> bool {
            // With --children, not while a followed descendant lives.
            self.command
                || !self.children
                || !profile
                    .collector
                    .selected()
                    .into_iter()
                    .any(|(pid, start)| ids::is_alive(ProcId::new(pid, start)))
        }
    }
    let mut driver = OneShot {
        sink: &mut sink,
        intervals: cfg.interval.is_some(),
        children: cfg.collector.children,
        all: cfg.all_processes,
        command: command.is_some(),
    };
    // Without interval reports, still read the maps every second so that exited threads'
    // entries are freed (and their names learnt) while the run goes on.
    let period = cfg.interval.unwrap_or(Duration::from_secs(1));
    let failure = session
        .run(
            LoopConfig {
                period,
                duration: cfg.duration,
                targets: Some(&targets),
                signals_end: command.is_none(),
            },
            &mut driver,
        )
        .await?
        .err();

    // The last (partial) interval and the summary. Tokio's signal handlers, once installed,
    // stay for the life of the process, so a second Ctrl-C cannot cut the summary short.
    let last = session.finish().await;
    let profile = &mut session.profile;
    // The last interval and the summary wait for the reader, however slow.
    sink.ending();
    if cfg.interval.is_some() && last.is_ok() {
        let mut r = profile.interval_report();
        r.show_all = cfg.all_processes;
        sink.write_report(r)?;
    }
    let mut summary = profile.summary();
    crate::output::findings::attach(&mut summary, study.as_ref());
    let over = cfg
        .fail_above
        .is_some_and(|pct| judge(&summary, pct, cfg.quiet));
    // Folded stacks name processes as the summary does: an exited process's name has left
    // the registry by now.
    let comms: std::collections::HashMap<ProcId, String> = match cfg.stacks_file {
        Some(_) => summary
            .processes
            .iter()
            .map(|p| (ProcId::new(p.pid, p.start_ticks), p.comm.clone()))
            .collect(),
        None => Default::default(),
    };
    let pprof = cfg.pprof.as_ref().map_or(Ok(()), |path| {
        let mut bytes = Vec::new();
        crate::output::Output::emit(&mut crate::output::pprof::Pprof, &summary, &mut bytes)
            .and_then(|()| std::fs::write(path, bytes))
            .map_err(|e| SessionError::OpenOutput(path.clone(), e))
    });
    // The processes that did not wait materially, past the few that waited longest, are
    // grouped by command (once the pprof profile and the folded stacks' names have them all).
    if cfg.all_processes {
        summary.show_all = true;
    } else {
        crate::output::findings::group_minor(&mut summary);
    }
    // Everything is attempted, whatever failed before; the first failure is the exit's.
    let summary = sink.write_report(summary);
    let html = sink.finish_html();
    let stacks = match (&cfg.stacks_file, &profile.stacks) {
        (Some(path), Some(stacks)) => {
            let names = &mut profile.registry.names;
            let folded = stacks.folded(|pid| {
                comms
                    .get(&pid)
                    .cloned()
                    .unwrap_or_else(|| names_get(names, pid))
            });
            std::fs::write(path, folded).map_err(|e| SessionError::OpenOutput(path.clone(), e))
        }
        _ => Ok(()),
    };
    if let Some(e) = failure {
        return Err(e);
    }
    last.and(summary)
        .and(html)
        .and(stacks)
        .and(pprof)
        .map(|()| over)
}
