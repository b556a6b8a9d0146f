//! Prometheus metrics (shared/design/agent-and-metrics.md): cumulative series built from each
//! interval's window and attribution, exposed through `prometheus-client` as OpenMetrics text
//! or, when the scraper asks, Prometheus's protobuf with native histograms.
//!
//! Classic buckets are the kernel's log2 buckets exactly: bucket `i` holds `2^(i-1) <= d <
//! 2^i` ns, exposed as `le = 2^i` ns in seconds (the last, which also takes anything longer,
//! only under `+Inf`). Native histograms use schema 0 (bucket `k` holds `(2^(k-1), 2^k]`
//! seconds); since 1 ns is 2^-29.9 s, a kernel bucket straddles two native ones, and its whole
//! count goes to the native bucket `i - 30`, which holds the lower 90% of its range: a count
//! moves by one bucket at most, never more. Sums and counts are exact in both.
//!
//! Here what is kept (`Metrics`, cumulative); the log2 buckets as classic and native ones are
//! `buckets.rs`, writing the families out (the exposition's names and help) `encode.rs`.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use profiler_common::cause;
use prometheus_client::registry::Registry;

use crate::{
    aggregation::Attribution,
    aggregation::{DurationHist, SideStats, Window},
    kernel::collector::ProgramStats,
    output::{blockers::by_role, report::Lost},
    vocab::{Mode, ids::ProcId},
};

mod buckets;
mod encode;
#[cfg(test)]
mod tests;

use encode::process_labels;

/// The labels of a wait or hold histogram.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    process: String,
    cgroup: String,
    role: &'static str,
    op: &'static str,
    /// Only with `--pid-label`.
    pid: Option<u32>,
}

impl SeriesKey {
    fn labels(&self, mode: Mode) -> Vec<(&'static str, String)> {
        process_labels(
            &self.process,
            &self.cgroup,
            &[("role", self.role), ("op", self.op)],
            self.pid,
            mode,
        )
    }
}

/// The labels of `mmaplock_blocked_seconds_total`.
type BlockedKey = (
    String,
    String,
    &'static str,
    &'static str,
    Cow<'static, str>,
    Option<u32>,
);

/// The labels of `mmaplock_thread_seconds_total` and its CPU twin.
type ThreadKey = (String, String, &'static str, Option<u32>);

/// `--escalate-dir`'s series: every crossing of the threshold, by what came of it (a capture
/// written, or why none was), and the captures in progress and waiting now.
#[derive(Clone, Debug, Default)]
pub struct Escalations {
    pub counts: BTreeMap<(String, String, &'static str), u64>,
    /// The process (and cgroup) captured now.
    pub in_progress: Option<(String, String)>,
    pub waiting: u64,
}

impl Escalations {
    pub fn count(&mut self, process: String, cgroup: String, reason: &'static str) {
        *self.counts.entry((process, cgroup, reason)).or_default() += 1;
    }
}

/// The agent's pushes (`--pyroscope`, `--otlp`): requests sent and given up on, by exporter
/// (`pyroscope`, `otlp_profiles`, `otlp_metrics`) and reason.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    pub sent: BTreeMap<&'static str, u64>,
    pub dropped: BTreeMap<(&'static str, &'static str), u64>,
}

impl Exports {
    /// Why a payload is given up on: the queue overflowed (the backend too slow or down
    /// long), no answer after its attempts, the backend failing (5xx, 429) after them, the
    /// backend refusing it (4xx), or the agent stopping with it unsent.
    pub const REASONS: [&'static str; 5] = [
        "queue_full",
        "unreachable",
        "backend_error",
        "rejected",
        "shutdown",
    ];
}

/// Everything the agent exports, cumulative over its life: series never go backwards when a
/// process exits, and their labels are bounded (no pid unless asked).
#[derive(Default)]
pub struct Metrics {
    pid_label: bool,
    /// Cumulative (their sums wrap after 584 years of wait or hold in one series).
    wait: BTreeMap<SeriesKey, DurationHist>,
    hold: BTreeMap<SeriesKey, DurationHist>,
    acquisitions: BTreeMap<(SeriesKey, &'static str), u64>,
    failed: BTreeMap<(String, String, &'static str, Option<u32>), u64>,
    downgrades: BTreeMap<SeriesKey, u64>,
    /// Wait charged to blockers, ns: (process, cgroup, waiter role, holder role, holder
    /// cause, pid).
    blocked: BTreeMap<BlockedKey, u64>,
    /// Threads' wall time alive and CPU time, ns, by (process, cgroup, role, pid): the
    /// denominators of the lock's share of their time.
    /// (CPU time: None while the kernel reported none of theirs.)
    thread_time: BTreeMap<ThreadKey, (u64, Option<u64>)>,
    /// With `--js-functions N`: sampled writes by (process, cgroup, function), at most N
    /// functions per process and cgroup (later ones are counted under `(other)`).
    js_functions: BTreeMap<(String, String, String), u64>,
    js_functions_max: usize,
    lost: Lost,
    programs: Vec<ProgramStats>,
    pub tracked_processes: u64,
    pub tracked_threads: u64,
    /// Entries in the kernel's statistics map (as last read).
    pub map_entries: u64,
    /// Processes each selector matches now, by the selector as written.
    pub selector_matches: Vec<(String, u64)>,
    /// The metrics endpoint's own health.
    pub http: HttpHealth,
    /// With `--escalate-dir`: the captures taken and held back.
    pub escalations: Option<Escalations>,
    /// With `--pyroscope` or `--otlp`: the pushes' health.
    pub exports: Option<Exports>,
    build: (String, String, String),
    /// What the agent measures: every series carries it as its `mode` label.
    mode: Mode,
    /// Full mode only because the kernel lacks the contention tracepoints.
    mode_fallback: bool,
}

impl Metrics {
    pub fn new(pid_label: bool, kernel: String, tracepoint_abi: String) -> Self {
        Metrics {
            pid_label,
            build: (
                env!("CARGO_PKG_VERSION").to_string(),
                kernel,
                tracepoint_abi,
            ),
            ..Default::default()
        }
    }

    /// The agent profiles in `mode` (`fallback`: full only because the kernel could not do
    /// contention mode, its default).
    pub fn with_mode(mut self, mode: Mode, fallback: bool) -> Self {
        self.mode = mode;
        self.mode_fallback = fallback;
        self
    }

    /// Exports up to `n` JavaScript functions per process (0: none).
    pub fn with_js_functions(mut self, n: usize) -> Self {
        self.js_functions_max = n;
        self
    }

    /// Adds one interval's sampled writes by JavaScript function of a process (labelled
    /// `process`, `cgroup`), most first: a function keeps its series once it has one; past
    /// the first N functions of a process, the rest go to `(other)`, so that the series stay
    /// bounded however many functions a process runs.
    pub fn add_js_functions(&mut self, process: &str, cgroup: &str, functions: &[(String, u64)]) {
        if self.js_functions_max == 0 {
            return;
        }
        let mut have = self
            .js_functions
            .keys()
            .filter(|(p, c, f)| p == process && c == cgroup && f != "(other)")
            .count();
        for (f, n) in functions {
            let key = (process.to_string(), cgroup.to_string(), f.clone());
            let key = if self.js_functions.contains_key(&key) {
                key
            } else if have < self.js_functions_max {
                have += 1;
                key
            } else {
                (
                    process.to_string(),
                    cgroup.to_string(),
                    "(other)".to_string(),
                )
            };
            *self.js_functions.entry(key).or_default() += n;
        }
    }

    /// Adds one interval's activity. `labels` names a process: its command name and cgroup.
    pub fn add(
        &mut self,
        window: &Window,
        attribution: &Attribution,
        labels: impl Fn(ProcId) -> (String, String),
    ) {
        for (&p, threads) in &window.processes {
            let (process, cgroup) = labels(p);
            let pid = self.pid_label.then_some(p.pid);
            for (&t, agg) in threads {
                let role = attribution.role(p, t, agg).as_str();
                if agg.time.alive_ns > 0 || agg.time.cpu_ns.is_some() {
                    let e = self
                        .thread_time
                        .entry((process.clone(), cgroup.clone(), role, pid))
                        .or_default();
                    e.0 += agg.time.alive_ns;
                    if let Some(c) = agg.time.cpu_ns {
                        e.1 = Some(e.1.unwrap_or(0) + c);
                    }
                }
                let key = |op| SeriesKey {
                    process: process.clone(),
                    cgroup: cgroup.clone(),
                    role,
                    op,
                    pid,
                };
                self.add_side(key("read"), &agg.read, "read");
                for (c, s) in agg.writes.iter() {
                    self.add_side(key("write"), s, cause::name(c));
                }
                if agg.downgrade.count > 0 {
                    *self.downgrades.entry(key("write")).or_default() += agg.downgrade.count;
                }
            }
        }
        for (&p, pairs) in window.blocked.iter().flat_map(|b| &b.owners) {
            let (process, cgroup) = labels(p);
            let pid = self.pid_label.then_some(p.pid);
            for r in by_role(p, pairs, window.processes.get(&p), attribution) {
                let key = (
                    process.clone(),
                    cgroup.clone(),
                    r.waiter_role.as_str(),
                    r.holder_role.as_str(),
                    r.cause,
                    pid,
                );
                *self.blocked.entry(key).or_default() += r.wait_ns;
            }
        }
    }

    fn add_side(&mut self, key: SeriesKey, s: &SideStats, cause: &'static str) {
        if s.is_empty() {
            return;
        }
        // Present (at zero) from the first acquisition on: rate() then has a series.
        *self
            .failed
            .entry((key.process.clone(), key.cgroup.clone(), key.op, key.pid))
            .or_default() += s.failed;
        if s.count == 0 {
            return;
        }
        self.wait.entry(key.clone()).or_default().merge(&s.wait);
        // Contention mode measures no hold: no series says it did.
        if self.mode == Mode::Full {
            self.hold.entry(key.clone()).or_default().merge(&s.hold);
        }
        *self.acquisitions.entry((key, cause)).or_default() += s.count;
    }

    /// The run's losses so far (cumulative) and the programs' statistics (cumulative).
    pub fn set_health(&mut self, lost: Lost, programs: Vec<ProgramStats>) {
        self.lost = lost;
        self.programs = programs;
    }

    /// Series held (to show memory stays bounded).
    pub fn series(&self) -> usize {
        self.wait.len()
            + self.hold.len()
            + self.acquisitions.len()
            + self.failed.len()
            + self.blocked.len()
            + self.thread_time.len()
            + self.thread_time.values().filter(|t| t.1.is_some()).count()
    }
}

/// The metrics endpoint's connections (agent/http.rs).
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpHealth {
    /// Open now.
    pub open: u64,
    /// Closed to stay under the connection cap.
    pub limit: u64,
    /// Closed for being idle or slow.
    pub timeout: u64,
    /// TLS handshakes that failed.
    pub tls: u64,
    /// Requests answered 401.
    pub unauthorized: u64,
}

/// `Metrics` behind a lock, as a prometheus-client collector.
#[derive(Clone, Debug)]
pub struct Shared(pub Arc<Mutex<Metrics>>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Metrics({} series)", self.series())
    }
}

/// A registry exposing `metrics`.
pub fn registry(metrics: Shared) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(metrics));
    r
}

/// OpenMetrics text.
pub fn encode_text(r: &Registry) -> Result<String, std::fmt::Error> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r)?;
    Ok(s)
}

/// Prometheus's length-delimited protobuf (with native histograms).
pub fn encode_protobuf(r: &Registry) -> Option<Vec<u8>> {
    prometheus_client::encoding::prometheus_protobuf::encode_to_vec(r).ok()
}
