//! Writing the metrics out: every family's name, help and labels (the exposition dashboards
//! read, shared/design/agent-and-metrics.md).

use std::collections::BTreeMap;

use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeLabelSet, NativeHistogram,
        NativeHistogramBuckets, NoLabelSet,
    },
    metrics::MetricType,
};

use crate::vocab::Mode;

use super::{
    SeriesKey, Shared,
    buckets::{classic, native},
};
use crate::aggregation::DurationHist;

/// A process's series' labels: `process` and `cgroup`, then `more`, then `pid` (only with
/// `--pid-label`), in this order (the exposition's, which dashboards read).
pub(super) fn process_labels(
    process: &str,
    cgroup: &str,
    more: &[(&'static str, &str)],
    pid: Option<u32>,
    mode: Mode,
) -> Vec<(&'static str, String)> {
    let mut l = vec![
        ("process", process.to_string()),
        ("cgroup", cgroup.to_string()),
    ];
    l.extend(more.iter().map(|&(k, v)| (k, v.to_string())));
    if let Some(pid) = pid {
        l.push(("pid", pid.to_string()));
    }
    // Which mode the series comes from: in contention mode its counts are contended waits.
    l.push(("mode", mode.name().to_string()));
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

fn encode_hists(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    hists: &BTreeMap<SeriesKey, DurationHist>,
    mode: Mode,
) -> Result<(), std::fmt::Error> {
    if hists.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (key, h) in hists {
        let labels = key.labels(mode);
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
        let mode = m.mode;
        encode_hists(
            &mut encoder,
            "mmaplock_wait_seconds",
            "Time waited for the mmap_lock: per acquisition in mode=\"full\" (start_locking to \
             acquire_returned), per contended wait in mode=\"contention\" (contention_begin to \
             contention_end: the slow path only).",
            &m.wait,
            mode,
        )?;
        encode_hists(
            &mut encoder,
            "mmaplock_hold_seconds",
            "Time the mmap_lock was held per acquisition (acquire_returned to released; \
             mode=\"full\" only: contention mode does not see holds).",
            &m.hold,
            mode,
        )?;
        counters(
            &mut encoder,
            "mmaplock_acquisitions",
            "Successful mmap_lock acquisitions, by the cause of a write (read for reads); in \
             mode=\"contention\", only those that waited on the lock's slow path.",
            m.acquisitions.iter().map(|((key, cause), n)| {
                let mut labels = key.labels(mode);
                labels.push(("cause", cause.to_string()));
                (labels, *n)
            }),
        )?;
        counters(
            &mut encoder,
            "mmaplock_failed_trylocks",
            "Acquisitions that returned without the lock (failed trylocks, killed waiters).",
            m.failed.iter().map(|((process, cgroup, op, pid), n)| {
                (
                    process_labels(process, cgroup, &[("op", op)], *pid, mode),
                    *n,
                )
            }),
        )?;
        counters(
            &mut encoder,
            "mmaplock_downgrades",
            "Write locks downgraded to read (munmap, brk, mremap, stack growth).",
            m.downgrades.iter().map(|(key, n)| {
                let mut labels = key.labels(mode);
                labels.retain(|(k, _)| *k != "op");
                (labels, *n)
            }),
        )?;
        // Every reason the report has (output::lost_reasons), and their sum as `events`.
        counters(
            &mut encoder,
            "mmaplock_lost",
            "Acquisitions (or, for stacks, samples; for skipped, program runs the kernel skipped) \
             the profile does not contain, by reason.",
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
                            process_labels(process, cgroup, &[("function", function)], None, mode),
                            *n,
                        )
                    }),
            )?;
        }
        if !m.blocked.is_empty() {
            counters(
                &mut encoder,
                "mmaplock_blocked_seconds",
                "Wait charged to the holds that made it wait (--blockers; in \
                 mode=\"contention\", each contended wait to the writer holding the lock when \
                 it began, or to readers): by the waiting thread's role, the holding thread's \
                 role and what it held the lock for.",
                m.blocked
                    .iter()
                    .map(|((process, cgroup, waiter, holder, cause, pid), ns)| {
                        let roles = [
                            ("waiter_role", *waiter),
                            ("holder_role", *holder),
                            ("holder_cause", cause.as_ref()),
                        ];
                        (
                            process_labels(process, cgroup, &roles, *pid, mode),
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
                            let labels =
                                process_labels(process, cgroup, &[("role", role)], *pid, mode);
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
        if let Some(e) = &m.escalations {
            counters(
                &mut encoder,
                "mmaplock_escalations",
                "Crossings of --escalate-at by a process, by what came of each: captured (a \
                 capture written under --escalate-dir), cooldown or busy (held back by the \
                 process's cooldown or by the capture running), exited, no_space, over_budget \
                 or failed (no capture kept).",
                e.counts.iter().map(|((process, cgroup, reason), n)| {
                    (
                        [
                            ("process", process.as_str()),
                            ("cgroup", cgroup.as_str()),
                            ("reason", *reason),
                        ],
                        *n,
                    )
                }),
            )?;
            // Labelled with the process while a capture runs (a dashboard's annotation of
            // it), a plain 0 otherwise.
            let mut f = encoder.encode_descriptor(
                "mmaplock_escalation_in_progress",
                "1 while a capture (--escalate-dir) of the process runs: at most one on the \
                 host; 0, unlabelled, when none does.",
                None,
                MetricType::Gauge,
            )?;
            match &e.in_progress {
                Some((process, cgroup)) => f
                    .encode_family(&[("process", process.as_str()), ("cgroup", cgroup.as_str())])?
                    .encode_gauge(&1i64)?,
                None => f.encode_gauge(&0i64)?,
            }
            encoder
                .encode_descriptor(
                    "mmaplock_escalations_waiting",
                    "Processes above --escalate-at, out of their cooldown, waiting for the \
                     capture running to end.",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&(e.waiting as i64))?;
        }
        if let Some(e) = &m.exports {
            counters(
                &mut encoder,
                "mmaplock_export_sent",
                "Requests the agent's pushes (--pyroscope, --otlp) delivered, by exporter \
                 (pyroscope, otlp_profiles, otlp_metrics).",
                e.sent.iter().map(|(x, n)| ([("exporter", *x)], *n)),
            )?;
            counters(
                &mut encoder,
                "mmaplock_export_dropped",
                "Requests the agent's pushes gave up on, by exporter and reason: queue_full \
                 (the oldest, past the bounded queue), unreachable (no answer after 3 \
                 attempts), backend_error (5xx or 429 after 3 attempts), rejected (4xx), \
                 shutdown (unsent when the agent stopped).",
                e.dropped
                    .iter()
                    .map(|((x, r), n)| ([("exporter", *x), ("reason", *r)], *n)),
            )?;
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
                "The agent's version, the kernel, the mmap_lock tracepoints' layout and the \
                 mode it profiles in (full or contention).",
                None,
                MetricType::Gauge,
            )?
            .encode_family(&[
                ("version", version.as_str()),
                ("kernel", kernel.as_str()),
                ("tracepoint_abi", abi.as_str()),
                ("mode", mode.name()),
            ])?
            .encode_gauge(&1i64)?;
        encoder
            .encode_descriptor(
                "mmaplock_mode_fallback",
                "1 when the agent runs in full mode only because the kernel lacks the lock \
                 contention tracepoints its default, contention mode, needs (Linux 5.19+).",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(m.mode_fallback as i64))?;
        Ok(())
    }
}
