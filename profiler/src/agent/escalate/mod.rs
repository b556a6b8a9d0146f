//! `--escalate-dir`: when a selected process's lock wait crosses a threshold (`trigger`), the
//! agent takes a bounded full profile of it (`capture`): the one-shot profiler on that
//! process for `--escalate-for` seconds, its NDJSON, HTML page and pprof file in a directory
//! of their own, beside `before.pb.gz`, the agent's own sampled stacks of that process over
//! the window that crossed the threshold (the moment that crossed it is in the capture,
//! not only what followed). One capture at a time on the host, a cooldown per process, a
//! byte budget for the directory, oldest capture out first.

mod capture;
mod trigger;

use std::{
    io,
    os::unix::fs::DirBuilderExt,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

pub use capture::Outcome;
use capture::{Capture, Plan, Settings};
pub use trigger::Reading;
use trigger::Trigger;

use super::profiles::SharedProfiles;
use crate::{
    aggregation::{Attribution, Window},
    kernel::btf::TracepointLayout,
    output::{
        Output,
        pprof::{Pprof, Samples},
        prometheus::Escalations,
    },
    registry::roles::Role,
    vocab::ids::ProcId,
};

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
    settings: Settings,
    plan: Plan,
    running: Option<Capture>,
    health: Escalations,
    quiet: bool,
    /// The agent is stopping: no capture begins.
    closed: bool,
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
        };
        Ok(Escalator {
            trigger: Trigger::new(cfg.at_percent, cfg.window, cfg.cooldown),
            plan: Plan::for_kernel(TracepointLayout::Current),
            settings,
            cfg,
            running: None,
            health: Escalations::default(),
            quiet,
            closed: false,
        })
    }

    /// Captures on a kernel whose tracepoints have `layout` (see [`Plan::for_kernel`]).
    pub fn for_kernel(&mut self, layout: TracepointLayout) {
        self.plan = Plan::for_kernel(layout);
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
        readings: Vec<(ProcId, Reading)>,
        name: &mut dyn FnMut(ProcId) -> Named,
        ring: Option<&SharedProfiles>,
    ) {
        let mut health = std::mem::take(&mut self.health);
        self.step(readings, name, ring, &mut health);
        self.health = health;
    }

    fn step(
        &mut self,
        readings: Vec<(ProcId, Reading)>,
        name: &mut dyn FnMut(ProcId) -> Named,
        ring: Option<&SharedProfiles>,
        health: &mut Escalations,
    ) {
        if let Some(c) = self.running.as_mut()
            && let Some(out) = c.poll(self.cfg.budget_bytes)
        {
            let c = self.running.take().expect("running");
            self.ended(&c, out, health);
        }
        let now = Instant::now();
        self.trigger.observe(now, readings);
        let d = (self.trigger).decide(now, self.running.is_some() || self.closed);
        for (p, why) in d.held {
            let n = name(p);
            health.count(n.process, n.cgroup, why.reason());
        }
        health.waiting = d.waiting as u64;
        if let Some((p, r)) = d.start {
            let n = name(p);
            let before = |out: &mut Vec<u8>| before_profile(ring, &self.cfg, p, out);
            let labels = (n.process.clone(), n.cgroup.clone());
            match Capture::begin(&self.settings, p, &n.comm, labels, r, &self.plan, before) {
                Ok(c) => self.running = Some(c),
                Err(out) => {
                    self.log(&n.process, p.pid, &r, None, &out);
                    health.count(n.process, n.cgroup, out.reason());
                }
            }
        }
        health.in_progress = self.running.as_ref().map(|c| c.labels.clone());
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
            let out = c.stop(self.cfg.budget_bytes);
            let mut health = std::mem::take(&mut self.health);
            self.ended(&c, out, &mut health);
            self.health = health;
        }
        self.health.in_progress = None;
    }

    fn ended(&self, c: &Capture, out: Outcome, health: &mut Escalations) {
        self.log(&c.labels.0, c.proc.pid, &c.crossed, Some(&c.dir), &out);
        health.count(c.labels.0.clone(), c.labels.1.clone(), out.reason());
    }

    /// One line per capture, naming its directory.
    fn log(
        &self,
        process: &str,
        pid: u32,
        r: &Reading,
        dir: Option<&std::path::Path>,
        out: &Outcome,
    ) {
        if self.quiet {
            return;
        }
        let crossed = format!(
            "{process} {pid} waited {:.1}% of its threads' time over {} s ({} waits, {:.1} ms of {:.1} s; threshold {}%)",
            r.share() * 100.0,
            self.cfg.window.as_secs(),
            r.waits,
            r.wait_ns as f64 / 1e6,
            r.alive_ns as f64 / 1e9,
            self.cfg.at_percent
        );
        let what = match (out, dir) {
            (Outcome::Captured, Some(d)) => {
                format!("captured in {} ({})", d.display(), self.plan.why)
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
    let w = ring.window_of(cfg.window.as_secs().max(1), SystemTime::now(), p);
    Output::<dyn Samples>::emit(&mut Pprof, &w, out)
}
