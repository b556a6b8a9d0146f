//! The patterns, as data: each with its id (its section in docs/findings.md, which gives
//! its sources), its advice, the study scenarios that measure that advice, and the test that
//! recognises it in one process of a summary.

use super::{Finding, detect::*, holders::*, mechanism::Mechanism, writers::of_mechanism};
use crate::{
    output::report::{ProcessReport, Report},
    registry::roles::Role,
};

pub struct Pattern {
    pub id: &'static str,
    /// What to change, most effective first (a detector may put a more specific line first).
    pub advice: &'static [&'static str],
    /// The study's scenarios that measure the advice (`mmaplock-prof study`).
    pub study: &'static [&'static str],
    /// Reported at `info` severity in a process whose verdict is "not your bottleneck" (what
    /// is there, rather than what to change).
    pub always: bool,
    pub detect: fn(&Report, &ProcessReport) -> Option<Finding>,
}

pub const NOT_A_BOTTLENECK: &str = "not-your-bottleneck";

pub const PATTERNS: &[Pattern] = &[
    Pattern {
        id: NOT_A_BOTTLENECK,
        advice: &[
            "Look elsewhere (a CPU profile, I/O): removing all of this wait would give back at most this share of the threads' time",
        ],
        study: &[],
        always: true,
        detect: not_a_bottleneck,
    },
    Pattern {
        id: "thread-stacks",
        advice: &[],
        study: &[],
        always: true,
        detect: thread_stacks,
    },
    Pattern {
        id: "mmap-threshold",
        advice: &[],
        study: &["reuse", "slab", "pool-256k", "finalization-pool"],
        always: true,
        detect: large_allocations,
    },
    Pattern {
        id: "arena-growth",
        advice: &[],
        study: &["arena-1", "arena-2", "jemalloc", "reuse"],
        always: true,
        detect: arenas,
    },
    Pattern {
        id: "v8-heap",
        advice: &[],
        study: &[],
        always: true,
        detect: v8_heap,
    },
    Pattern {
        id: "wasm-memory",
        advice: &[],
        study: &[],
        always: true,
        detect: wasm_memory,
    },
    Pattern {
        id: "file-mappings",
        advice: &[],
        study: &[],
        always: true,
        detect: file_mappings,
    },
    Pattern {
        id: "own-mappings",
        advice: &[],
        study: &[],
        always: true,
        detect: own_mappings,
    },
    Pattern {
        id: "fault-reads",
        advice: &[
            "Touch (or fill) buffers before the hot path and reuse them: the first write to a fresh page is a page fault that holds the lock for read while the kernel copies into it",
            "Copy in smaller pieces (read a large file in chunks into a reused Buffer, or stream it): shorter read holds, shorter waits for the writers behind them",
        ],
        study: &["reuse", "slab"],
        always: false,
        detect: fault_reads,
    },
    Pattern {
        id: "long-holds",
        advice: &[
            "Make that call shorter or rarer: fork or spawn from a small helper process instead of a large one; change the protection of, unmap or advise large regions once or in smaller pieces; populate memory before other threads start",
        ],
        study: &[],
        always: false,
        detect: long_holds,
    },
    Pattern {
        id: "addon-threads",
        advice: &[
            "The addon maps and unmaps memory itself: have it reuse its buffers or allocate larger blocks at once, and tell its maintainers",
            "If it cannot change, run it in a process of its own (child_process): its writes then take that process's lock",
        ],
        study: &[],
        always: true,
        detect: addon_threads,
    },
    Pattern {
        id: "v8-gc-unmap",
        advice: &[
            "Fewer short-lived large Buffers and ArrayBuffers (reuse or pool them): V8's platform threads unmap each one's memory when the garbage collector frees it",
        ],
        study: &["reuse", "pool-256k"],
        always: false,
        detect: v8_gc_unmap,
    },
    Pattern {
        id: "profiler-presence",
        advice: &[
            "This is the profiler itself reading the process's /proc files (maps, for thread roles and stacks): it is gone when the profiler is; sample fewer stacks (--stack-sample 0) to read them less",
        ],
        study: &[],
        always: true,
        detect: profiler_presence,
    },
];

fn thread_stacks(s: &Report, p: &ProcessReport) -> Option<Finding> {
    of_mechanism(s, p, Mechanism::Threads)
}

/// With sampled stacks, the chain's large allocations; without, the writes of the threads
/// that run JavaScript (`mmap_threshold`).
fn large_allocations(s: &Report, p: &ProcessReport) -> Option<Finding> {
    if super::view::has_stacks(p) {
        of_mechanism(s, p, Mechanism::LargeAlloc)
    } else if super::listing::waited_materially(p) {
        mmap_threshold(s, p)
    } else {
        None
    }
}

/// With sampled stacks, the chain's arenas; without, the non-main threads' mprotects
/// (`arena_growth`).
fn arenas(s: &Report, p: &ProcessReport) -> Option<Finding> {
    if super::view::has_stacks(p) {
        of_mechanism(s, p, Mechanism::Arena)
    } else if super::listing::waited_materially(p) {
        arena_growth(s, p)
    } else {
        None
    }
}

fn v8_heap(s: &Report, p: &ProcessReport) -> Option<Finding> {
    of_mechanism(s, p, Mechanism::V8Heap)
}

fn wasm_memory(s: &Report, p: &ProcessReport) -> Option<Finding> {
    of_mechanism(s, p, Mechanism::Wasm)
}

fn file_mappings(s: &Report, p: &ProcessReport) -> Option<Finding> {
    of_mechanism(s, p, Mechanism::FileMap)
}

fn own_mappings(s: &Report, p: &ProcessReport) -> Option<Finding> {
    of_mechanism(s, p, Mechanism::Own)
}

/// A pattern must explain at least this share of its process's wait to be reported.
pub(super) const MIN_SHARE_OF_WAIT: f64 = 0.10;

// The least evidence each pattern rests on (docs/findings.md, "Minimum evidence"): no
// finding rests on one sample.

/// Writes (of the pattern's cause and roles; the process's for `not-your-bottleneck` and
/// `fault-reads`; the addon's threads', or its sampled writes, for `addon-threads`).
pub(super) const MIN_WRITES: u64 = 20;
/// Sampled stacks of the syscall before they tell whose code it is (`arena-growth`,
/// `mmap-threshold`): a majority of malloc's among fewer says nothing.
pub(super) const MIN_SAMPLED_STACKS: u64 = 10;
/// Contention mode's verdict rests on this much of the process's threads' time watched (it
/// counts waits only: a process that never waited has no writes to count).
pub(super) const MIN_WATCHED_NS: u64 = 1_000_000_000;
/// Calls of the holder (`long-holds`): its holds of that cause, or in contention mode, which
/// times no hold, the contended waits behind it.
pub(super) const MIN_LONG_HOLDS: u64 = 10;
/// The profiler's holds of the process's lock (`profiler-presence`): this long in all, or
/// [`MIN_PROFILER_SHARE`] of a material wait (listing::MATERIAL_WAIT_NS).
pub(super) const MIN_PROFILER_HOLD_NS: u64 = 1_000_000;
pub(super) const MIN_PROFILER_SHARE: f64 = 0.01;
/// `fault-reads`: the writers' wait charged to read holds, over all the writers' wait.
pub(super) const FAULT_READS_SHARE: f64 = 0.25;
/// Below this share of its threads' time (wall and CPU), mmap_lock is not the bottleneck.
pub(super) const NOT_A_BOTTLENECK_SHARE: f64 = 0.01;
/// No role may wait more than this share of its time either.
pub(super) const NOT_A_BOTTLENECK_ROLE_SHARE: f64 = 0.02;
/// Holds this long (mean of the holder's calls) are long: a write hold is a few us.
pub(super) const LONG_HOLD_NS: f64 = 200_000.0;
/// `long-holds`: the holder's holds are charged (or, without blockers, add up to) this share
/// of the process's wait.
pub(super) const LONG_HOLDS_SHARE: f64 = 0.3;

/// Own thread roles other than the main thread (those with malloc arenas of their own).
pub(super) const NON_MAIN: &[Role] = &[
    Role::Worker,
    Role::Libuv,
    Role::V8,
    Role::Inspector,
    Role::Addon,
    Role::Other,
];
/// Roles that run JavaScript.
pub(super) const JS: &[Role] = &[Role::Main, Role::Worker];
