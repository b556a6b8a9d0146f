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

use std::{
    borrow::Cow,
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use profiler_common::{HIST_BUCKETS, cause};
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeLabelSet, NativeHistogram,
        NativeHistogramBuckets, NoLabelSet,
    },
    metrics::MetricType,
    registry::Registry,
};

use crate::{
    aggregation::Attribution,
    aggregation::{DurationHist, SideStats, Window},
    kernel::collector::ProgramStats,
    output::{blockers::by_role, report::Lost},
    vocab::ids::ProcId,
};

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
    fn labels(&self) -> Vec<(&'static str, String)> {
        process_labels(
            &self.process,
            &self.cgroup,
            &[("role", self.role), ("op", self.op)],
            self.pid,
        )
    }
}

/// A process's series' labels: `process` and `cgroup`, then `more`, then `pid` (only with
/// `--pid-label`), in this order (the exposition's, which dashboards read).
fn process_labels(
    process: &str,
    cgroup: &str,
    more: &[(&'static str, &str)],
    pid: Option<u32>,
) -> Vec<(&'static str, String)> {
    let mut l = vec![
        ("process", process.to_string()),
        ("cgroup", cgroup.to_string()),
    ];
    l.extend(more.iter().map(|&(k, v)| (k, v.to_string())));
    if let Some(pid) = pid {
        l.push(("pid", pid.to_string()));
    }
    l
}

/// A counter family: its descriptor, then a series per (labels, value).
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), std::fmt::Error> {
    let mut f = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        f.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
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

/// Classic buckets of a cumulative histogram, `(le in seconds, count)`, not cumulative (the
/// encoder adds up).
fn classic(h: &DurationHist) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = (0..HIST_BUCKETS - 1)
        .map(|i| (bucket_le_seconds(i), h.bucket(i)))
        .collect();
    out.push((f64::INFINITY, h.bucket(HIST_BUCKETS - 1)));
    out
}

/// Native schema-0 buckets as (spans, deltas): kernel bucket `i >= 1` -> index `i - 30`;
/// bucket 0 (exactly 0 ns) is the zero bucket.
fn native(h: &DurationHist) -> (Vec<(i32, u32)>, Vec<i64>) {
    let mut spans: Vec<(i32, u32)> = Vec::new();
    let mut deltas = Vec::new();
    let (mut prev_count, mut next_index) = (0i64, None::<i32>);
    for (i, n) in h.buckets().filter(|b| b.0 >= 1) {
        let k = native_index(i);
        match next_index {
            Some(next) if next == k => spans.last_mut().expect("a span").1 += 1,
            Some(next) => spans.push((k - next, 1)),
            None => spans.push((k, 1)),
        }
        next_index = Some(k + 1);
        deltas.push(n as i64 - prev_count);
        prev_count = n as i64;
    }
    (spans, deltas)
}

/// `le` of kernel bucket `i`: its exclusive upper bound, `2^i` ns, in seconds.
pub fn bucket_le_seconds(i: usize) -> f64 {
    (1u64 << i) as f64 * 1e-9
}

/// The native schema-0 bucket given the counts of kernel bucket `i` (see the module doc).
pub fn native_index(i: usize) -> i32 {
    i as i32 - 30
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
    build: (String, String, String),
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
        self.hold.entry(key.clone()).or_default().merge(&s.hold);
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

fn encode_hists(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    hists: &BTreeMap<SeriesKey, DurationHist>,
) -> Result<(), std::fmt::Error> {
    if hists.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (key, h) in hists {
        let labels = key.labels();
        let (spans, deltas) = native(h);
        let native_histogram = NativeHistogram {
            schema: 0,
            zero_threshold: 0.0,
            zero_count: h.bucket(0),
            negative: NativeHistogramBuckets {
                spans: &[],
                deltas: &[],
            },
            positive: NativeHistogramBuckets {
                spans: &spans,
                deltas: &deltas,
            },
            created: None,
        };
        family
            .encode_family(&labels)?
            .encode_histogram_with_native::<NoLabelSet>(
                h.sum as f64 * 1e-9,
                h.count(),
                &classic(h),
                None,
                native_histogram,
            )?;
    }
    Ok(())
}

impl Collector for Shared {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = self.0.lock().map_err(|_| std::fmt::Error)?;
        encode_hists(
            &mut encoder,
            "mmaplock_wait_seconds",
            "Time waited for the mmap_lock per acquisition (start_locking to acquire_returned).",
            &m.wait,
        )?;
        encode_hists(
            &mut encoder,
            "mmaplock_hold_seconds",
            "Time the mmap_lock was held per acquisition (acquire_returned to released).",
            &m.hold,
        )?;
        counters(
            &mut encoder,
            "mmaplock_acquisitions",
            "Successful mmap_lock acquisitions, by the cause of a write (read for reads).",
            m.acquisitions.iter().map(|((key, cause), n)| {
                let mut labels = key.labels();
                labels.push(("cause", cause.to_string()));
                (labels, *n)
            }),
        )?;
        counters(
            &mut encoder,
            "mmaplock_failed_trylocks",
            "Acquisitions that returned without the lock (failed trylocks, killed waiters).",
            m.failed.iter().map(|((process, cgroup, op, pid), n)| {
                (process_labels(process, cgroup, &[("op", op)], *pid), *n)
            }),
        )?;
        counters(
            &mut encoder,
            "mmaplock_downgrades",
            "Write locks downgraded to read (munmap, brk, mremap, stack growth).",
            m.downgrades.iter().map(|(key, n)| {
                let mut labels = key.labels();
                labels.retain(|(k, _)| *k != "op");
                (labels, *n)
            }),
        )?;
        // Every reason the report has (output::lost_reasons), and their sum as `events`.
        counters(
            &mut encoder,
            "mmaplock_lost",
            "Acquisitions (or, for stacks, samples) the profile does not contain, by reason.",
            std::iter::once(("events".to_string(), m.lost.events))
                .chain(crate::output::lost_reasons(&m.lost))
                .map(|(reason, n)| ([("reason", reason)], n)),
        )?;
        if m.js_functions_max > 0 {
            counters(
                &mut encoder,
                "mmaplock_js_function_sampled_writes",
                "Sampled write acquisitions (one in --stack-sample per thread) by the innermost \
                 JavaScript function of the application on their stack (--js-functions: the \
                 first N functions of a process, then (other)).",
                m.js_functions
                    .iter()
                    .map(|((process, cgroup, function), n)| {
                        (
                            process_labels(process, cgroup, &[("function", function)], None),
                            *n,
                        )
                    }),
            )?;
        }
        if !m.blocked.is_empty() {
            counters(
                &mut encoder,
                "mmaplock_blocked_seconds",
                "Wait charged to the holds that made it wait (--blockers): by the waiting \
                 thread's role, the holding thread's role and what it held the lock for.",
                m.blocked
                    .iter()
                    .map(|((process, cgroup, waiter, holder, cause, pid), ns)| {
                        let roles = [
                            ("waiter_role", *waiter),
                            ("holder_role", *holder),
                            ("holder_cause", cause.as_ref()),
                        ];
                        (
                            process_labels(process, cgroup, &roles, *pid),
                            *ns as f64 * 1e-9,
                        )
                    }),
            )?;
        }
        if !m.thread_time.is_empty() {
            for (name, help, cpu) in [
                (
                    "mmaplock_thread_seconds",
                    "Wall time alive of the threads that took a profiled lock, by role: the \
                     lock's wait over it (rate of mmaplock_wait_seconds_sum over rate of this) \
                     is the share of their time spent waiting.",
                    false,
                ),
                (
                    "mmaplock_thread_cpu_seconds",
                    "CPU time of the threads that took a profiled lock, by role, as the kernel \
                     reports it (at each reading and at their exit): the lock's wait over it is \
                     their wait per CPU-second.",
                    true,
                ),
            ] {
                counters(
                    &mut encoder,
                    name,
                    help,
                    m.thread_time.iter().filter_map(
                        |((process, cgroup, role, pid), (alive, cpu_ns))| {
                            let ns = if cpu { (*cpu_ns)? } else { *alive };
                            let labels = process_labels(process, cgroup, &[("role", role)], *pid);
                            Some((labels, ns as f64 * 1e-9))
                        },
                    ),
                )?;
            }
        }
        if !m.programs.is_empty() {
            counters(
                &mut encoder,
                "mmaplock_bpf_run_seconds",
                "Run time of the profiler's eBPF programs (kernel BPF statistics).",
                m.programs
                    .iter()
                    .map(|p| ([("program", p.name)], p.run_time.as_secs_f64())),
            )?;
            counters(
                &mut encoder,
                "mmaplock_bpf_runs",
                "Runs of the profiler's eBPF programs (kernel BPF statistics).",
                m.programs
                    .iter()
                    .map(|p| ([("program", p.name)], p.run_count)),
            )?;
        }
        for (name, help, v) in [
            (
                "mmaplock_tracked_processes",
                "Processes selected and profiled now.",
                m.tracked_processes,
            ),
            (
                "mmaplock_tracked_threads",
                "Threads with statistics in the kernel's map now.",
                m.tracked_threads,
            ),
            (
                "mmaplock_map_entries",
                "Entries in the kernel's statistics map (one per thread, lock and kind).",
                m.map_entries,
            ),
        ] {
            encoder
                .encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&(v as i64))?;
        }
        {
            let h = &m.http;
            counters(
                &mut encoder,
                "mmaplock_http_rejected",
                "Connections to /metrics closed by the agent (limit: over the connection cap; timeout: idle or slow; tls: failed handshake) and requests refused (unauthorized).",
                [
                    ("limit", h.limit),
                    ("timeout", h.timeout),
                    ("tls", h.tls),
                    ("unauthorized", h.unauthorized),
                ]
                .map(|(reason, n)| ([("reason", reason)], n)),
            )?;
            encoder
                .encode_descriptor(
                    "mmaplock_http_connections",
                    "Connections to /metrics open now.",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&(h.open as i64))?;
        }
        if !m.selector_matches.is_empty() {
            let mut f = encoder.encode_descriptor(
                "mmaplock_selector_matches",
                "Processes each selector of the agent's selection matches now.",
                None,
                MetricType::Gauge,
            )?;
            for (selector, n) in &m.selector_matches {
                f.encode_family(&[("selector", selector.as_str())])?
                    .encode_gauge(&(*n as i64))?;
            }
        }
        let (version, kernel, abi) = &m.build;
        encoder
            .encode_descriptor(
                "mmaplock_build_info",
                "The agent's version, the kernel and the mmap_lock tracepoints' layout.",
                None,
                MetricType::Gauge,
            )?
            .encode_family(&[
                ("version", version.as_str()),
                ("kernel", kernel.as_str()),
                ("tracepoint_abi", abi.as_str()),
            ])?
            .encode_gauge(&1i64)?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::bucket_index;

    fn hist(values: &[u64]) -> DurationHist {
        let mut d = DurationHist::default();
        for &v in values {
            d.add(bucket_index(v), 1);
            d.sum += v;
        }
        let mut h = DurationHist::default();
        h.merge(&d);
        h
    }

    /// The series of node's Worker threads' writes.
    fn worker_writes(cgroup: &str, pid: Option<u32>) -> SeriesKey {
        SeriesKey {
            process: "node".into(),
            cgroup: cgroup.into(),
            role: "worker",
            op: "write",
            pid,
        }
    }

    #[test]
    fn classic_buckets_are_the_kernel_buckets() {
        let h = hist(&[0, 100, 100, 5000]);
        let c = classic(&h);
        assert_eq!(c.len(), HIST_BUCKETS);
        assert_eq!(c[0], (1e-9, 1));
        // 100 ns is in [64, 128): le = 128 ns.
        assert_eq!(c[bucket_index(100)], (128e-9, 2));
        assert!(c.last().unwrap().0.is_infinite());
        assert_eq!(c.iter().map(|b| b.1).sum::<u64>(), 4);
        assert_eq!((h.count(), h.sum), (4, 5200));
    }

    #[test]
    fn native_buckets_move_a_count_one_bucket_at_most() {
        for i in 1..HIST_BUCKETS {
            let (lo, hi) = ((1u64 << (i - 1)) as f64 * 1e-9, (1u64 << i) as f64 * 1e-9);
            let k = native_index(i);
            // Native bucket k holds (2^(k-1), 2^k] s: it holds the kernel bucket's lower
            // bound, and its upper bound lies in k + 1.
            let (nlo, nhi) = (2f64.powi(k - 1), 2f64.powi(k));
            assert!(nlo < lo && lo <= nhi, "{i}: {lo} in ({nlo}, {nhi}]");
            assert!(hi > nhi && hi <= 2.0 * nhi, "{i}: {hi} in the next bucket");
        }
    }

    #[test]
    fn native_spans_and_deltas() {
        let h = hist(&[0, 3, 3, 5, 1000, 1000, 1000]);
        let (spans, deltas) = native(&h);
        // Kernel buckets 2 (3 ns: 2), 3 (5 ns: 1), 10 (1000 ns: 3).
        assert_eq!(spans, vec![(native_index(2), 2), (10 - 4, 1)]);
        assert_eq!(deltas, vec![2, -1, 2]);
        assert_eq!(h.bucket(0), 1, "the zero bucket");
    }

    #[test]
    fn text_exposition_has_the_contract_names() {
        let shared = Shared(Arc::new(Mutex::new(Metrics::new(
            false,
            "6.18".into(),
            "6.14+".into(),
        ))));
        {
            let mut m = shared.0.lock().unwrap();
            let key = worker_writes("/system.slice/api.service", None);
            let mut s = SideStats {
                count: 2,
                failed: 1,
                ..Default::default()
            };
            s.wait.add(bucket_index(1000), 2);
            s.wait.sum = 2000;
            s.hold.add(bucket_index(50), 2);
            s.hold.sum = 100;
            m.add_side(key, &s, "mprotect");
            m.thread_time.insert(
                (
                    "node".into(),
                    "/system.slice/api.service".into(),
                    "worker",
                    None,
                ),
                (2_500_000_000, Some(500_000_000)),
            );
            // Threads whose CPU time the kernel did not report: their wall time only.
            m.thread_time.insert(
                (
                    "node".into(),
                    "/system.slice/api.service".into(),
                    "libuv",
                    None,
                ),
                (1_000_000_000, None),
            );
        }
        let text = encode_text(&registry(shared)).unwrap();
        for needle in [
            "mmaplock_wait_seconds_bucket{le=\"0.000001024\",process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\"} 2",
            "mmaplock_wait_seconds_bucket{le=\"1e-9\",",
            "mmaplock_wait_seconds_bucket{le=\"+Inf\",",
            "mmaplock_wait_seconds_sum{",
            "mmaplock_wait_seconds_count{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\"} 2",
            "mmaplock_hold_seconds_bucket{",
            "mmaplock_acquisitions_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\",cause=\"mprotect\"} 2",
            "mmaplock_failed_trylocks_total{process=\"node\",cgroup=\"/system.slice/api.service\",op=\"write\"} 1",
            "mmaplock_lost_total{reason=\"events\"} 0",
            "mmaplock_tracked_processes 0",
            "mmaplock_thread_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\"} 2.5",
            "mmaplock_thread_cpu_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\"} 0.5",
            "mmaplock_build_info{version=",
        ] {
            assert!(text.contains(needle), "{needle}\n{text}");
        }
        assert!(!text.contains("pid="), "no pid label unless asked");
        assert!(text.contains("mmaplock_thread_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"libuv\"} 1"));
        assert!(!text.contains("mmaplock_thread_cpu_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"libuv\"}"));
    }

    #[test]
    fn every_process_series_has_process_cgroup_its_own_labels_then_pid() {
        let shared = Shared(Arc::new(Mutex::new(
            Metrics::new(true, "6.18".into(), "6.14+".into()).with_js_functions(2),
        )));
        {
            let mut m = shared.0.lock().unwrap();
            let key = worker_writes("/a", Some(7));
            let s = SideStats {
                count: 2,
                ..Default::default()
            };
            m.add_side(key.clone(), &s, "mmap");
            m.downgrades.insert(key, 3);
            m.failed
                .insert(("node".into(), "/a".into(), "read", Some(7)), 4);
            let blocked = (
                "node".into(),
                "/a".into(),
                "worker",
                "main",
                "mmap".into(),
                Some(7),
            );
            m.blocked.insert(blocked, 1_500_000_000);
            m.thread_time.insert(
                ("node".into(), "/a".into(), "worker", Some(7)),
                (2_000_000_000, Some(500_000_000)),
            );
            m.js_functions
                .insert(("node".into(), "/a".into(), "f (x.js:1)".into()), 12);
        }
        let text = encode_text(&registry(shared)).unwrap();
        for line in [
            r#"mmaplock_acquisitions_total{process="node",cgroup="/a",role="worker",op="write",pid="7",cause="mmap"} 2"#,
            r#"mmaplock_downgrades_total{process="node",cgroup="/a",role="worker",pid="7"} 3"#,
            r#"mmaplock_failed_trylocks_total{process="node",cgroup="/a",op="read",pid="7"} 4"#,
            r#"mmaplock_blocked_seconds_total{process="node",cgroup="/a",waiter_role="worker",holder_role="main",holder_cause="mmap",pid="7"} 1.5"#,
            r#"mmaplock_thread_seconds_total{process="node",cgroup="/a",role="worker",pid="7"} 2.0"#,
            r#"mmaplock_thread_cpu_seconds_total{process="node",cgroup="/a",role="worker",pid="7"} 0.5"#,
            r#"mmaplock_js_function_sampled_writes_total{process="node",cgroup="/a",function="f (x.js:1)"} 12"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
    }
}
