//! Rare diagnostics, logged with aya-log (`--log-level`, docs/cli.md): the first loss of each
//! reason (the report's `lost`: a ring full, the stats map full, a thread's lock slots taken;
//! and a lock's slot of hold times taken over, with `--blockers`), a write lock taken in a
//! syscall the cause table does not know, and a thread the flush iterator left with
//! acquisitions pending. Each is logged once a run, with the task it was seen in.
//!
//! Never on the per-event path, and free when off. Every call sits in a branch that is rare
//! by itself, and first reads aya-log's `AYA_LOG_LEVEL`: a load-time constant in the frozen
//! read-only map, which userspace leaves at 0 (nothing enabled) unless logs were asked for.
//! The verifier knows the value, so it never walks what follows and removes it from the
//! program (as it does for the other load-time settings, see `maps`). What follows is a call
//! of [`report`], out of line, so that the programs' own code is compiled as without it.
//! When on, a diagnostic costs a map lookup and an atomic exchange, and its first occurrence
//! a record in aya-log's ring, which a thread of the profiler drains
//! (`profiler/src/kernel/ebpf_log.rs`).

use core::intrinsics::{AtomicOrdering, atomic_xchg};

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::Array};
use aya_log_ebpf::{debug, info, warn};
// What aya-log's macros ask first, asked here before calling `report` (aya-log-ebpf is
// pinned: this is not its public API).
use aya_log_ebpf::macro_support::{Level, level_enabled};
use profiler_common::{
    counter,
    diag::{FLAGS, ITER_LEFT_PENDING, LOG_TARGET, SYSCALLS, SYSCALLS_AT},
};

/// The once-flags (see `profiler_common::diag`): 1 once the diagnostic was logged.
#[map]
static DIAG_ONCE: Array<u64> = Array::with_max_entries(FLAGS, 0);

/// Health counter `idx` was added `n` to (`maps::bump_by`): its first non-zero is logged, if
/// it is a loss: of acquisitions as a warning, of what the profile can do without (a sampled
/// stack, a wait's charge) as information. `idx` is a constant at every call, so only its own
/// arm is compiled there.
#[inline(always)]
pub fn counted(idx: u32, n: u64) {
    let level = match idx {
        counter::MAP_FULL
        | counter::NESTED
        | counter::NO_STATE
        | counter::RING_FULL
        | counter::EXIT_FLUSH => Level::Warn,
        counter::STACKS_LOST | counter::BLOCKERS_OVERRUN => Level::Info,
        // Not losses, or not worth a check on a hot path: full rings userspace has a fallback
        // for (DIRTY, EXITED), flushes under the lock, fork children, the blockers' dropped
        // charges, downgrades and failed trylocks with the map full (MAP_FULL says it).
        _ => return,
    };
    if level_enabled(level) && n != 0 {
        report(idx, 0, 0);
    }
}

/// A write lock taken in syscall `nr`, which `cause::of_syscall` does not know (counted as
/// `other`): logged once a syscall number.
#[inline(always)]
pub fn other_syscall(nr: u64) {
    if level_enabled(Level::Debug) {
        let slot = if nr < SYSCALLS as u64 {
            nr as u32
        } else {
            SYSCALLS - 1
        };
        report(SYSCALLS_AT + slot, nr, 0);
    }
}

/// The flush iterator left thread `tid` of process `tgid`, exiting, with acquisitions pending
/// after its two passes (it was still taking locks: exit_mm, exit_mmap).
#[inline(always)]
pub fn iter_left_pending(tid: u32, tgid: u32) {
    if level_enabled(Level::Info) {
        report(ITER_LEFT_PENDING, tid as u64, tgid as u64);
    }
}

/// Logs diagnostic `flag` (a once-flag's index) the first time it comes, with its arguments
/// `a` and `b` and the current task. Out of line: one copy, called only where logs are on.
#[inline(never)]
fn report(flag: u32, a: u64, b: u64) {
    let Some(p) = DIAG_ONCE.get_ptr_mut(flag) else {
        return;
    };
    // SAFETY: an element of an array map, valid for the map's life; an atomic exchange (of
    // 64 bits: the only width BPF's generic CPU has), so that two CPUs cannot both see 0.
    if unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(p, 1) } != 0 {
        return;
    }
    let id = bpf_get_current_pid_tgid();
    let (tid, tgid) = (id as u32, (id >> 32) as u32);
    let t = LOG_TARGET;
    match flag {
        counter::MAP_FULL => warn!(
            &(),
            target: t,
            "lost.map_full: the stats map is full, acquisitions are not counted: raise --max-threads (in task {} of process {})",
            tid,
            tgid
        ),
        counter::NESTED => warn!(
            &(),
            target: t,
            "lost.nested: a thread had a third mmap_lock pending or held, two are tracked (in task {} of process {})",
            tid,
            tgid
        ),
        counter::NO_STATE => warn!(
            &(),
            target: t,
            "lost.no_state: per-thread state could not be allocated (in task {} of process {})",
            tid,
            tgid
        ),
        counter::RING_FULL => warn!(
            &(),
            target: t,
            "lost.ring_full: a thread's pending ring was full while another context flushed it (in task {} of process {})",
            tid,
            tgid
        ),
        counter::EXIT_FLUSH => warn!(
            &(),
            target: t,
            "lost.exit_flush: an exited thread's pending acquisitions could not be flushed (in task {} of process {})",
            tid,
            tgid
        ),
        counter::STACKS_LOST => info!(
            &(),
            target: t,
            "lost.stacks: a sampled stack did not fit in its ring, userspace fell behind (in task {} of process {})",
            tid,
            tgid
        ),
        counter::BLOCKERS_OVERRUN => info!(
            &(),
            target: t,
            "uncounted.blockers_overrun: a lock's slot of hold times was taken by another lock, a wait is not charged (in task {} of process {})",
            tid,
            tgid
        ),
        ITER_LEFT_PENDING => info!(
            &(),
            target: t,
            "the flush iterator left exiting thread {} of process {} with acquisitions pending after two passes",
            a,
            b
        ),
        _ => debug!(
            &(),
            target: t,
            "a write lock in syscall {}, counted as cause other (in task {} of process {})",
            a,
            tid,
            tgid
        ),
    }
}
