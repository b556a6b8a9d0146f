//! A profiling run: attach, report every interval, stop on duration, signal or the targets'
//! exit, and always finish with a complete summary.
//!
//! Data flows one way: collector (kernel maps) -> aggregation (deltas, windows) ->
//! attribution and report (model) -> output (JSON lines or text).

use std::{io, path::PathBuf, time::Duration};

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    kernel::collector::{Collector, CollectorConfig, CollectorError},
    vocab::{
        Format,
        ids::{self, ProcId},
    },
};

mod copier;
mod heap;
pub mod lost;
mod profile;
mod rings;
mod session;
mod sink;
mod targets;
mod writer;

use crate::output::lines::Pending;
pub use profile::Profile;
pub use rings::Rings;
pub use session::Session;
pub use sink::Sink;
pub use targets::Targets;

/// What a run does at its few decision points; the loop itself is [`run_loop`], shared by the
/// one-shot profile, the demo and the agent.
pub trait Driver {
    /// Each tick, before the kernel's maps are read (the agent refreshes its selection).
    fn before_poll(&mut self, _profile: &mut Profile) -> Result<(), SessionError> {
        Ok(())
    }
    /// Each tick, after the kernel's maps were read.
    fn after_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError>;
    /// SIGHUP: whether the run ends (the agent reloads its selection instead).
    fn hangup(&mut self, _profile: &mut Profile) -> Result<bool, SessionError> {
        Ok(true)
    }
    /// The targets have exited: whether the run may end now (asked again at each tick until
    /// it says yes; `--children` waits for the descendants).
    fn may_end(&mut self, _profile: &mut Profile) -> bool {
        true
    }
}

/// When the loop reads the kernel and when it ends.
pub struct LoopConfig<'a> {
    pub period: Duration,
    pub duration: Option<Duration>,
    /// The run also ends when these have all exited.
    pub targets: Option<&'a Targets>,
}

/// Reads the kernel every period and drains the rings as records arrive, until the duration,
/// the targets' exit, SIGINT or SIGTERM (or SIGHUP, if the driver says so). A failure while
/// running ends the loop and is returned inside `Ok(Err(..))`, so that the caller still writes
/// what was gathered; `Err` is for failing to set the loop up.
pub async fn run_loop(
    profile: &mut Profile,
    rings: &mut Rings,
    cfg: LoopConfig<'_>,
    advice: lost::Advice,
    driver: &mut dyn Driver,
) -> Result<Result<(), SessionError>, SessionError> {
    let mut sigint = signal(SignalKind::interrupt()).map_err(SessionError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(SessionError::Signals)?;
    let mut sighup = signal(SignalKind::hangup()).map_err(SessionError::Signals)?;
    // What arrived while the programs were loading, before these handlers existed.
    for sig in crate::signals::take_early() {
        if sig != libc::SIGHUP {
            return Ok(Ok(()));
        }
        match driver.hangup(profile) {
            Ok(true) => return Ok(Ok(())),
            Ok(false) => {}
            Err(e) => return Ok(Err(e)),
        }
    }
    let deadline = async {
        match cfg.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let period = cfg.period;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exited = async {
        match cfg.targets {
            Some(t) => t.all_exited().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    let mut targets_gone = false;
    let mut trim = heap::Trim::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                // Sampled stacks first: a process forgotten by the poll must have had them.
                rings.drain(profile);
                let step = driver
                    .before_poll(profile)
                    .and_then(|()| profile.poll(false))
                    .and_then(|()| driver.after_poll(profile));
                if let Err(e) = step {
                    return Ok(Err(e));
                }
                lost::check(&profile.lost_so_far(), advice);
                trim.now_and_then();
                if targets_gone && driver.may_end(profile) {
                    return Ok(Ok(()));
                }
            }
            ready = rings.ready() => {
                if let Err(e) = ready {
                    return Ok(Err(SessionError::Events(e)));
                }
                rings.drain(profile);
            }
            _ = &mut deadline => return Ok(Ok(())),
            _ = &mut exited, if !targets_gone => {
                targets_gone = true;
                if driver.may_end(profile) {
                    return Ok(Ok(()));
                }
            }
            _ = sigint.recv() => return Ok(Ok(())),
            _ = sigterm.recv() => return Ok(Ok(())),
            _ = sighup.recv() => match driver.hangup(profile) {
                Ok(true) => return Ok(Ok(())),
                Ok(false) => {}
                Err(e) => return Ok(Err(e)),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    #[error("pid {0} is not the process it was (started at {1} ticks): not profiled")]
    PidReused(u32, u64),
    #[error("cannot watch pid {0}: {1}")]
    Watch(u32, io::Error),
    #[error("cannot write {0}: {1}")]
    OpenOutput(PathBuf, io::Error),
    #[error("cannot write the report: {0}")]
    Write(io::Error),
    #[error("cannot read events from the kernel: {0}")]
    Events(io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    #[error(transparent)]
    Collector(#[from] CollectorError),
    #[error(transparent)]
    Study(#[from] crate::output::findings::StudyFileError),
}

impl SessionError {
    /// 2 for bad usage, 1 for an environment the tool cannot run in.
    pub fn exit_code(&self) -> u8 {
        match self {
            SessionError::NoSuchPid(_)
            | SessionError::PidReused(..)
            | SessionError::OpenOutput(..)
            | SessionError::Study(_) => 2,
            SessionError::Collector(
                CollectorError::TooManyPids
                | CollectorError::TooManyComms
                | CollectorError::CommTooLong(_),
            ) => 2,
            _ => 1,
        }
    }
}

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

fn describe_targets(c: &CollectorConfig) -> String {
    let mut parts = Vec::new();
    if !c.pids.is_empty() {
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

pub async fn run(cfg: SessionConfig) -> Result<(), SessionError> {
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
    let mut sink = Sink::open(cfg.output.as_ref(), cfg.format)?;
    let mut later = Vec::new();
    for path in cfg.stacks_file.iter().chain(&cfg.html).chain(&cfg.pprof) {
        later.push(Pending::open(path).map_err(|e| SessionError::OpenOutput(path.clone(), e))?);
    }
    sink.html = cfg.html.clone().map(crate::output::html::HtmlRecorder::new);
    let collector = Collector::start(&cfg.collector)?;
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
    let mut collector = collector;
    targets::select_at_start(&mut collector, &cfg.collector)?;
    if !cfg.quiet {
        crate::kernel::privilege::warn_if_lacking_ptrace();
        if let Some(w) = memcg_path_cost(&collector) {
            eprintln!("mmaplock-prof: {w}");
        }
    }
    let mut session = Session::new(collector, cfg.interval, &cfg.collector.pids)?;
    let live: Vec<ProcId> = (cfg.collector.pids.iter())
        .filter_map(|&pid| ProcId::of_live(pid))
        .collect();
    for &p in &live {
        session.profile.registry.names.prime(p);
    }
    // The reports say why each process is in them.
    session
        .profile
        .name_selection(cfg.collector.comms.clone(), &live);
    // Said once the targets' unwind tables and V8 layouts are read: their stacks are named
    // from then on without delay.
    if !cfg.quiet {
        eprintln!(
            "mmaplock-prof: attached in {:.1} ms, profiling {}; Ctrl-C to stop",
            session.profile.collector.attach_time.as_secs_f64() * 1e3,
            describe_targets(&cfg.collector)
        );
    }

    /// The one-shot profile: an interval report after each reading, if asked.
    struct OneShot<'a> {
        sink: &'a mut Sink,
        intervals: bool,
        children: bool,
        all: bool,
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
            !self.children
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
    last.and(summary).and(html).and(stacks).and(pprof)
}
