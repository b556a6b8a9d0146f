//! Which processes are profiled, decided in the kernel: the `FILTER` global, and the
//! selectors the kernel matches at exec.

use bytemuck::{Pod, Zeroable};

use crate::zeroed;

/// Largest number of `--pid` values the in-kernel filter holds.
pub const MAX_FILTER_PIDS: usize = 16;
/// Largest number of `--comm` values the one-shot profiler takes (the kernel matches them as
/// command name selectors, `SEL_COMMS`).
pub const MAX_FILTER_COMMS: usize = 8;

/// Which processes to profile, decided in the kernel; passed as the `FILTER` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Filter {
    pub n_pids: u32,
    pub pids: [u32; MAX_FILTER_PIDS],
    /// Non-zero: the `SELECTED` map decides instead (the agent, the one-shot profiler's
    /// `--comm` and `--children`: a selection that changes at run time): an owner is profiled
    /// when its pid is there with its start time.
    pub use_selection: u32,
    /// Nanoseconds per clock tick of /proc start times, to compare the kernel's start times
    /// with the ticks userspace put in `SELECTED`.
    pub ns_per_tick: u32,
    /// Non-zero (`--children`): a process forked by a selected one is selected at once, in
    /// the kernel, from its first acquisition on.
    pub follow_children: u32,
    pub _pad: u32,
}

impl Filter {
    /// Everything passes.
    pub const ALL: Filter = Filter {
        ns_per_tick: 10_000_000,
        ..zeroed()
    };
}

// A `SELECTED` value: the process's start time in clock ticks (the low bits) and how it was
// selected (the high ones), so that a report can say why a process is in it.

/// The start time's bits (clock ticks since boot: 2^52 of them is over a million years at
/// 100 Hz).
pub const SELECTED_TICKS: u64 = (1 << 52) - 1;
/// The mark of a process the kernel selected by the selectors (at exec or rename, or as the
/// child of one): its forks are selected too, and an exec into something the selectors do
/// not match deselects it. Processes selected by pid have no mark.
pub const SELECTED_BY_RULE: u64 = 1 << 63;
/// Where the selector that matched is: its number + 1 (0: none, a pid), counting the
/// command names, then the executables, then the cgroups, as `SelectorCounts` has them.
pub const SELECTED_SELECTOR_SHIFT: u32 = 52;
/// Where how the process came in is (3 bits: one of `how::*`).
pub const SELECTED_HOW_SHIFT: u32 = 60;

/// How a process came into `SELECTED`.
pub mod how {
    /// Put there by userspace: a `--pid` target, or a process found running at the start
    /// (or at the agent's scans).
    pub const SET: u64 = 0;
    /// Its exec matched a selector (its name, executable or cgroup).
    pub const EXEC: u64 = 1;
    /// It renamed itself to a selected name (`prctl(PR_SET_NAME)`, Node's `process.title`).
    pub const RENAME: u64 = 2;
    /// Forked by a selected process (followed with `--children`, or selected by a rule).
    pub const FORK: u64 = 3;
}

/// A `SELECTED` value: start `ticks`, selected by a rule or not, `how`, by `selector` (its
/// number + 1; 0: none).
pub const fn selected_value(ticks: u64, by_rule: bool, how: u64, selector: u64) -> u64 {
    (ticks & SELECTED_TICKS)
        | if by_rule { SELECTED_BY_RULE } else { 0 }
        | (how & 7) << SELECTED_HOW_SHIFT
        | (selector & 0xff) << SELECTED_SELECTOR_SHIFT
}

/// A `SELECTED` value's start ticks.
pub const fn selected_ticks(v: u64) -> u64 {
    v & SELECTED_TICKS
}

/// A `SELECTED` value's `how::*`.
pub const fn selected_how(v: u64) -> u64 {
    (v >> SELECTED_HOW_SHIFT) & 7
}

/// A `SELECTED` value's selector number + 1 (0: none).
pub const fn selected_selector(v: u64) -> u64 {
    (v >> SELECTED_SELECTOR_SHIFT) & 0xff
}

/// Executable selectors (`--exe`) the kernel matches at exec: up to this many...
pub const MAX_EXE_SELECTORS: u32 = 16;
/// ...of up to this many path components...
pub const EXE_COMPONENTS: usize = 4;
/// ...each shorter than this (bytes, the kernel's inline dentry names).
pub const EXE_COMPONENT_LEN: usize = 32;
/// Cgroup subtrees (`--cgroup`) the kernel matches at exec.
pub const MAX_CGROUP_SELECTORS: u32 = 16;

/// An executable selector: the last components of the executable's path (the file it runs,
/// `mm->exe_file`), innermost first: `node` is `["node"]`, `*/bin/node` `["node", "bin"]`,
/// `/usr/bin/node` the same, anchored at the root of its file system.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ExeSelector {
    /// Components in use.
    pub n: u32,
    /// Non-zero: the path has no other component (its file system's root comes next).
    pub anchored: u32,
    pub lens: [u32; EXE_COMPONENTS],
    /// NUL-padded.
    pub comps: [[u8; EXE_COMPONENT_LEN]; EXE_COMPONENTS],
}

/// A cgroup subtree selector: the cgroup (v2) id of its root and that root's depth.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CgroupSelector {
    pub id: u64,
    pub level: u32,
    pub _pad: u32,
}

/// How many of each selector are in use (the `SEL_COUNTS` map: changes on SIGHUP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SelectorCounts {
    pub exes: u32,
    pub cgroups: u32,
    pub comms: u32,
    pub _pad: u32,
}
