//! Building a report: a pure function of a window, its attribution and the report's
//! metadata, and the sampled stacks a summary adds.

use std::collections::BTreeMap;

use profiler_common::cause;

use super::{
    CauseReport, DsoReport, HolderFunctionReport, JsFramesReport, JsFunctionReport, Kind,
    LockReport, Meta, ProcessReport, ProfilerShare, Report, SCHEMA_VERSION, StackReport, Stats,
    ThreadReport, rfc3339,
    thread_groups::{self, LISTED_THREADS, ThreadFacts},
};
use crate::{
    aggregation::{Attribution, SideStats, Window},
    output::blockers::{by_role, lock_blockers},
    output::share::{self, ShareSum},
    registry::roles::{Role, comm_str},
    registry::stacks::{OwnerStacks, StackAttribution},
    vocab::{Mode, ids::ProcId},
};

/// The causes that took the lock (in [`LockReport::new`]'s order once there).
fn cause_reports<'a>(causes: impl Iterator<Item = (u32, &'a SideStats)>) -> Vec<CauseReport> {
    causes
        .filter(|(_, s)| !s.is_empty())
        .map(|(c, s)| CauseReport {
            cause: cause::name(c).into(),
            write: Stats::new(s),
        })
        .collect()
}

/// Said in a summary whose sampled writes went through JIT code no perf map named.
pub const JS_HINT: &str = "JavaScript frames are unnamed ([jit]): start node with \
     --perf-basic-prof-only-functions (or --perf-basic-prof) to name them, and \
     --interpreted-frames-native-stack for functions not compiled yet";

/// How many stacks each process's summary lists.
const TOP_STACKS: usize = 10;

/// The report of a window: a pure function of the activity, its attribution (names and
/// roles, resolved by the registry beforehand) and the report's metadata.
pub fn build(window: &Window, attribution: &Attribution, meta: Meta) -> Report {
    let Meta {
        kind,
        mode,
        start,
        end,
        lost,
        uncounted,
        overhead,
    } = meta;
    let secs = end.duration_since(start).unwrap_or_default().as_secs_f64();
    let secs = (secs * 1000.0).round() / 1000.0;
    let mut processes = Vec::new();
    for (&proc_id, threads_agg) in &window.processes {
        let pid = proc_id.pid;
        let comm = attribution.name(proc_id, threads_agg);
        let mut read = SideStats::default();
        let mut write = SideStats::default();
        let mut downgrade = SideStats::default();
        let mut causes: BTreeMap<u32, SideStats> = BTreeMap::new();
        let mut threads = Vec::new();
        let empty = BTreeMap::new();
        let pairs = window
            .blocked
            .as_ref()
            .map(|b| (b, b.owners.get(&proc_id).unwrap_or(&empty)));
        let mut blockers = pairs.map(|(b, pairs)| {
            lock_blockers(
                proc_id,
                pairs,
                Some(threads_agg),
                &b.holder_comms,
                attribution,
            )
        });
        let blocked_by_role =
            pairs.map(|(_, pairs)| by_role(proc_id, pairs, Some(threads_agg), attribution));
        // The profiler's reads: its writes are the process's teardown (below), never its own.
        let (mut own_read, own_write) = (SideStats::default(), SideStats::default());
        let (mut own_time, mut role_time) = (ShareSum::default(), BTreeMap::new());
        for (&thread, t) in threads_agg {
            let tw = t.write();
            let r = attribution.role(proc_id, thread, t);
            let origin = attribution
                .origin(proc_id, thread, t)
                .filter(|_| r == Role::Addon);
            let wait = tw.wait.sum + t.read.wait.sum;
            // The profiler's threads are in no share: their time is not the process's.
            if r != Role::Profiler {
                if r != Role::Foreign {
                    own_time.add(wait, &t.time);
                }
                role_time
                    .entry(r)
                    .or_insert_with(ShareSum::default)
                    .add(wait, &t.time);
            }
            // Alive in the window without taking the lock: counted in the shares only.
            if t.is_idle() {
                continue;
            }
            if r == Role::Profiler {
                own_read.merge(&t.read);
                // Its writes are the process's own teardown (its exit_mmap run on the
                // profiler's last reference to the address space, cause `exit`): the process's.
                write.merge(&tw);
                for (c, s) in t.writes.iter() {
                    causes.entry(c).or_default().merge(s);
                }
            } else {
                read.merge(&t.read);
                write.merge(&tw);
                downgrade.merge(&t.downgrade);
                for (c, s) in t.writes.iter() {
                    causes.entry(c).or_default().merge(s);
                }
            }
            let facts = ThreadFacts {
                lived_ns: t.lived_ns,
                start_routine: attribution
                    .start_routine(proc_id, thread, t)
                    .map(str::to_string),
            };
            threads.push((
                ThreadReport {
                    tid: thread.tid,
                    role: r,
                    comm: comm_str(&t.comm),
                    pid: matches!(r, Role::Foreign | Role::Profiler).then_some(t.tgid),
                    role_addon: origin.map(|o| o.addon.display().to_string()),
                    role_library: origin
                        .and_then(|o| o.library.as_ref())
                        .map(|l| l.display().to_string()),
                    lock: LockReport::new(
                        &tw,
                        &t.read,
                        &t.downgrade,
                        cause_reports(t.writes.iter()),
                    ),
                    blocked_by: blockers
                        .as_mut()
                        .map(|b| b.threads.remove(&thread).unwrap_or_default()),
                    time_share: ShareSum::of_thread(wait, &t.time),
                },
                facts,
            ));
        }
        // A process whose threads were only alive in the window took no lock in it: left
        // out, but for contention mode's summary, where a watched process none of whose
        // threads waited is a result (its `not-your-bottleneck` verdict rests on it).
        let watched = kind == Kind::Summary && mode == Mode::Contention;
        if threads.is_empty() && !(watched && own_time.total().is_some()) {
            continue;
        }
        threads.sort_by(|(a, _), (b, _)| {
            (b.lock.write.wait_ns.sum, b.lock.write.count, a.tid).cmp(&(
                a.lock.write.wait_ns.sum,
                a.lock.write.count,
                b.tid,
            ))
        });
        let (threads, groups, grouped_tids) = thread_groups::group(threads, LISTED_THREADS);
        let own = own_read.count + own_write.count;
        let profiler = (own > 0).then(|| ProfilerShare {
            read: Stats::new(&own_read),
            write: Stats::new(&own_write),
            share: own as f64 / (own + read.count + write.count) as f64,
        });
        processes.push(ProcessReport {
            profiler,
            cgroup: attribution.cgroup(proc_id).map(str::to_string),
            exe: attribution.exe(proc_id).map(str::to_string),
            cpus: attribution.cpus(proc_id),
            pid,
            start_ticks: proc_id.start,
            comm,
            lock: LockReport::new(
                &write,
                &read,
                &downgrade,
                cause_reports(causes.iter().map(|(c, s)| (*c, s))),
            ),
            blocked_wait_ns: blockers.as_ref().map(|b| b.charged_ns),
            blocked_by_role,
            blockers: blockers.map(|b| b.process),
            threads,
            thread_groups: (!groups.is_empty()).then_some(groups),
            grouped_tids,
            time_share: own_time.total(),
            time_share_by_role: share::by_role(&role_time),
            // The sampled stacks' parts come with the summary (`run`), not from the window.
            ..ProcessReport::default()
        });
    }
    let mut r = Report {
        kind,
        schema_version: SCHEMA_VERSION,
        mode,
        start: rfc3339(start),
        end: rfc3339(end),
        interval_s: (kind == Kind::Interval).then_some(secs),
        duration_s: (kind == Kind::Summary).then_some(secs),
        intervals: None,
        processes,
        lost,
        uncounted,
        overhead,
        stack_sample: None,
        stack_work: None,
        findings: None,
        minor_processes: None,
        trigger: None,
        show_all: false,
        summed_lines: None,
    };
    r.drop_unmeasured();
    r
}

/// A process's sampled writes by the code that asked for memory, most first.
pub fn dso_reports(o: Option<&OwnerStacks>) -> Vec<DsoReport> {
    sorted_rows(
        o.map(|o| o.dsos.iter()),
        |(d, s)| DsoReport {
            dso: d.clone(),
            write: Stats::new(s),
        },
        |a, b| (b.write.count, b.write.wait_ns.sum).cmp(&(a.write.count, a.write.wait_ns.sum)),
    )
}

/// Adds the sampled stacks' attribution to a summary.
pub fn add_stacks(r: &mut Report, stacks: &StackAttribution, sample: u32) {
    add_stacks_measured(r, stacks, sample);
    r.drop_unmeasured();
}

fn add_stacks_measured(r: &mut Report, stacks: &StackAttribution, sample: u32) {
    r.stack_sample = Some(sample);
    for p in &mut r.processes {
        let o = stacks.owner(ProcId::new(p.pid, p.start_ticks));
        let labelled = o.map(|o| o.stacks());
        let dsos = dso_reports(o);
        let mut top = sorted_rows(
            labelled.as_ref().map(|s| s.iter()),
            |(frames, agg)| StackReport {
                frames: frames.clone(),
                count: agg.count,
                wait_ns_sum: agg.wait_ns_sum,
            },
            |a, b| (b.wait_ns_sum, b.count, &a.frames).cmp(&(a.wait_ns_sum, a.count, &b.frames)),
        );
        top.truncate(TOP_STACKS);
        let js = sorted_rows(
            o.map(|o| o.js_functions.iter()),
            |(f, agg)| JsFunctionReport {
                function: f.name.clone(),
                file: f.location.clone(),
                writes: agg.count,
                wait_ns_sum: agg.wait_ns_sum,
            },
            |a, b| {
                (b.writes, b.wait_ns_sum, &a.function).cmp(&(a.writes, a.wait_ns_sum, &b.function))
            },
        );
        if o.is_some_and(|o| !o.holder_samples.is_empty()) {
            let held = o.map(|o| o.holder_stacks());
            let mut holders = sorted_rows(
                held.as_ref().map(|s| s.iter()),
                |(frames, agg)| StackReport {
                    frames: frames.clone(),
                    count: agg.count,
                    wait_ns_sum: agg.wait_ns_sum,
                },
                |a, b| {
                    (b.wait_ns_sum, b.count, &a.frames).cmp(&(a.wait_ns_sum, a.count, &b.frames))
                },
            );
            holders.truncate(TOP_STACKS);
            p.holder_stacks = Some(holders);
            p.holder_functions = Some(sorted_rows(
                o.map(|o| o.holder_js_functions.iter()),
                |((f, c), agg)| HolderFunctionReport {
                    function: f.name.clone(),
                    file: f.location.clone(),
                    cause: cause::name(*c).into(),
                    waits: agg.count,
                    wait_ns_sum: agg.wait_ns_sum,
                },
                |a, b| {
                    (b.wait_ns_sum, b.waits, &a.function).cmp(&(
                        a.wait_ns_sum,
                        a.waits,
                        &b.function,
                    ))
                },
            ));
        }
        let samples = o.map_or_else(Default::default, |o| {
            super::sampled_stacks(o, &p.threads, &p.grouped_tids)
        });
        p.stack_cuts = o
            .map(|o| super::stack_cuts(o, &p.threads, &p.grouped_tids))
            .filter(|c| !c.is_empty());
        // The flame graph's stacks, as a file's reader derives them (`derive_flames`).
        p.flame = Some(samples.folded_writes());
        p.samples = Some(samples);
        p.dsos = Some(dsos);
        p.stacks = Some(top);
        p.js_functions = Some(js);
        p.js_hint = o
            .filter(|o| o.unnamed_jit > 0 && !o.js_source)
            .map(|_| JS_HINT.into());
        p.v8_note = o.and_then(|o| o.v8_note.clone());
        p.js_frames = o.map(|o| JsFramesReport {
            v8: o.js_frames.v8,
            perf_map: o.js_frames.perf_map,
            agree: o.js_frames.agree,
            disagree: o.js_frames.disagree,
            unknown: o.js_frames.unknown,
        });
        p.stack_ends = Some(
            o.map(|o| {
                o.stack_ends
                    .iter()
                    .map(|(e, n)| (e.as_str().to_string(), *n))
                    .collect()
            })
            .unwrap_or_default(),
        );
    }
}

/// One report table of a process's sampled stacks: a row made of each of its owner's entries
/// (none for a process without samples), in the report's order.
fn sorted_rows<E, T>(
    entries: Option<impl Iterator<Item = E>>,
    row: impl FnMut(E) -> T,
    order: impl FnMut(&T, &T) -> std::cmp::Ordering,
) -> Vec<T> {
    let mut rows: Vec<T> = entries.into_iter().flatten().map(row).collect();
    rows.sort_by(order);
    rows
}
