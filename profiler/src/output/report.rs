//! The report model (JSON contract, `schema_version` 1, see docs/report-format.md), built by
//! a pure function of a window of activity and its attribution.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use profiler_common::cause;
use serde::{Deserialize, Deserializer, Serialize, de};

use crate::{
    aggregation::Attribution,
    aggregation::{SideStats, Window},
    kernel::collector::ProgramStats,
    registry::roles::{Role, comm_str},
    registry::stacks::StackAttribution,
    vocab::ids::ProcId,
};

pub use super::blockers::{BlockerReport, RoleBlock};
use super::blockers::{by_role, lock_blockers};
use super::share::ShareSum;
pub use super::share::{RoleShare, TimeShare};
pub use super::stats::{Dist, Stats};

/// The report format's major version. Fields are only ever added within one (readers ignore
/// those they do not know, and take those they know but a file lacks as absent); a file of
/// another version is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// `schema_version`, which must be this build's.
pub fn schema_version<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u64::deserialize(d)?;
    if v != u64::from(SCHEMA_VERSION) {
        return Err(de::Error::custom(unsupported_version(v)));
    }
    Ok(SCHEMA_VERSION)
}

/// What is said of a file of another major version.
pub fn unsupported_version(v: u64) -> String {
    format!(
        "version {v} of the report format is not supported: this build reads version {SCHEMA_VERSION}"
    )
}

/// Write acquisitions for one cause.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CauseReport {
    pub cause: Cow<'static, str>,
    pub write: Stats,
}

/// Causes ordered by total write wait, then count.
fn cause_reports<'a>(causes: impl Iterator<Item = (u32, &'a SideStats)>) -> Vec<CauseReport> {
    let mut v: Vec<CauseReport> = causes
        .filter(|(_, s)| !s.is_empty())
        .map(|(c, s)| CauseReport {
            cause: cause::name(c).into(),
            write: Stats::new(s),
        })
        .collect();
    v.sort_by(|a, b| {
        (b.write.wait_ns.sum, b.write.count).cmp(&(a.write.wait_ns.sum, a.write.count))
    });
    v
}

/// Sampled writes charged to one DSO.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DsoReport {
    pub dso: String,
    pub write: Stats,
}

/// Sampled writes whose innermost JavaScript function is this one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JsFunctionReport {
    pub function: String,
    /// `script:line:column`, as V8 names it.
    pub file: String,
    pub writes: u64,
    pub wait_ns_sum: u64,
}

/// Sampled JavaScript frames by the source of their names (weighted by samples).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct JsFramesReport {
    /// Named from V8's heap only.
    pub v8: u64,
    /// Named from the perf map only.
    pub perf_map: u64,
    /// Named by both, alike.
    pub agree: u64,
    /// Named by both, differently.
    pub disagree: u64,
    /// V8 frames whose function could not be told (`[js unknown]`).
    pub unknown: u64,
}

/// One folded stack of a flame graph.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlameStack {
    /// Frames outermost first, `;`-separated (a `;` in a name is written `:`).
    pub stack: String,
    pub count: u64,
}

/// How many folded stacks a summary keeps per process.
const FLAME_STACKS: usize = 2000;

/// Said in a summary whose sampled writes went through JIT code no perf map named.
pub const JS_HINT: &str = "JavaScript frames are unnamed ([jit]): start node with \
     --perf-basic-prof-only-functions (or --perf-basic-prof) to name them, and \
     --interpreted-frames-native-stack for functions not compiled yet";

/// One distinct sampled write stack.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StackReport {
    /// `function (file)`, innermost first.
    pub frames: Vec<String>,
    pub count: u64,
    pub wait_ns_sum: u64,
}

/// How many stacks each process's summary lists.
const TOP_STACKS: usize = 10;

/// Reading, fields of the base contract (docs/cli-and-report.md) are required; those added
/// since default to absent or empty.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadReport {
    pub tid: u32,
    pub role: Role,
    #[serde(default)]
    pub comm: String,
    /// The process of a `foreign` thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// An `addon` thread's addon (its `*.node` file, as mapped), when its start routine was
    /// read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_addon: Option<String>,
    /// The library an `addon` thread started in, when that is not the addon itself but a
    /// library only the addon needs (libvips behind sharp's `.node`), as mapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_library: Option<String>,
    pub write: Stats,
    /// Real read acquisitions (downgrades are apart).
    pub read: Stats,
    /// Write locks downgraded to read: `count` downgrades, `hold_ns` the read hold after.
    #[serde(default)]
    pub downgrade: Stats,
    /// This thread's writes by cause.
    #[serde(default)]
    pub causes: Vec<CauseReport>,
    /// With blockers: the threads whose holds this thread waited behind, largest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<Vec<BlockerReport>>,
    /// Its wait for this lock as a share of its time alive and on CPU in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_share: Option<TimeShare>,
}

/// `Default`: every optional part absent (what stack sampling, blockers and time add).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProcessReport {
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat` field 22): with
    /// `pid`, it names the process even across pid reuse.
    #[serde(default)]
    pub start_ticks: u64,
    pub comm: String,
    /// Its cgroup (v2 path), when known: which container or service it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    pub write: Stats,
    /// Real read acquisitions (downgrades are apart).
    pub read: Stats,
    /// Write locks downgraded to read (munmap, brk, mremap, stack growth).
    #[serde(default)]
    pub downgrade: Stats,
    /// Writes by cause: the syscall or kernel path that took the lock for write.
    #[serde(default)]
    pub causes: Vec<CauseReport>,
    /// Sampled writes by the code that asked for memory (summary, with stack sampling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dsos: Option<Vec<DsoReport>>,
    /// The sampled write stacks that waited longest (summary, with stack sampling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<StackReport>>,
    /// Sampled writes by the innermost JavaScript function on their stack (summary, with
    /// stack sampling; empty unless node writes its perf map).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub js_functions: Option<Vec<JsFunctionReport>>,
    /// How to name JIT frames, when sampled writes went through unnamed ones and nothing
    /// could name them (no perf map, no usable V8 layout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub js_hint: Option<Cow<'static, str>>,
    /// Why JavaScript frames could not be named from V8's heap (an unknown V8 layout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v8_note: Option<String>,
    /// Sampled JavaScript frames by where their names came from (summary, with stack
    /// sampling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub js_frames: Option<JsFramesReport>,
    /// Sampled stacks by why they end where they do: `root` (the thread's first frame) or
    /// the reason they stop before it (summary, with stack sampling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_ends: Option<BTreeMap<String, u64>>,
    /// Every distinct sampled write stack, folded (`outermost;...;innermost`) with its count,
    /// for flame graphs (summary, with stack sampling; the most sampled 2,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flame: Option<Vec<FlameStack>>,
    /// With blockers: the threads whose holds made this process's threads wait, with the
    /// wait charged to them, largest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blockers: Option<Vec<BlockerReport>>,
    /// With blockers: the total wait (write and read) charged to blockers, ns; the rest of
    /// `write.wait_ns.sum + read.wait_ns.sum` overlapped no logged hold (docs/report-format.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_wait_ns: Option<u64>,
    /// With blockers: "who made whom wait" by role (waiter role, holder role, holder cause).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by_role: Option<Vec<RoleBlock>>,
    /// The profiler's own acquisitions of this process's lock (its reads of the process's
    /// /proc files and memory: maps, start routines, stacks), apart from `read` and
    /// `write`, which are the process's own and other processes' (`foreign`); present when
    /// there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiler: Option<ProfilerShare>,
    /// Ordered by total write wait, then write count (the threads that matter first).
    pub threads: Vec<ThreadReport>,
    /// The process's own threads' wait for its lock as a share of their time (foreign
    /// takers left out), idle threads of an interval included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_share: Option<TimeShare>,
    /// The same per thread role (foreign takers as the role `foreign`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_share_by_role: Option<Vec<RoleShare>>,
}

/// The profiler's own part of a process's lock acquisitions.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProfilerShare {
    pub read: Stats,
    pub write: Stats,
    /// Its acquisitions over all acquisitions of the lock (its own included).
    pub share: f64,
}

/// The profiler's own work on sampled stacks (in userspace, off the locked path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackWork {
    /// Sampled stacks unwound and named.
    pub stacks: u64,
    /// Mean time per stack: unwinding, naming its frames, reading V8's heap, microseconds.
    pub us_per_stack: f64,
    /// Of which reading V8's heap.
    pub v8_us_per_stack: f64,
}

/// What the profile does not contain, by reason (docs/report-format.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Acquisitions lost for any reason but `map_full`: the sum of the reasons below it.
    pub events: u64,
    /// Acquisitions whose statistics could not be stored because the map was full
    /// (`--max-threads`).
    pub map_full: u64,
    /// Sampled stacks dropped because the ring buffer was full (raise --stack-sample).
    #[serde(default)]
    pub stacks: u64,
    /// A third mm lock pending or held by one thread at once (two are tracked).
    #[serde(default)]
    pub nested: u64,
    /// Per-thread state could not be allocated.
    #[serde(default)]
    pub no_state: u64,
    /// A thread's pending ring was full while another context flushed it.
    #[serde(default)]
    pub ring_full: u64,
    /// Pending acquisitions of a freed thread whose state could not be reached.
    #[serde(default)]
    pub exit_flush: u64,
    /// Threads that had begun exiting when the run ended and were not yet freed, so their
    /// last pending acquisitions (at most 32 each) could not be flushed.
    #[serde(default)]
    pub exit_pending: u64,
}

/// `add`, for structs of counters: field by field, saturating (they may come from files).
/// Every field is named in a pattern, so one added to the struct must be added here too.
macro_rules! add_counters {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Adds another window's counts.
            pub fn add(&mut self, o: &$t) {
                let $t { $($f),* } = *o;
                $(self.$f = self.$f.saturating_add($f);)*
            }
        }
    };
}

add_counters!(Lost {
    events,
    map_full,
    stacks,
    nested,
    no_state,
    ring_full,
    exit_flush,
    exit_pending,
});

impl Lost {
    pub fn with_total(mut self) -> Self {
        self.events =
            self.nested + self.no_state + self.ring_full + self.exit_flush + self.exit_pending;
        self
    }
}

/// What the profiler did that is worth knowing but loses nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Uncounted {
    /// A child's new mm locked inside fork's dup_mmap: not charged to the parent (the lock
    /// is the child's, uncontended, and held within the parent's fork hold).
    pub fork_child: u64,
    /// Threads' pending rings that filled up (trylocks only, no blocking acquire between)
    /// and were flushed at a release, with the lock held: kept exact at a cost.
    pub flushed_under_lock: u64,
    /// Blockers only (not acquisitions): holds that had left their lock's log of the last
    /// 16 when the wait they made was charged; that part of the wait is not attributed.
    pub blockers_overrun: u64,
    /// Blockers only: contended waits not charged because the thread's previous one was
    /// still pending (it held a lock in between), or the blockers map was full.
    pub blockers_dropped: u64,
    /// Downgrades and failed trylocks (not acquisitions, so not in `lost`) whose statistics
    /// could not be stored because the map was full (`--max-threads`).
    pub not_acquisitions_map_full: u64,
}

add_counters!(Uncounted {
    fork_child,
    flushed_under_lock,
    blockers_overrun,
    blockers_dropped,
    not_acquisitions_map_full,
});

/// One eBPF program's share of [`Overhead`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramOverhead {
    pub name: Cow<'static, str>,
    pub events: u64,
    pub ns_per_event: f64,
}

/// The profiler's own in-kernel cost over a window, from the kernel's BPF statistics.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overhead {
    /// Mean BPF run time per tracepoint hit, over all programs.
    pub bpf_ns_per_event: f64,
    /// Tracepoint hits handled (every mmap_lock operation on the machine, filtered or not).
    pub events: u64,
    /// BPF run time as a share of one CPU over the window, in percent.
    pub bpf_cpu_pct: f64,
    pub programs: Vec<ProgramOverhead>,
    /// The summary's only: where attach time went (each step, and each program's
    /// verification with the instructions the verifier processed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<crate::kernel::load::LoadReport>,
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

impl Overhead {
    /// From two cumulative readings of the programs' statistics, `wall` apart.
    pub fn between(cur: &[ProgramStats], prev: &[ProgramStats], wall: Duration) -> Overhead {
        let mut programs = Vec::new();
        let (mut events, mut ns) = (0u64, 0u128);
        for c in cur {
            let p = prev.iter().find(|p| p.name == c.name);
            let n = c.run_count - p.map_or(0, |p| p.run_count);
            let t = c
                .run_time
                .saturating_sub(p.map_or(Duration::ZERO, |p| p.run_time));
            events += n;
            ns += t.as_nanos();
            programs.push(ProgramOverhead {
                name: c.name.into(),
                events: n,
                ns_per_event: if n == 0 {
                    0.0
                } else {
                    round(t.as_nanos() as f64 / n as f64, 1)
                },
            });
        }
        Overhead {
            bpf_ns_per_event: if events == 0 {
                0.0
            } else {
                round(ns as f64 / events as f64, 1)
            },
            events,
            bpf_cpu_pct: if wall.is_zero() {
                0.0
            } else {
                round(ns as f64 / wall.as_nanos() as f64 * 100.0, 3)
            },
            programs,
            load: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Interval,
    Summary,
}

/// One line of the report. Read back (`report`, `compare`), fields of the base contract
/// (docs/cli-and-report.md) are required and every later one optional (absent or empty when a
/// file lacks it); fields a file has that this build does not know are ignored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub kind: Kind,
    #[serde(deserialize_with = "schema_version")]
    pub schema_version: u32,
    pub start: String,
    pub end: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    pub processes: Vec<ProcessReport>,
    pub lost: Lost,
    #[serde(default)]
    pub uncounted: Uncounted,
    /// Present when the kernel's BPF statistics are on (`--bpf-stats`, or
    /// `sysctl kernel.bpf_stats_enabled=1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// With stack sampling: one in how many writes per thread had its stack taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_sample: Option<u32>,
    /// Summary, with stack sampling: what the sampled stacks cost the profiler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_work: Option<StackWork>,
    /// Summary: the patterns recognised in it, what they cost and what to change
    /// (docs/findings.md). Never read back: derived from the rest of the summary, they are
    /// recomputed by whatever reads a file (`report`, `compare`), with this build's patterns.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub findings: Option<Vec<crate::output::findings::Finding>>,
}

impl Report {
    /// A summary of nothing, for tests of what is built around reports.
    #[cfg(test)]
    pub fn empty_for_tests() -> Report {
        Report {
            kind: Kind::Summary,
            schema_version: SCHEMA_VERSION,
            start: String::new(),
            end: String::new(),
            interval_s: None,
            duration_s: Some(0.0),
            processes: Vec::new(),
            lost: Lost::default(),
            uncounted: Uncounted::default(),
            overhead: None,
            stack_sample: None,
            stack_work: None,
            findings: None,
        }
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// What a report covers besides the activity: its kind and time span, what was lost or left
/// uncounted, and the profiler's own cost.
pub struct Meta {
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub lost: Lost,
    pub uncounted: Uncounted,
    pub overhead: Option<Overhead>,
}

/// The report of a window: a pure function of the activity, its attribution (names and
/// roles, resolved by the registry beforehand) and the report's metadata.
pub fn build(window: &Window, attribution: &Attribution, meta: Meta) -> Report {
    let Meta {
        kind,
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
            threads.push(ThreadReport {
                tid: thread.tid,
                role: r,
                comm: comm_str(&t.comm),
                pid: matches!(r, Role::Foreign | Role::Profiler).then_some(t.tgid),
                role_addon: origin.map(|o| o.addon.display().to_string()),
                role_library: origin
                    .and_then(|o| o.library.as_ref())
                    .map(|l| l.display().to_string()),
                write: Stats::new(&tw),
                read: Stats::new(&t.read),
                downgrade: Stats::new(&t.downgrade),
                causes: cause_reports(t.writes.iter()),
                blocked_by: blockers
                    .as_mut()
                    .map(|b| b.threads.remove(&thread).unwrap_or_default()),
                time_share: ShareSum::of_thread(wait, &t.time),
            });
        }
        // A process whose threads were only alive in the window took no lock in it.
        if threads.is_empty() {
            continue;
        }
        threads.sort_by(|a, b| {
            (b.write.wait_ns.sum, b.write.count, a.tid).cmp(&(
                a.write.wait_ns.sum,
                a.write.count,
                b.tid,
            ))
        });
        let own = own_read.count + own_write.count;
        let profiler = (own > 0).then(|| ProfilerShare {
            read: Stats::new(&own_read),
            write: Stats::new(&own_write),
            share: own as f64 / (own + read.count + write.count) as f64,
        });
        processes.push(ProcessReport {
            profiler,
            cgroup: attribution.cgroup(proc_id).map(str::to_string),
            pid,
            start_ticks: proc_id.start,
            comm,
            write: Stats::new(&write),
            read: Stats::new(&read),
            downgrade: Stats::new(&downgrade),
            causes: cause_reports(causes.iter().map(|(c, s)| (*c, s))),
            blocked_wait_ns: blockers.as_ref().map(|b| b.charged_ns),
            blocked_by_role,
            blockers: blockers.map(|b| b.process),
            threads,
            time_share: own_time.total(),
            time_share_by_role: super::share::by_role(&role_time),
            // The sampled stacks' parts come with the summary (`run`), not from the window.
            ..ProcessReport::default()
        });
    }
    Report {
        kind,
        schema_version: SCHEMA_VERSION,
        start: rfc3339(start),
        end: rfc3339(end),
        interval_s: (kind == Kind::Interval).then_some(secs),
        duration_s: (kind == Kind::Summary).then_some(secs),
        processes,
        lost,
        uncounted,
        overhead,
        stack_sample: None,
        stack_work: None,
        findings: None,
    }
}

/// Adds the sampled stacks' attribution to a summary.
pub fn add_stacks(r: &mut Report, stacks: &StackAttribution, sample: u32) {
    r.stack_sample = Some(sample);
    for p in &mut r.processes {
        let o = stacks.owner(ProcId::new(p.pid, p.start_ticks));
        let mut dsos: Vec<DsoReport> = o
            .map(|o| {
                o.dsos
                    .iter()
                    .map(|(d, s)| DsoReport {
                        dso: d.clone(),
                        write: Stats::new(s),
                    })
                    .collect()
            })
            .unwrap_or_default();
        dsos.sort_by(|a, b| {
            (b.write.count, b.write.wait_ns.sum).cmp(&(a.write.count, a.write.wait_ns.sum))
        });
        let mut top: Vec<StackReport> = o
            .map(|o| {
                o.stacks
                    .iter()
                    .map(|(frames, agg)| StackReport {
                        frames: frames.clone(),
                        count: agg.count,
                        wait_ns_sum: agg.wait_ns_sum,
                    })
                    .collect()
            })
            .unwrap_or_default();
        top.sort_by(|a, b| {
            (b.wait_ns_sum, b.count, &a.frames).cmp(&(a.wait_ns_sum, a.count, &b.frames))
        });
        top.truncate(TOP_STACKS);
        let mut js: Vec<JsFunctionReport> = o
            .map(|o| {
                o.js_functions
                    .iter()
                    .map(|(f, agg)| JsFunctionReport {
                        function: f.name.clone(),
                        file: f.location.clone(),
                        writes: agg.count,
                        wait_ns_sum: agg.wait_ns_sum,
                    })
                    .collect()
            })
            .unwrap_or_default();
        js.sort_by(|a, b| {
            (b.writes, b.wait_ns_sum, &a.function).cmp(&(a.writes, a.wait_ns_sum, &b.function))
        });
        let mut flame: Vec<FlameStack> = o
            .map(|o| {
                o.stacks
                    .iter()
                    .map(|(frames, agg)| FlameStack {
                        stack: frames
                            .iter()
                            .rev()
                            .map(|f| f.replace(';', ":"))
                            .collect::<Vec<_>>()
                            .join(";"),
                        count: agg.count,
                    })
                    .collect()
            })
            .unwrap_or_default();
        flame.sort_by(|a, b| (b.count, &a.stack).cmp(&(a.count, &b.stack)));
        flame.truncate(FLAME_STACKS);
        p.flame = Some(flame);
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

/// One JSON line (without the newline).
#[cfg(test)]
pub fn to_json_line(r: &Report) -> String {
    serde_json::to_string(r).expect("reports contain only serialisable values")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregation::{ThreadDelta, Window};
    use crate::output::text::{fmt_ns, histogram_lines, to_text};
    use profiler_common::{COMM_LEN, StatsKey};

    fn window() -> Window {
        let mut w = Window::default();
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"node");
        for (tid, tgid, n, wait) in [(10, 10, 2, 400), (11, 10, 5, 9000), (77, 77, 1, 50)] {
            let mut s = SideStats {
                count: n,
                ..Default::default()
            };
            s.wait.sum = wait * n;
            s.wait.max = wait;
            s.wait.add(profiler_common::bucket_index(wait), n);
            s.hold.add(1, n);
            s.hold.sum = n;
            s.hold.max = 1;
            // Thread 11 splits its writes between two causes.
            let kinds: &[(u32, u64)] = if tid == 11 {
                &[(cause::MPROTECT, 3), (cause::MUNMAP, 2)]
            } else {
                &[(cause::MMAP, n)]
            };
            for &(kind, k) in kinds {
                let mut part = s.clone();
                part.count = k;
                part.wait = Default::default();
                part.wait.sum = wait * k;
                part.wait.max = wait;
                part.wait.add(profiler_common::bucket_index(wait), k);
                part.hold = Default::default();
                part.hold.add(1, k);
                part.hold.sum = k;
                part.hold.max = 1;
                w.add(&ThreadDelta {
                    key: StatsKey {
                        owner: 10,
                        tid,
                        kind,
                        _pad: 0,
                        owner_start: 0,
                        tid_start: 0,
                    },
                    tgid,
                    comm,
                    fsbase: 0,
                    stats: part,
                });
            }
        }
        w
    }

    /// Builds as a run would, with thread 10 the main thread, 11 an `other` and 77 foreign.
    fn test_build(kind: Kind, w: &Window, start: SystemTime, end: SystemTime) -> Report {
        let p = ProcId::new(10, 0);
        let t = |tid| crate::vocab::ids::ThreadId::new(tid, 0);
        let a = Attribution::with(
            &[(p, "node")],
            &[
                (p, t(10), Role::Main),
                (p, t(11), Role::Other),
                (p, t(77), Role::Foreign),
            ],
        );
        build(
            w,
            &a,
            Meta {
                kind,
                start,
                end,
                lost: Lost::default(),
                uncounted: Uncounted::default(),
                overhead: None,
            },
        )
    }

    #[test]
    fn summary_json_has_the_contract_fields() {
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let t1 = t0 + std::time::Duration::from_millis(2500);
        let r = test_build(Kind::Summary, &window(), t0, t1);
        let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
        assert_eq!(v["type"], "summary");
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["duration_s"], 2.5);
        assert!(v.get("interval_s").is_none());
        assert_eq!(v["start"], "2023-11-14T22:13:20.000Z");
        let p = &v["processes"][0];
        assert_eq!(p["pid"], 10);
        assert_eq!(p["write"]["count"], 8);
        assert_eq!(p["write"]["wait_ns"]["sum"], 400 * 2 + 9000 * 5 + 50);
        assert_eq!(p["write"]["wait_ns"]["max"], 9000);
        // Threads ordered by write wait: the worker-ish thread 11 first.
        let th = p["threads"].as_array().unwrap();
        assert_eq!(th[0]["tid"], 11);
        assert_eq!(th[0]["role"], "other");
        let main = th.iter().find(|t| t["tid"] == 10).unwrap();
        assert_eq!(main["role"], "main");
        let foreign = th.iter().find(|t| t["tid"] == 77).unwrap();
        assert_eq!(foreign["role"], "foreign");
        assert_eq!(foreign["pid"], 77);
        assert_eq!(v["lost"]["events"], 0);
        // Causes: per process, ordered by total wait, summing to the write count.
        let causes = p["causes"].as_array().unwrap();
        assert_eq!(causes[0]["cause"], "mprotect");
        assert_eq!(causes[0]["write"]["count"], 3);
        let total: u64 = causes
            .iter()
            .map(|c| c["write"]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 8);
        assert_eq!(th[0]["causes"].as_array().unwrap().len(), 2);
        // Buckets: [upper bound, count], non-empty only.
        let buckets = p["write"]["wait_ns"]["buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), 3);
        assert!(buckets.iter().all(|b| b[1].as_u64().unwrap() > 0));
    }

    #[test]
    fn time_shares_per_thread_process_and_role_count_idle_threads_and_leave_foreign_out() {
        let mut w = window();
        let p = ProcId::new(10, 0);
        let t = |tid| crate::vocab::ids::ThreadId::new(tid, 0);
        let set = |w: &mut Window, tid, alive_ns, cpu_ns| {
            w.processes
                .get_mut(&p)
                .unwrap()
                .get_mut(&t(tid))
                .unwrap()
                .time = crate::aggregation::ThreadTime { alive_ns, cpu_ns };
        };
        // 10 (main) waited 800 ns of 8000; 11 (other) 45000 of 90000, 30000 on CPU.
        set(&mut w, 10, 8_000, None);
        set(&mut w, 11, 90_000, Some(30_000));
        set(&mut w, 77, 1_000, None);
        // A thread alive but idle in the window (role other: the attribution does not know it).
        let mut idle = crate::aggregation::Window::default();
        idle.processes
            .entry(p)
            .or_default()
            .insert(t(12), w.processes[&p][&t(10)].clone());
        let i = idle.processes.get_mut(&p).unwrap().get_mut(&t(12)).unwrap();
        (i.read, i.writes, i.downgrade) = Default::default();
        i.time.alive_ns = 2_000;
        w.add_thread(p, t(12), &idle.processes[&p][&t(12)].clone());
        let t0 = SystemTime::now();
        let r = test_build(Kind::Summary, &w, t0, t0);
        let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
        let proc = &v["processes"][0];
        assert!(
            proc["threads"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["tid"] != 12),
            "an idle thread is not listed"
        );
        let th = |tid| {
            proc["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["tid"] == tid)
                .unwrap()
        };
        assert_eq!(th(11)["time_share"]["wall"], 0.5);
        assert_eq!(th(11)["time_share"]["cpu"], 1.5);
        assert!(th(10)["time_share"].get("cpu").is_none());
        // The process: its own threads (10, 11 and the idle 12), not the foreign 77.
        let all = &proc["time_share"];
        assert_eq!(all["alive_ns"], 100_000);
        assert_eq!(all["wait_ns"], 45_800);
        assert_eq!(all["threads"], 3);
        let role = |r: &str| {
            proc["time_share_by_role"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["role"] == r)
                .unwrap()
                .clone()
        };
        assert_eq!(role("main")["wall"], 0.1);
        assert_eq!(role("other")["alive_ns"], 92_000);
        assert_eq!(role("foreign")["wait_ns"], 50);
        // Text: the process's and the roles' shares.
        let text = to_text(&r);
        assert!(
            text.contains("its threads spent 45.8% of their time"),
            "{text}"
        );
        assert!(text.contains("other threads spent 48.9% of their time waiting for mmap_lock (150.0% of their CPU time)"), "{text}");
    }

    #[test]
    fn interval_json_carries_interval_s() {
        let t0 = SystemTime::now();
        let r = test_build(
            Kind::Interval,
            &Window::default(),
            t0,
            t0 + std::time::Duration::from_secs(1),
        );
        let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
        assert_eq!(v["type"], "interval");
        assert_eq!(v["interval_s"], 1.0);
        assert!(v.get("duration_s").is_none());
        assert_eq!(v["processes"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn text_shows_tables_threads_and_histograms() {
        let t0 = SystemTime::now();
        let r = test_build(
            Kind::Summary,
            &window(),
            t0,
            t0 + std::time::Duration::from_secs(1),
        );
        let text = to_text(&r);
        assert!(text.contains("process 10"), "{text}");
        assert!(text.contains("write wait (log2 buckets)"), "{text}");
        assert!(text.contains("foreign"), "{text}");
        assert!(text.contains('█'), "{text}");
    }

    #[test]
    fn histograms_share_rows_and_give_zero_waits_their_own() {
        let d = |buckets: Vec<(u64, u64)>| Dist {
            sum: 0,
            max: 0,
            mean: 0.0,
            p50: 0,
            p90: 0,
            p99: 0,
            p999: 0,
            buckets,
        };
        let a = d(vec![(1, 5), (128, 10)]);
        let b = d(vec![(512, 3)]);
        let cols = histogram_lines(&[&a, &b]);
        // rows: 0, <128ns, <256ns, <512ns
        assert_eq!(cols[0].len(), 4);
        assert_eq!(cols[1].len(), 4);
        assert!(cols[0][0].trim_start().starts_with('0') && cols[0][0].ends_with(" 5"));
        assert!(cols[0][1].contains("<128ns") && cols[0][1].ends_with(" 10"));
        assert!(cols[1][3].contains("<512ns") && cols[1][3].ends_with(" 3"));
        assert!(cols[1][0].ends_with(" 0"));
        assert!(histogram_lines(&[&d(vec![])])[0].is_empty());
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_ns(850), "850ns");
        assert_eq!(fmt_ns(12_345), "12.3us");
        assert_eq!(fmt_ns(4_560_000), "4.56ms");
        assert_eq!(fmt_ns(1_200_000_000), "1.20s");
    }
}

#[cfg(test)]
mod overhead_tests {
    use super::*;

    #[test]
    fn overhead_is_the_difference_of_two_readings() {
        let p = |name, run_count, ns| ProgramStats {
            name,
            run_count,
            run_time: Duration::from_nanos(ns),
        };
        let prev = [p("a", 100, 10_000), p("b", 50, 5_000)];
        let cur = [p("a", 1100, 60_000), p("b", 1050, 105_000)];
        let o = Overhead::between(&cur, &prev, Duration::from_millis(1));
        assert_eq!(o.events, 2000);
        assert_eq!(o.bpf_ns_per_event, 75.0);
        // 150 us of BPF in 1 ms of wall time.
        assert_eq!(o.bpf_cpu_pct, 15.0);
        assert_eq!(o.programs[0].ns_per_event, 50.0);
        assert_eq!(o.programs[1].ns_per_event, 100.0);
        let none = Overhead::between(&cur, &cur, Duration::ZERO);
        assert_eq!(
            (none.events, none.bpf_ns_per_event, none.bpf_cpu_pct),
            (0, 0.0, 0.0)
        );
    }
}
