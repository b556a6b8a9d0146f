//! One process's and one thread's records in a report: their acquisitions, causes, sampled
//! stacks and shares. Plain serde types; `build.rs` fills them.

use std::{borrow::Cow, collections::BTreeMap};

use serde::{Deserialize, Serialize};

use super::{BlockerReport, RoleBlock, RoleShare, Stats, TimeShare};
pub use crate::registry::cpus::CpuAllowance;
use crate::{
    aggregation::SideStats,
    registry::{reads::Reads, roles::Role},
};

/// Write acquisitions for one cause.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CauseReport {
    pub cause: Cow<'static, str>,
    pub write: Stats,
}

/// The acquisitions of a lock by one thread or by a process's threads: what a thread's and a
/// process's records share, written flat into each (docs/cli-and-report.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LockReport {
    pub write: Stats,
    /// Real read acquisitions (downgrades are apart).
    pub read: Stats,
    /// Write locks downgraded to read (munmap, brk, mremap, stack growth): `count`
    /// downgrades, `hold_ns` the read hold after.
    #[serde(default)]
    pub downgrade: Stats,
    /// Writes by cause: the syscall or kernel path that took the lock for write.
    #[serde(default)]
    pub causes: Vec<CauseReport>,
}

impl LockReport {
    /// Its causes ordered by total write wait, then count: the threads' and processes' order.
    pub fn new(
        write: &SideStats,
        read: &SideStats,
        downgrade: &SideStats,
        mut causes: Vec<CauseReport>,
    ) -> Self {
        causes.sort_by(|a, b| {
            (b.write.wait_ns.sum, b.write.count).cmp(&(a.write.wait_ns.sum, a.write.count))
        });
        LockReport {
            write: Stats::new(write),
            read: Stats::new(read),
            downgrade: Stats::new(downgrade),
            causes,
        }
    }
}

impl LockReport {
    /// Holds not measured (contention mode): absent rather than zero.
    pub fn drop_holds(&mut self) {
        self.write.hold_ns = None;
        self.read.hold_ns = None;
        self.downgrade.hold_ns = None;
        for c in &mut self.causes {
            c.write.hold_ns = None;
        }
    }
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

/// Sampled waits begun behind a holder whose innermost JavaScript function is this one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HolderFunctionReport {
    pub function: String,
    /// `script:line:column`, as V8 names it.
    pub file: String,
    /// What the holder held the lock for there (a write cause).
    pub cause: Cow<'static, str>,
    pub waits: u64,
    pub wait_ns_sum: u64,
}

/// One distinct sampled write stack.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StackReport {
    /// `function (file)`, innermost first.
    pub frames: Vec<String>,
    pub count: u64,
    pub wait_ns_sum: u64,
}

/// Reading, fields of the base contract (docs/cli-and-report.md) are required; those added
/// since default to absent or empty.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadReport {
    pub tid: u32,
    pub role: Role,
    #[serde(default)]
    pub comm: String,
    /// The process of a `foreign` thread.
    pub pid: Option<u32>,
    /// An `addon` thread's addon (its `*.node` file, as mapped), when its start routine was
    /// read.
    pub role_addon: Option<String>,
    /// The library an `addon` thread started in, when that is not the addon itself but a
    /// library only the addon needs (libvips behind sharp's `.node`), as mapped.
    pub role_library: Option<String>,
    /// Its acquisitions of the lock.
    #[serde(flatten)]
    pub lock: LockReport,
    /// With blockers: the threads whose holds this thread waited behind, largest first.
    pub blocked_by: Option<Vec<BlockerReport>>,
    /// Its wait for this lock as a share of its time alive and on CPU in the window.
    pub time_share: Option<TimeShare>,
}

/// `Default`: every optional part absent (what stack sampling, blockers and time add).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProcessReport {
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat` field 22): with
    /// `pid`, it names the process even across pid reuse.
    #[serde(default)]
    pub start_ticks: u64,
    pub comm: String,
    /// Its cgroup (v2 path), when known: which container or service it is.
    pub cgroup: Option<String>,
    /// Its executable, when it could be read: the path `/proc/PID/exe` links to, as the
    /// profiler reads it (docs/report-format.md); `compare --by exe` groups by it.
    pub exe: Option<String>,
    /// Why it is profiled, when a selection chose it (`--comm`, `--pid`): by which selector,
    /// and how (at exec, at a rename, running when the run began, forked).
    pub selected_by: Option<super::SelectedBy>,
    /// Its threads' acquisitions of its lock, and foreign takers' (the profiler's are apart,
    /// in `profiler`).
    #[serde(flatten)]
    pub lock: LockReport,
    /// Sampled writes by the code that asked for memory (summary, with stack sampling).
    pub dsos: Option<Vec<DsoReport>>,
    /// The agent's interval lines: one in how many of its threads' waits this process was
    /// sampled at as the interval ended, when more than `--stack-sample` (it took more than
    /// `--max-stack-rate` stacks a second). Its sampled counts are weighted to
    /// `--stack-sample` whatever it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_sample_raised: Option<u32>,
    /// The sampled write stacks that waited longest (summary, with stack sampling).
    pub stacks: Option<Vec<StackReport>>,
    /// Sampled writes by the innermost JavaScript function on their stack (summary, with
    /// stack sampling; empty unless node writes its perf map).
    pub js_functions: Option<Vec<JsFunctionReport>>,
    /// How to name JIT frames, when sampled writes went through unnamed ones and nothing
    /// could name them (no perf map, no usable V8 layout).
    pub js_hint: Option<Cow<'static, str>>,
    /// Why JavaScript frames could not be named from V8's heap (an unknown V8 layout).
    pub v8_note: Option<String>,
    /// Sampled JavaScript frames by where their names came from (summary, with stack
    /// sampling).
    pub js_frames: Option<JsFramesReport>,
    /// Sampled stacks by why they end where they do: `root` (the thread's first frame) or
    /// the reason they stop before it (summary, with stack sampling).
    pub stack_ends: Option<BTreeMap<String, u64>>,
    /// The stacks that stop before their thread's first frame, by the threads' role and name,
    /// the reason and the file they stop in, most first ([`MAX_STACK_CUTS`] rows at most;
    /// `stack_ends` has every stack): whose stacks cannot be read, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_cuts: Option<Vec<StackCutReport>>,
    /// Every distinct sampled write stack, folded (`outermost;...;innermost`) with its count,
    /// for flame graphs and the findings: made with the summary, never written (it was
    /// `samples` again, at several times its size); read back from a file of an earlier build
    /// that wrote it, else derived from `samples` ([`Report::derive_flames`]).
    #[serde(default, skip_serializing)]
    pub flame: Option<Vec<FlameStack>>,
    /// Every distinct sampled stack with its frames in parts and its labels, for pprof
    /// (summary, with stack sampling; the 5,000 that waited longest, the rest counted).
    pub samples: Option<super::SampledStacks>,
    /// Contention mode, with stack sampling: the stacks of this process's writers that
    /// sampled write waits began behind, each with the waits (`count`) and the wait
    /// (`wait_ns_sum`) charged to it while it ran that stack, most wait first (summary).
    pub holder_stacks: Option<Vec<StackReport>>,
    /// The same by the holder's innermost JavaScript function of the application.
    pub holder_functions: Option<Vec<HolderFunctionReport>>,
    /// With blockers: the threads whose holds made this process's threads wait, with the
    /// wait charged to them, largest first.
    pub blockers: Option<Vec<BlockerReport>>,
    /// With blockers: the total wait (write and read) charged to blockers, ns; the rest of
    /// `write.wait_ns.sum + read.wait_ns.sum` overlapped no logged hold (docs/report-format.md).
    pub blocked_wait_ns: Option<u64>,
    /// With blockers: "who made whom wait" by role (waiter role, holder role, holder cause).
    pub blocked_by_role: Option<Vec<RoleBlock>>,
    /// The profiler's own acquisitions of this process's lock (its reads of the process's
    /// /proc files and memory: maps, start routines, stacks), apart from `read` and
    /// `write`, which are the process's own and other processes' (`foreign`); present when
    /// there were any.
    pub profiler: Option<ProfilerShare>,
    /// What the profiler read of the process, by kind (its maps whole, its mappings asked
    /// for alone, its memory): what its acquisitions in `profiler` came from (summary; absent
    /// when nothing was read).
    pub read_by_profiler: Option<Reads>,
    /// Ordered by total write wait, then write count (the threads that matter first): the
    /// [`LISTED_THREADS`](super::thread_groups::LISTED_THREADS) that waited longest at most,
    /// but for the short-lived, which are in `thread_groups`.
    pub threads: Vec<ThreadReport>,
    /// The threads not listed one by one (short-lived ones; past the listed), grouped by role,
    /// start routine and addon with their totals, the longest wait first; absent when none is.
    pub thread_groups: Option<Vec<super::ThreadGroupReport>>,
    /// Summary: what its entry lost to the bound of a summary line per process (its parts
    /// that waited least, counted); absent when nothing was cut.
    pub trimmed: Option<super::budget::Trimmed>,
    /// Not part of the report: each grouped thread's role and name by tid, for its sampled
    /// stacks' labels.
    #[serde(skip)]
    pub grouped_tids: std::collections::HashMap<u32, (Role, String)>,
    /// The process's own threads' wait for its lock as a share of their time (foreign
    /// takers left out), idle threads of an interval included.
    pub time_share: Option<TimeShare>,
    /// The same per thread role (foreign takers as the role `foreign`).
    pub time_share_by_role: Option<Vec<RoleShare>>,
    /// The CPUs it may use, when they could be read: what its time share's CPU time is
    /// measured against in a finding's throughput or latency (docs/findings.md).
    pub cpus: Option<CpuAllowance>,
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

/// Rows of a process's `stack_cuts` at most.
pub const MAX_STACK_CUTS: usize = 20;

/// Sampled stacks of threads of one role and name that stop, for one reason, in one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackCutReport {
    pub role: Role,
    pub comm: String,
    /// A `stack_ends` key other than `root`.
    pub end: String,
    /// The file of the outermost frame reached (`[anonymous]`: code in no file, e.g. JIT).
    pub stops_in: String,
    pub stacks: u64,
}
