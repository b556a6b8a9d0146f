//! `mmaplock-prof agent`: the same pipeline as a one-shot profile (kernel side, registry,
//! aggregation) on the same run loop, selecting processes at run time and turning each
//! interval into Prometheus metrics (and, optionally, NDJSON interval reports).

mod http;
pub mod selection;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    kernel::collector::{Collector, CollectorConfig, CollectorError, Floor},
    output::{
        prometheus::{self, Metrics, Shared},
        report,
        rotate::Rotating,
    },
    registry::ids::ProcId,
    run::{Driver, LoopConfig, Profile, Rings, SessionError, run_loop},
};
use selection::{Selection, SelectionError, Selectors, cgroup_of};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Selection(#[from] SelectionError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("cannot write {0}: {1}")]
    Output(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl AgentError {
    /// 2 for bad usage (a bad selector file, an output that cannot be written), 1 for the
    /// environment (no privilege, an address in use).
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Selection(_) | AgentError::Output(..) => 2,
            AgentError::Listen(..) => 1,
            AgentError::Session(e) => e.exit_code(),
        }
    }
}

impl From<CollectorError> for AgentError {
    fn from(e: CollectorError) -> Self {
        AgentError::Session(SessionError::Collector(e))
    }
}

/// What the agent needs (from `cli::AgentArgs`).
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub selectors: Selectors,
    pub config_file: Option<PathBuf>,
    pub pid_label: bool,
    pub output: Option<PathBuf>,
    pub rotate_bytes: u64,
    pub rotate_keep: u32,
    pub interval: Duration,
    pub max_threads: u32,
    pub bpf_stats: bool,
    /// Charge waits to the holds that made them wait (`mmaplock_blocked_seconds_total`).
    pub blockers: bool,
    /// Export up to this many JavaScript functions per process (0: none, no stacks sampled).
    pub js_functions: usize,
    /// One write's stack in this many per thread (0: none).
    pub stack_sample: u32,
    pub quiet: bool,
}

impl AgentConfig {
    /// The command line's selectors plus the config file's (read again on SIGHUP).
    fn selectors(&self) -> Result<Selectors, SelectionError> {
        let mut s = self.selectors.clone();
        if let Some(f) = &self.config_file {
            s.add_file(f)?;
        }
        Ok(s)
    }
}

/// Each interval: refresh the selection, then fold the interval into the metrics.
struct Agent<'a> {
    cfg: &'a AgentConfig,
    selection: Selection,
    metrics: Shared,
    ndjson: Option<Rotating>,
}

impl Agent<'_> {
    fn labels(&self, p: ProcId, name: String) -> (String, String) {
        let cgroup = match self.selection.get(p) {
            Some(s) => s.cgroup.clone(),
            None => cgroup_of(p.pid).unwrap_or_default(),
        };
        (name, cgroup)
    }
}

impl Driver for Agent<'_> {
    fn before_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError> {
        let changes = self.selection.scan();
        let add: Vec<(u32, u64)> = changes.added.iter().map(|p| (p.pid, p.start)).collect();
        let remove: Vec<u32> = changes
            .removed
            .iter()
            .map(|p| p.pid)
            // A pid removed as one process and added as another (reused) stays selected.
            .filter(|pid| !add.iter().any(|(a, _)| a == pid))
            .collect();
        profile.collector.update_selection(&add, &remove)?;
        Ok(())
    }

    fn after_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError> {
        let (window, attribution, meta) = profile.take_interval();
        let js = profile
            .stacks
            .as_mut()
            .map(|s| s.take_js_functions())
            .unwrap_or_default();
        {
            let mut m = self.metrics.0.lock().expect("metrics lock");
            for (p, functions) in &js {
                let name = match window.processes.get(p) {
                    Some(threads) => attribution.name(*p, threads),
                    None => profile.registry.names.get(*p, None),
                };
                let (process, cgroup) = self.labels(*p, name);
                m.add_js_functions(&process, &cgroup, functions);
            }
            m.add(&window, &attribution, |p| {
                let name = attribution.name(p, &window.processes[&p]);
                self.labels(p, name)
            });
            m.set_health(profile.lost_so_far(), profile.program_stats());
            m.tracked_processes = self.selection.len() as u64;
            let (threads, entries) = profile.live();
            m.tracked_threads = threads as u64;
            m.map_entries = entries as u64;
        }
        if let Some(out) = self.ndjson.as_mut() {
            let r = report::build(&window, &attribution, meta);
            let mut line = serde_json::to_vec(&r).map_err(|e| SessionError::Write(e.into()))?;
            line.push(b'\n');
            out.write_record(&line).map_err(SessionError::Write)?;
        }
        Ok(())
    }

    fn hangup(&mut self, _profile: &mut Profile) -> Result<bool, SessionError> {
        match self.cfg.selectors() {
            Ok(s) => {
                if !self.cfg.quiet {
                    eprintln!("mmaplock-prof agent: SIGHUP, selection re-read");
                }
                self.selection.reload(s);
            }
            // A bad file on reload keeps the running selection.
            Err(e) => eprintln!("mmaplock-prof agent: {e}; keeping the current selection"),
        }
        Ok(false)
    }
}

pub async fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    // Everything the user gave is checked before the kernel is touched.
    let selectors = cfg.selectors()?;
    let ndjson = match &cfg.output {
        Some(p) => Some(
            Rotating::open(p, cfg.rotate_bytes, cfg.rotate_keep)
                .map_err(|e| AgentError::Output(p.clone(), e))?,
        ),
        None => None,
    };
    let listener = http::bind(cfg.listen)
        .await
        .map_err(|e| AgentError::Listen(cfg.listen, e))?;
    let mut collector = Collector::start(&CollectorConfig {
        pids: vec![],
        comms: vec![],
        max_threads: cfg.max_threads,
        bpf_stats: cfg.bpf_stats,
        stack_sample: cfg.stack_sample,
        writes_only: false,
        floor: Floor::Off,
        selection: true,
        children: false,
        blockers: cfg.blockers,
    })?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let metrics = Shared(Arc::new(Mutex::new(
        Metrics::new(
            cfg.pid_label,
            kernel,
            collector.kernel.tracepoints.to_string(),
        )
        .with_js_functions(cfg.js_functions),
    )));
    let attach_ms = collector.attach_time.as_secs_f64() * 1e3;
    let mut rings = Rings::open(&mut collector).map_err(AgentError::Session)?;
    let mut profile = Profile::new(collector, true);
    profile.forget_history();
    // With --js-functions: sampled stacks, named as they come (whatever selected them).
    profile.prepare_stacks(&[]);
    let registry = Arc::new(prometheus::registry(metrics.clone()));
    let mut agent = Agent {
        cfg: &cfg,
        selection: Selection::new(selectors),
        metrics,
        ndjson,
    };
    // Select at once, not one interval late; only then say so.
    agent.before_poll(&mut profile)?;
    if !cfg.quiet {
        eprintln!(
            "mmaplock-prof agent: attached in {attach_ms:.1} ms, {} processes selected, serving http://{}/metrics",
            agent.selection.len(),
            cfg.listen
        );
    }
    if !cfg.quiet {
        crate::kernel::minkernel::warn_if_lacking_ptrace();
    }
    let local = tokio::task::LocalSet::new();
    let failure = local
        .run_until(async {
            let server = tokio::task::spawn_local(http::serve(listener, registry));
            let r = run_loop(
                &mut profile,
                &mut rings,
                LoopConfig {
                    period: cfg.interval,
                    duration: None,
                    targets: None,
                },
                &mut agent,
            )
            .await;
            server.abort();
            r
        })
        .await?;
    // The last partial interval still counts.
    rings.drain(&mut profile);
    let last = profile
        .finish()
        .await
        .and_then(|()| agent.after_poll(&mut profile));
    failure?;
    last?;
    Ok(())
}
