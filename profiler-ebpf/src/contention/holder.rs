//! Who holds a lock a wait begins behind: the rwsem's `owner` word names the writer (with its
//! syscall, read from its saved user registers), or says that readers hold it.

use core::{ffi::c_void, ptr};

use aya_ebpf::{macros::map, maps::Array};
use profiler_common::cause;

use super::waiter::Waiter;
use crate::{
    kread::{self, Task},
    maps::{KERNEL, konst},
    timing::{PF_EXITING, PF_KTHREAD},
};

/// `rw_semaphore.owner`'s low bits: flags (bit 0: owned by readers), the rest a task.
const RWSEM_READER_OWNED: u64 = 1;
const RWSEM_OWNER_FLAGS: u64 = 7;

/// `HolderId::kind` of a wait whose holder is not known (the owner word named nobody).
pub const HOLDER_UNKNOWN: u32 = u32::MAX;

/// The distance from a task's `stack` to its saved user registers (the same for every task
/// of this kernel), found on the first waiter: a holder's syscall is read at that distance
/// from its own stack.
#[map]
static REGS_DELTA: Array<u64> = Array::with_max_entries(1, 0);

/// A pointer the verifier types (a BTF pointer), as a plain number: read back from the stack
/// slot it was stored in, so that it can be subtracted from another address.
#[inline(always)]
fn as_number(p: *mut c_void) -> u64 {
    let slot = p as u64;
    kread::u64_at(ptr::from_ref(&slot) as u64)
}

/// The distance from a task's kernel stack to its saved user registers, found on `task`
/// (the current one) the first time and kept.
#[inline(always)]
fn regs_delta(task: Task) -> u64 {
    let stack_off = konst(&KERNEL.task_stack);
    if stack_off == 0 {
        return 0;
    }
    if let Some(&d) = REGS_DELTA.get(0)
        && d != 0
    {
        return d;
    }
    let Some(regs) = task.user_regs() else {
        return 0;
    };
    let stack = kread::u64_at(task.addr() + stack_off as u64);
    let regs = as_number(regs.as_ptr());
    // The registers sit at the top of the stack: a few pages above it.
    if stack == 0 || regs <= stack || regs - stack > 1 << 20 {
        return 0;
    }
    let d = regs - stack;
    if let Some(p) = REGS_DELTA.get_ptr_mut(0) {
        // SAFETY: an array element; every CPU stores the same value.
        unsafe { ptr::write_volatile(p, d) };
    }
    d
}

/// What task `h` (a kernel address) holds a lock for write for: its exit, its syscall, or a
/// page fault, as `timing::write_cause` tells it of the current task; and where its user
/// registers are saved (0: a kernel thread, or not known).
#[inline(always)]
fn holder_cause(h: u64, delta: u64) -> (u32, u64) {
    let flags = kread::u32_at(h + konst(&KERNEL.task_flags) as u64);
    if flags & PF_KTHREAD != 0 || delta == 0 {
        return (cause::OTHER, 0);
    }
    let stack = kread::u64_at(h + konst(&KERNEL.task_stack) as u64);
    if stack == 0 {
        return (cause::OTHER, 0);
    }
    let regs = stack + delta;
    if flags & PF_EXITING != 0 {
        return (cause::EXIT, regs);
    }
    let syscall = konst(&KERNEL.regs_syscall);
    if syscall == 0 {
        return (cause::OTHER, regs);
    }
    (
        cause::of_syscall(crate::arch::syscall_nr_at(regs, syscall)),
        regs,
    )
}

/// Who holds `lock` (an rwsem) as its wait begins, from its owner word, into `w`; where a
/// writer holds it, where its user registers are saved (0: none or not known).
#[inline(always)]
pub fn note_holder(w: &mut Waiter, lock: u64, task: Task) -> u64 {
    let id = &mut w.holder;
    id.tid = 0;
    id.tgid = 0;
    id.tid_start = 0;
    id.kind = HOLDER_UNKNOWN;
    // (0: this kernel's rwsem has no owner word, as under PREEMPT_RT; `count` is first.)
    let owner_off = konst(&KERNEL.rwsem_owner);
    if owner_off == 0 {
        return 0;
    }
    let word = kread::u64_at(lock + owner_off as u64);
    if word & RWSEM_READER_OWNED != 0 {
        id.kind = cause::READ;
        return 0;
    }
    let h = word & !RWSEM_OWNER_FLAGS;
    if h == 0 {
        return 0;
    }
    id.tid = kread::u32_at(h + konst(&KERNEL.task_pid) as u64);
    if id.tid == 0 {
        return 0;
    }
    id.tgid = kread::u32_at(h + konst(&KERNEL.task_tgid) as u64);
    id.tid_start = kread::u64_at(h + konst(&KERNEL.task_start_boottime) as u64);
    let (kind, regs) = holder_cause(h, regs_delta(task));
    id.kind = kind;
    let fs_off = konst(&KERNEL.task_fsbase);
    w.holder_fsbase = if fs_off == 0 {
        0
    } else {
        kread::u64_at(h + fs_off as u64)
    };
    let comm = kread::comm_at(h + konst(&KERNEL.task_comm) as u64);
    kread::set_comm(&mut w.holder_comm, &comm);
    regs
}


/// Full mode with `--blockers`: the writer holding `lock` (the current thread's own
/// process's) as a sampled write of thread `tid` starts waiting for it, as
/// [`stack_record::HOLDER`](profiler_common::stack_record::HOLDER) needs it: its tid,
/// process, start, what it holds the lock for, and where its registers and fs base are.
/// None unless a writer of process `tgid` other than `tid` holds it.
#[inline(always)]
pub fn own_writer(lock: u64, task: Task, tid: u32, tgid: u32) -> Option<OwnWriter> {
    let owner_off = konst(&KERNEL.rwsem_owner);
    if owner_off == 0 {
        return None;
    }
    let word = kread::u64_at(lock + owner_off as u64);
    let h = word & !RWSEM_OWNER_FLAGS;
    if word & RWSEM_READER_OWNED != 0 || h == 0 {
        return None;
    }
    let id = kread::u32_at(h + konst(&KERNEL.task_pid) as u64);
    if id == 0 || id == tid || kread::u32_at(h + konst(&KERNEL.task_tgid) as u64) != tgid {
        return None;
    }
    let (kind, regs) = holder_cause(h, regs_delta(task));
    let fs_off = konst(&KERNEL.task_fsbase);
    Some(OwnWriter {
        tid: id,
        kind,
        regs,
        fsbase: if fs_off == 0 {
            0
        } else {
            kread::u64_at(h + fs_off as u64)
        },
    })
}

/// A writer of the current thread's own process, holding a lock it is about to wait for.
pub struct OwnWriter {
    pub tid: u32,
    pub kind: u32,
    pub regs: u64,
    pub fsbase: u64,
}
