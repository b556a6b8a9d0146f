//! `--escalate-dir`: when a selected process's lock wait crosses a threshold (`trigger`), the
//! agent takes a bounded full profile of it (`capture`): the one-shot profiler on that
//! process for `--escalate-for` seconds, its NDJSON, HTML page and pprof file in a directory
//! of their own, beside `before.pb.gz`, the agent's own sampled stacks of that process over
//! the window that crossed the threshold (the moment that crossed it is in the capture,
//! not only what followed). One capture at a time on the host, a cooldown per process, a
//! byte budget for the directory, oldest capture out first.
//!
//! Every capture carries its verdict (`trigger` in its summary): the share that crossed, over
//! the time it was measured on, the window's functions and findings (`window.rs`,
//! `samples.rs`), and the same share during the capture.

mod capture;
mod dirs;
mod samples;
mod trigger;
mod window;

use std::{
    io,
    os::unix::fs::DirBuilderExt,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

pub use capture::Outcome;
use capture::{Capture, Plan, Settings};
use samples::WindowSamples;
use trigger::Trigger;
pub use trigger::{Reading, Windowed};
use window::Windows;

use super::profiles::SharedProfiles;
use crate::{
    aggregation::{Attribution, Window},
    kernel::btf::TracepointLayout,
    output::{
        Output, findings,
        pprof::{Pprof, Samples},
        prometheus::Escalations,
        report::{self, CROSSING},
    },
    registry::roles::Role,
    vocab::{Mode, ids::ProcId},
};

/// With `--escalate-dir`, a process that waits has its wait sampled if it had no sample for
/// this long (besides one in `--stack-sample` per thread): every process that waited in a
/// window has stacks in its capture's `before.pb.gz` (which reaches back this much further),
/// at most one more a second per process. Per process, not per thread: what needs it is the
/// process's window, and per thread it was one more unwound stack a second per waiting thread.
pub const SAMPLE_FLOOR_MS: u32 = 1000;

/// `--escalate-*` (shared/design/agent-and-metrics.md).
#[derive(Clone, Debug)]
pub struct EscalateConfig {
    pub dir: PathBuf,
    /// Percent of the process's threads' time spent waiting for its lock.
    pub at_percent: f64,
    pub window: Duration,
    pub length: Duration,
    pub cooldown: Duration,
    pub budget_bytes: u64,
    /// The agent's `--stack-sample`: its own samples' rate, and the capture's.
    pub stack_sample: u32,
}

/// A process's labels and name, for the metrics and the capture's directory.
pub struct Named {
    pub process: String,
    pub cgroup: String,
    pub comm: String,
}

pub struct Escalator {
    cfg: EscalateConfig,
    trigger: Trigger,
    /// The processes' intervals over the window, for the crossing window's findings.
    windows: Windows,
    /// The agent's mode, which the windows are measured in.
    mode: Mode,
    settings: Settings,
    plan: Plan,
    running: Option<Capture>,
    health: Escalations,
    quiet: bool,
    /// The agent is stopping: no capture begins.
    closed: bool,
}

/// An interval of the agent, as the escalator sees it.
pub struct Interval<'a> {
    pub start: SystemTime,
    pub end: SystemTime,
    pub window: &'a Window,
    pub attribution: &'a Attribution,
}

/// Each selected process's reading of an interval: its own threads' wait for its lock (write
/// and read) and their time alive, as `time_share` counts them (the profiler's threads and
/// other processes' threads that took its lock are not its own).
pub fn readings(
    window: &Window,
    attribution: &Attribution,
    selected: impl Fn(ProcId) -> bool,
) -> Vec<(ProcId, Reading)> {
    (window.processes.iter())
        .filter(|(p, _)| selected(**p))
        .map(|(&p, threads)| {
            let mut r = Reading::default();
            for (&t, agg) in threads {
                if matches!(attribution.role(p, t, agg), Role::Profiler | Role::Foreign) {
                    continue;
                }
                let w = agg.write();
                r.wait_ns += w.wait.sum + agg.read.wait.sum;
                r.waits += w.count + agg.read.count;
                r.alive_ns += agg.time.alive_ns;
            }
            (p, r)
        })
        .collect()
}

impl Escalator {
    /// Makes the directory (0700: captures name code and files of the processes) and checks
    /// that it can be written, before the kernel is touched.
    pub fn new(cfg: EscalateConfig, quiet: bool) -> io::Result<Escalator> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cfg.dir)?;
        tempfile::tempfile_in(&cfg.dir)?;
        let settings = Settings {
            root: cfg.dir.clone(),
            length: cfg.length,
            budget: cfg.budget_bytes,
            exe: PathBuf::from("/proc/self/exe"),
            stack_sample: cfg.stack_sample,
        };
        Ok(Escalator {
            trigger: Trigger::new(cfg.at_percent, cfg.window, cfg.cooldown),
            windows: Windows::new(cfg.window),
            mode: Mode::Contention,
            plan: Plan::for_kernel(TracepointLayout::Current),
            settings,
            cfg,
            running: None,
            health: Escalations::default(),
            quiet,
            closed: false,
        })
    }

    /// Captures on a kernel whose tracepoints have `layout` (see [`Plan::for_kernel`]), for an
    /// agent measuring in `mode`.
    pub fn for_kernel(&mut self, layout: TracepointLayout, mode: Mode) {
        self.plan = Plan::for_kernel(layout);
        self.mode = mode;
    }

    /// The series so far.
    pub fn health(&self) -> &Escalations {
        &self.health
    }

    /// What captures are taken in, and why (said once at start).
    pub fn plan(&self) -> &'static str {
        self.plan.why
    }

    /// After each interval: ends the capture that finished, adds the interval's readings
    /// (selected processes only), and begins the next capture if a process crossed.
    pub fn interval(
        &mut self,
        i: Interval<'_>,
        selected: impl Fn(ProcId) -> bool,
        name: &mut dyn FnMut(ProcId) -> Named,
        ring: Option<&SharedProfiles>,
    ) {
        let mut health = std::mem::take(&mut self.health);
        self.step(i, selected, name, ring, &mut health);
        self.health = health;
    }

    fn step(
        &mut self,
        i: Interval<'_>,
        selected: impl Fn(ProcId) -> bool,
        name: &mut dyn FnMut(ProcId) -> Named,
        ring: Option<&SharedProfiles>,
        health: &mut Escalations,
    ) {
        let readings = readings(i.window, i.attribution, selected);
        let span = i.end.duration_since(i.start).unwrap_or_default();
        // The capture's own time, as the agent measures the crossing: its intervals while
        // its profiler runs.
        if let Some(c) = (self.running.as_mut())
            .filter(|c| c.profiling() && c.began.elapsed() <= self.cfg.length)
            && let Some((_, r)) = readings.iter().find(|(p, _)| *p == c.proc)
        {
            c.during.reading.add(r);
            c.during.span += span;
        }
        if let Some(c) = self.running.as_mut()
            && let Some(out) = c.poll(&self.settings)
        {
            let c = self.running.take().expect("running");
            self.ended(&c, out, health);
        }
        let now = Instant::now();
        let waited: Vec<ProcId> = (readings.iter())
            .filter(|(_, r)| r.waits > 0)
            .map(|(p, _)| *p)
            .collect();
        self.windows.observe(
            now,
            (i.start, i.end, self.mode),
            i.window,
            i.attribution,
            &waited,
        );
        self.trigger.observe(now, span, readings);
        let d = (self.trigger).decide(now, self.running.is_some() || self.closed);
        for (p, why) in d.held {
            let n = name(p);
            health.count(n.process, n.cgroup, why.reason());
        }
        health.waiting = d.waiting as u64;
        if let Some((p, w)) = d.start {
            let n = name(p);
            let before = |out: &mut Vec<u8>| before_profile(ring, &self.cfg, p, out);
            let labels = (n.process.clone(), n.cgroup.clone());
            let why = self.why((p, &n.comm), w, i.end, ring);
            match Capture::begin(
                &self.settings,
                p,
                &n.comm,
                labels,
                (w, why),
                &self.plan,
                before,
            ) {
                Ok(c) => self.running = Some(c),
                Err(out) => {
                    self.log(&n.process, p.pid, &w, (None, None), &out);
                    health.count(n.process, n.cgroup, out.reason());
                }
            }
        }
        health.in_progress = self.running.as_ref().map(|c| c.labels.clone());
    }

    /// Why process `p` is captured: its window `w`, crossed at `at`, with the functions of
    /// the agent's samples of it and the window's findings.
    fn why(
        &self,
        (p, comm): (ProcId, &str),
        w: Windowed,
        at: SystemTime,
        ring: Option<&SharedProfiles>,
    ) -> Box<report::Trigger> {
        let samples = match ring.and_then(|r| r.lock().ok()) {
            Some(ring) => WindowSamples::of(&ring.window_of(self.window_secs(), at, p)),
            None => WindowSamples::default(),
        };
        let mut findings = Vec::new();
        let (mut from, mut to) = (report::rfc3339(at - w.span), report::rfc3339(at));
        if let Some(mut r) = self.windows.report(p, self.mode) {
            (from, to) = (r.start.clone(), r.end.clone());
            if let Some(proc) = r.processes.first_mut() {
                samples.fill(proc);
            }
            r.stack_sample = Some(self.cfg.stack_sample);
            findings = findings::find(&r, None);
            for f in &mut findings {
                f.window = Some(CROSSING.to_string());
            }
        }
        Box::new(report::Trigger {
            pid: p.pid,
            comm: comm.to_string(),
            share: w.reading.share(),
            threshold: self.cfg.at_percent / 100.0,
            window_s: w.span.as_secs_f64(),
            waits: w.reading.waits,
            at: report::rfc3339(at),
            wait_ns: w.reading.wait_ns,
            alive_ns: w.reading.alive_ns,
            from,
            to,
            mode: self.mode,
            waiting: samples.functions(false),
            holding: samples.functions(true),
            sampled: samples.sampled,
            findings,
            capture: None,
            passed: None,
            verdict: None,
        })
    }

    /// The ring's window: the crossing window's seconds, whole.
    fn window_secs(&self) -> u64 {
        self.cfg.window.as_secs_f64().ceil().max(1.0) as u64
    }

    /// The agent is stopping: the capture running ends, its report complete, and no other
    /// begins.
    pub fn close(&mut self) {
        self.closed = true;
        self.stop();
    }

    /// Stops a capture running: it ends with its report complete.
    fn stop(&mut self) {
        if let Some(mut c) = self.running.take() {
            let out = c.stop(&self.settings);
            let mut health = std::mem::take(&mut self.health);
            self.ended(&c, out, &mut health);
            self.health = health;
        }
        self.health.in_progress = None;
    }

    fn ended(&self, c: &Capture, out: Outcome, health: &mut Escalations) {
        let verdict = c.trigger.verdict.as_deref();
        self.log(
            &c.labels.0,
            c.proc.pid,
            &c.crossed,
            (Some(&c.dir), verdict),
            &out,
        );
        health.count(c.labels.0.clone(), c.labels.1.clone(), out.reason());
    }

    /// One line per capture, naming its directory.
    fn log(
        &self,
        process: &str,
        pid: u32,
        w: &Windowed,
        (dir, verdict): (Option<&std::path::Path>, Option<&str>),
        out: &Outcome,
    ) {
        if self.quiet {
            return;
        }
        let r = &w.reading;
        let crossed = format!(
            "{process} {pid} waited {:.1}% of its threads' time over {:.1} s ({} waits, {:.1} ms of {:.1} s of its threads' time; threshold {}%)",
            r.share() * 100.0,
            w.span.as_secs_f64(),
            r.waits,
            r.wait_ns as f64 / 1e6,
            r.alive_ns as f64 / 1e9,
            self.cfg.at_percent
        );
        let what = match (out, dir) {
            (Outcome::Captured, Some(d)) => {
                let v = verdict.map_or(String::new(), |v| format!(": {v}"));
                format!("captured in {} ({}){v}", d.display(), self.plan.why)
            }
            (Outcome::Exited, _) => "not captured: the process exited first".into(),
            (Outcome::NoSpace(e), _) => {
                format!("capture lost: no space in {} ({e})", self.cfg.dir.display())
            }
            (Outcome::OverBudget(n), _) => {
                format!("capture removed: {n} bytes, over --escalate-budget-mib alone")
            }
            (Outcome::Failed(e), _) => format!("capture failed: {e}"),
            (Outcome::Captured, None) => "captured".into(),
        };
        eprintln!("mmaplock-prof agent: escalation: {crossed}: {what}");
    }
}

impl Drop for Escalator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `before.pb.gz`: the agent's sampled stacks of `p` over the window (an empty profile when
/// the agent samples none, or kept none of it).
fn before_profile(
    ring: Option<&SharedProfiles>,
    cfg: &EscalateConfig,
    p: ProcId,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let Some(ring) = ring else {
        return Ok(());
    };
    let ring = ring
        .lock()
        .map_err(|_| io::Error::other("profiles unavailable"))?;
    // The window and the floor before it: a wait at the window's start was sampled, or its
    // process was within the floor's time before.
    let floor_s = u64::from(SAMPLE_FLOOR_MS).div_ceil(1000);
    let w = ring.window_of(
        cfg.window.as_secs_f64().ceil().max(1.0) as u64 + floor_s,
        SystemTime::now(),
        p,
    );
    Output::<dyn Samples>::emit(&mut Pprof, &w, out)
}
