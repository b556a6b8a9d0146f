//! Whose lock is it, and is it profiled? A lock belongs to the process owning its
//! `mm_struct`; filters (`--pid`, or the `SELECTED` map of `--comm`, `--children` and the
//! agent) are decided on that owner, once per thread for its own mm (cached), and each time
//! for another process's mm (rare, and a cached mm address could be reused once freed).

use profiler_common::{MAX_FILTER_PIDS, cause, selected_ticks};

use crate::{
    kread::{self, Task},
    maps::{FILTER, KERNEL, MM_OWNER, MmOwner, SELECTED, konst, selection_generation},
    state::{NOT_TRACKED, OwnCache, Slot, SlotState, TRACKED},
};

/// Which process owns an mm, for a lock the current thread takes.
pub enum Owner {
    /// Profiled: its pid and start time.
    Tracked(u32, u64),
    /// Profiled, and its address space is being torn down on another task's last reference
    /// (`exit_mmap` after its process exited, `mm->owner` cleared): its pid and start time.
    Teardown(u32, u64),
    /// Filtered out.
    Ignored,
    /// A child's new mm inside fork's dup_mmap: counted apart, never charged.
    ForkChild,
}

/// The kernel's never-reused id of address space `mm` (0 where it has none).
#[inline(always)]
pub fn ctx_id(mm: u64) -> u64 {
    let off = konst(&KERNEL.mm_ctx_id);
    if off == 0 {
        0
    } else {
        kread::u64_at(mm + off as u64)
    }
}

/// Start time of the process `task` (a kernel address) belongs to: its group leader's.
#[inline(always)]
pub fn process_start(task: u64) -> u64 {
    let leader = kread::u64_at(task + konst(&KERNEL.task_group_leader) as u64);
    if leader == 0 {
        return 0;
    }
    kread::u64_at(leader + konst(&KERNEL.task_start_boottime) as u64)
}

/// Does the process `owner` pass `--pid` (or the selection: the agent's, `--comm`'s,
/// `--children`')? `owner_task` is a task of that process (a kernel address; 0 if unknown).
/// Decided per process, never by a thread's own name: every thread of a selected process is
/// profiled, whatever it is called (a Worker born after `process.title` renamed its process).
#[inline(always)]
pub fn passes_filter(owner: u32, owner_task: u64) -> bool {
    if konst(&FILTER.use_selection) != 0 {
        // The pid with the same start: a reused pid is not the selected process.
        // SAFETY: the value is copied out at once; entries are plain u64s.
        let Some(&v) = (unsafe { SELECTED.get(owner) }) else {
            return false;
        };
        let per_tick = konst(&FILTER.ns_per_tick) as u64;
        return owner_task != 0
            && per_tick != 0
            && process_start(owner_task) / per_tick == selected_ticks(v);
    }
    let n_pids = konst(&FILTER.n_pids) as usize;
    if n_pids == 0 {
        return true;
    }
    for i in 0..MAX_FILTER_PIDS {
        if i >= n_pids {
            break;
        }
        if konst(&FILTER.pids[i]) == owner {
            return true;
        }
    }
    false
}

/// Resolves which process owns `mm`, caching the verdict for the thread's own mm in `own`.
/// `slots`: the thread's lock slots, if it has any (a held fork slot tells dup_mmap's child).
#[inline(always)]
pub fn resolve(own: &mut OwnCache, slots: Option<&[Slot; 2]>, mm: u64) -> Owner {
    let generation = selection_generation();
    if mm == own.mm && own.tracked != 0 && own.generation == generation {
        return if own.tracked == TRACKED {
            Owner::Tracked(own.owner, own.owner_start)
        } else {
            Owner::Ignored
        };
    }
    let task = kread::current_addr();
    let own_mm = kread::u64_at(task + konst(&KERNEL.task_mm) as u64);
    let tgid = Task::current().u32_at(konst(&KERNEL.task_tgid));
    if own_mm == mm {
        let start = process_start(task);
        let tracked = passes_filter(tgid, task);
        own.mm = mm;
        own.owner_start = start;
        own.owner = tgid;
        own.tracked = if tracked { TRACKED } else { NOT_TRACKED };
        own.generation = generation;
        if tracked {
            let o = MmOwner {
                start,
                ctx_id: ctx_id(mm),
                pid: tgid,
                _pad: 0,
            };
            // A full map evicts its least used entry; a failed insert only loses the note.
            let _ = MM_OWNER.insert(mm, o, 0);
        }
        return if tracked {
            Owner::Tracked(tgid, start)
        } else {
            Owner::Ignored
        };
    }
    // dup_mmap write-locks the parent's mm (a FORK write held in a slot), then the child's.
    if let Some(slots) = slots {
        for s in slots {
            if s.state == SlotState::Held && s.kind == cause::FORK && s.mm != mm {
                return Owner::ForkChild;
            }
        }
    }
    let mm_owner = konst(&KERNEL.mm_owner);
    let owner_task = if mm_owner == 0 {
        0
    } else {
        kread::u64_at(mm + mm_owner as u64)
    };
    if owner_task == 0 && mm_owner != 0 {
        // mm->owner cleared: its process has exited and this task holds the last reference
        // (exit_mmap's teardown runs here). Charged to the process noted while it lived, if
        // the note is about this very address space: a profiled process's mm freed long ago
        // may have left its note at an address an unprofiled process's mm took since (many
        // short processes, a /proc reader holding the last reference of one of them).
        // SAFETY: a map lookup, the value copied out at once.
        if let Some(o) = unsafe { MM_OWNER.get(mm) }.copied()
            && o.ctx_id == ctx_id(mm)
        {
            return Owner::Teardown(o.pid, o.start);
        }
    }
    if owner_task == 0 {
        // No mm->owner in this kernel (no CONFIG_MEMCG), or none set: charged to owner 0.
        return if passes_filter(0, 0) {
            Owner::Tracked(0, 0)
        } else {
            Owner::Ignored
        };
    }
    // Another process's lock (e.g. reading /proc/PID/smaps): mm->owner names its process.
    let owner = kread::u32_at(owner_task + konst(&KERNEL.task_tgid) as u64);
    if owner == tgid {
        // A task of our own thread group whose mm is not ours yet: execve's new mm (a fork
        // child's was caught above by the held fork slot). It is this process's lock.
        let start = process_start(task);
        return if passes_filter(tgid, task) {
            Owner::Tracked(tgid, start)
        } else {
            Owner::Ignored
        };
    }
    if passes_filter(owner, owner_task) {
        Owner::Tracked(owner, process_start(owner_task))
    } else {
        Owner::Ignored
    }
}
