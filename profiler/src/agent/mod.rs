//! `mmaplock-prof agent`: the same pipeline as a one-shot profile (kernel side, registry,
//! aggregation) on the same run loop, selecting processes at run time and turning each
//! interval into Prometheus metrics (and, optionally, NDJSON interval reports).

mod config;
mod endpoint;
pub mod escalate;
mod http;
mod profiles;
pub mod push;
mod runtime;
mod sampled;
pub mod selection;
mod webconfig;

use std::sync::{Arc, Mutex};

use crate::{
    aggregation::Attribution,
    kernel::{
        collector::{Collector, CollectorConfig, Floor},
        selection::Pick,
    },
    output::{
        prometheus::{self, Metrics, Shared},
        report,
        rotate::Rotating,
    },
    run::{Driver, LoopConfig, Profile, Session, SessionError, Sink},
    vocab::{Format, Mode, ids::ProcId},
};
pub use config::{AgentConfig, AgentError};
pub use escalate::EscalateConfig;
use escalate::{Escalator, Named};
use profiles::{Profiles, SharedProfiles};
use selection::{Selection, cgroup_of};

/// Each interval: refresh the selection, then fold the interval into the metrics.
struct Agent<'a> {
    cfg: &'a AgentConfig,
    selection: Selection,
    metrics: Shared,
    /// `--output`: the interval reports as JSON lines, in a file rotated by size.
    ndjson: Option<Sink>,
    /// Readings so far: the first scans /proc for the processes already running.
    polls: u64,
    /// Whether the kernel matches every selector (else the scans run every interval).
    kernel_complete: bool,
    web: http::Web,
    /// With --pprof or --escalate-dir: the last intervals' sampled stacks.
    profiles: Option<SharedProfiles>,
    escalator: Option<Escalator>,
}

/// Besides the first, a scan of /proc every this many readings: for what the kernel does
/// not see at exec, fork or rename (a process moved to another cgroup).
const RESCAN_EVERY: u64 = 30;

impl Agent<'_> {
    /// A process's labels: its cgroup as the registry knows it (read while it lived, or
    /// reported by the kernel at its exec or fork, for a process gone before anyone could
    /// read its /proc entry), else as it was selected.
    fn labels(&self, p: ProcId, name: String, attribution: &Attribution) -> (String, String) {
        let cgroup = attribution
            .cgroup(p)
            .map(str::to_string)
            .or_else(|| {
                self.selection
                    .get(p)
                    .map(|s| s.cgroup.clone())
                    .filter(|c| !c.is_empty())
            })
            .or_else(|| cgroup_of(p.pid))
            .unwrap_or_default();
        (runtime::process_label(&name).to_string(), cgroup)
    }
}

impl Driver for Agent<'_> {
    fn before_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError> {
        self.polls += 1;
        let scan =
            self.polls == 1 || !self.kernel_complete || self.polls.is_multiple_of(RESCAN_EVERY);
        let (added, removed) = if scan {
            let c = self.selection.scan();
            (c.added, c.removed)
        } else {
            self.selection.clear_departed();
            (Vec::new(), self.selection.prune_exited())
        };
        let add: Vec<Pick> = added
            .iter()
            .map(|p| match self.selection.selectors.by_rule(p.pid) {
                true => Pick::rule(p.pid, p.start, 0),
                false => Pick::pid(p.pid, p.start),
            })
            .collect();
        // (A pid removed as one process and added as another, reused, stays selected: only
        // the value of the process removed is.)
        let remove: Vec<(u32, u64)> = removed.iter().map(|p| (p.pid, p.start)).collect();
        profile.collector.update_selection(&add, &remove)?;
        // What the kernel selected at exec or fork since: labelled now, while it lives.
        let adopted = self.selection.adopt(&profile.collector.selected());
        // Their stacks unwound and their JavaScript named from their first burst on, as the
        // one-shot does for its targets (see `Profile::prepare_stacks_of`).
        profile.prepare_stacks_of(&[added, adopted].concat());
        Ok(())
    }

    fn after_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError> {
        // A selected process that exec'd is labelled after its new image.
        for p in profile.take_execs() {
            self.selection.relabel(p);
        }
        let (window, attribution, meta) = profile.take_interval();
        let (start, end) = (meta.start, meta.end);
        let owners = profile
            .stacks
            .as_mut()
            .map(|s| s.take_owners())
            .unwrap_or_default();
        {
            let mut m = self.metrics.0.lock().expect("metrics lock");
            for (p, o) in &owners {
                let functions = o.js_function_counts();
                if functions.is_empty() {
                    continue;
                }
                let name = match window.processes.get(p) {
                    Some(threads) => attribution.name(*p, threads),
                    None => profile.registry.names.get(*p, None),
                };
                let (process, cgroup) = self.labels(*p, name, &attribution);
                m.add_js_functions(&process, &cgroup, &functions);
            }
            // (A lock's owner may be in the window by its charged waits alone.)
            let none = std::collections::BTreeMap::new();
            m.add(&window, &attribution, |p| {
                let name = attribution.name(p, window.processes.get(&p).unwrap_or(&none));
                self.labels(p, name, &attribution)
            });
            // Lost output: the --output file's interval lines its writer could not keep.
            let mut lost = profile.lost_so_far();
            lost.output = self.ndjson.as_ref().map_or(0, Sink::lost_output);
            m.set_health(lost, profile.program_stats());
            m.tracked_processes = self.selection.len() as u64;
            m.selector_matches = self.selection.matches_by_selector();
            let (threads, entries) = profile.live();
            m.tracked_threads = threads as u64;
            m.map_entries = entries as u64;
        }
        if let Some(ring) = &self.profiles {
            let names = &mut profile.registry.names;
            let processes = sampled::interval_samples(&owners, &window, &attribution, |p| {
                let name = match window.processes.get(&p) {
                    Some(threads) => attribution.name(p, threads),
                    None => names.get(p, None),
                };
                let (process, cgroup) = self.labels(p, name, &attribution);
                let mut labels = vec![("process", process), ("cgroup", cgroup)];
                if self.cfg.pid_label {
                    labels.push(("pid", p.pid.to_string()));
                }
                labels
            });
            if let Ok(mut ring) = ring.lock() {
                ring.push(start, end, processes);
            }
        }
        if let Some(mut esc) = self.escalator.take() {
            let selection = &self.selection;
            let names = &mut profile.registry.names;
            let mut name = |p: ProcId| {
                let comm = match window.processes.get(&p) {
                    Some(threads) => attribution.name(p, threads),
                    None => names.get(p, None),
                };
                let (process, cgroup) = self.labels(p, comm.clone(), &attribution);
                Named {
                    process,
                    cgroup,
                    comm,
                }
            };
            let i = escalate::Interval {
                start,
                end,
                window: &window,
                attribution: &attribution,
            };
            esc.interval(
                i,
                |p| selection.get(p).is_some(),
                &mut name,
                self.profiles.as_ref(),
            );
            self.metrics.0.lock().expect("metrics lock").escalations = Some(esc.health().clone());
            self.escalator = Some(esc);
        }
        if let Some(out) = self.ndjson.as_mut() {
            // A full disk does not stop the agent: /metrics goes on, the next intervals are
            // tried again (an interval report's failure is never the run's).
            let mut r = report::build(&window, &attribution, meta);
            if profile.stacks.is_some() {
                let names = &mut profile.registry.names;
                sampled::add_sampled_writes(&mut r, &owners, |p| names.get(p, None));
                for p in &mut r.processes {
                    p.stack_sample_raised = profile.collector.raised_rate(p.pid);
                }
            }
            out.write_report(r)?;
        }
        Ok(())
    }

    fn hangup(&mut self, profile: &mut Profile) -> Result<bool, SessionError> {
        match self.cfg.selectors() {
            Ok(s) => {
                if !self.cfg.quiet {
                    eprintln!("mmaplock-prof agent: SIGHUP, selection re-read");
                }
                for w in s.warnings() {
                    eprintln!("mmaplock-prof agent: {w}");
                }
                let (kernel, complete) = s.kernel();
                profile.collector.set_selectors(&kernel)?;
                self.kernel_complete = complete;
                self.selection.reload(s);
                // The next reading scans /proc with the new selectors.
                self.polls = 0;
                if let Some(path) = &self.cfg.web_config {
                    webconfig::reload(path, &self.web);
                }
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
    let push = cfg.push_settings()?;
    let stack_sample = cfg.stack_sample(&push);
    let web = webconfig::shared(cfg.web_config.as_deref(), cfg.quiet)?;
    for w in selectors.warnings() {
        eprintln!("mmaplock-prof agent: {w}");
    }
    let ndjson = match &cfg.output {
        Some(p) => Some(Sink::rotating(
            Rotating::open(p, cfg.rotate_bytes, cfg.rotate_keep)
                .map_err(|e| AgentError::Output(p.clone(), e))?,
            Format::Json,
            "the agent goes on serving /metrics; the next intervals are tried again",
        )),
        None => None,
    };
    let mut escalator = match &cfg.escalate {
        Some(e) => Some(
            Escalator::new(e.clone(), cfg.quiet)
                .map_err(|err| AgentError::Output(e.dir.clone(), err))?,
        ),
        None => None,
    };
    let listener = http::bind(cfg.listen)
        .await
        .map_err(|e| AgentError::Listen(cfg.listen, e))?;
    // The port the kernel gave, for `--listen ADDR:0`.
    let listening = listener.local_addr().unwrap_or(cfg.listen);
    // The default: contention mode, where the kernel has its tracepoints.
    let (mode, fallback) = match cfg.mode {
        Some(m) => (m, false),
        None if crate::kernel::features::Features::running().contention_tracepoints => {
            (Mode::Contention, false)
        }
        None => (Mode::Full, true),
    };
    if fallback && !cfg.quiet {
        eprintln!(
            "mmaplock-prof agent: this kernel has no lock contention tracepoints (lock:contention_begin/end, Linux 5.19+): running in full mode, which times every acquisition (mmaplock_mode_fallback 1; docs/agent.md)"
        );
    }
    let mut collector = Collector::start(&CollectorConfig {
        pids: vec![],
        comms: vec![],
        max_threads: cfg.max_threads,
        bpf_stats: cfg.bpf_stats,
        stack_sample,
        writes_only: false,
        floor: Floor::Off,
        selection: true,
        children: false,
        blockers: cfg.blockers,
        mode,
        // A capture's before.pb.gz holds every thread of the window that waited.
        sample_floor_ms: if cfg.escalate.is_some() {
            escalate::SAMPLE_FLOOR_MS
        } else {
            0
        },
        // ... from a process's second second: it is captured only once measured over a
        // whole window.
        floor_after_first: true,
        max_stack_rate: cfg.max_stack_rate,
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
        .with_js_functions(cfg.js_functions)
        .with_mode(mode, fallback),
    )));
    // The kernel selects at exec, fork and rename from now on; the first reading adds the
    // processes already running.
    let (kernel_selectors, kernel_complete) = selectors.kernel();
    collector.set_selectors(&kernel_selectors)?;
    let attach_ms = collector.attach_time.as_secs_f64() * 1e3;
    let collector_layout = collector.kernel.tracepoints;
    // With --js-functions: sampled stacks, named as they come (whatever selected them).
    let mut session = Session::new(collector, Some(cfg.interval), &[])?;
    session.profile.forget_history();
    let registry = Arc::new(prometheus::registry(metrics.clone()));
    if let Some(e) = escalator.as_mut() {
        e.for_kernel(collector_layout, mode);
        if !cfg.quiet {
            eprintln!(
                "mmaplock-prof agent: escalation on: captures under {} in {}",
                cfg.escalate
                    .as_ref()
                    .map_or(String::new(), |e| e.dir.display().to_string()),
                e.plan()
            );
        }
    }
    let profiles: Option<SharedProfiles> = (cfg.pprof || escalator.is_some() || push.profiles())
        .then(|| {
            Arc::new(Mutex::new(
                Profiles::new(stack_sample, mode, profiles::BUDGET_BYTES)
                    .bounded(cfg.max_stack_rate),
            ))
        });
    // The pushes' threads: a bad --push-ca is an error before the first interval.
    let pushers = push::start(
        &push,
        push::Sources {
            profiles: profiles.clone(),
            metrics: metrics.clone(),
            started: std::time::SystemTime::now(),
            host: push::host_name(),
        },
        cfg.quiet,
    )?;
    if pushers.is_some() && !cfg.quiet {
        let to: Vec<String> = [
            push.pyroscope
                .as_ref()
                .map(|u| format!("Pyroscope at {u}/ingest")),
            push.otlp.as_ref().map(|u| {
                format!(
                    "OTLP at {u}{} and {u}{} (profiles: proto {}, alpha)",
                    crate::output::otlp::PROFILES_PATH,
                    crate::output::otlp::METRICS_PATH,
                    crate::output::otlp::PROTO_VERSION
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        eprintln!(
            "mmaplock-prof agent: pushing every {} s to {}",
            push.interval().as_secs_f64(),
            to.join(" and ")
        );
    }
    let mut agent = Agent {
        cfg: &cfg,
        selection: Selection::new(selectors),
        metrics,
        ndjson,
        polls: 0,
        kernel_complete,
        web: web.clone(),
        profiles: profiles.clone(),
        escalator,
    };
    // Select at once, not one interval late; only then say so.
    agent.before_poll(&mut session.profile)?;
    if !cfg.quiet {
        let tls = agent.web.read().is_ok_and(|w| w.tls.is_some());
        eprintln!(
            "mmaplock-prof agent: attached in {attach_ms:.1} ms ({mode} mode), {} selected, serving {}://{}/metrics",
            crate::output::text::count_of(agent.selection.len() as u64, "process", "processes"),
            if tls { "https" } else { "http" },
            listening
        );
    }
    if !cfg.quiet {
        crate::kernel::privilege::warn_if_lacking_ptrace();
    }
    let local = tokio::task::LocalSet::new();
    let failure = local
        .run_until(async {
            let server = tokio::task::spawn_local(http::serve(
                listener,
                http::Routes {
                    registry,
                    profiles: profiles.filter(|_| cfg.pprof),
                },
                web,
                agent.metrics.clone(),
            ));
            let r = session
                .run(
                    LoopConfig {
                        period: cfg.interval,
                        duration: None,
                        targets: None,
                        signals_end: true,
                    },
                    &mut agent,
                )
                .await;
            server.abort();
            r
        })
        .await?;
    // A capture running ends now, its report complete, and none begins.
    if let Some(e) = agent.escalator.as_mut() {
        e.close();
    }
    // The last partial interval still counts, with the records its last flush brought.
    let last = session
        .finish()
        .await
        .and_then(|()| agent.after_poll(&mut session.profile));
    // Then the last pushes, which take it too.
    if let Some(p) = pushers {
        p.stop();
    }
    failure?;
    last?;
    Ok(())
}
