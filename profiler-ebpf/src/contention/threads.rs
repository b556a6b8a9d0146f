//! Contention mode's threads coming and going: exit notices for the threads that waited, their
//! entries freed with the task, and the iterator userspace runs before each reading.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use profiler_common::{ExitedThread, ThreadCpu, counter, exit_record};

use super::{
    waiter::{WAITERS, Waiter, note_lock},
    waiting_done,
};
use crate::{
    kread::{self, Task},
    lifecycle::{self, boot_ns},
    maps::{KERNEL, bump, konst},
    owner::{passes_filter, process_start},
};

/// Tells userspace that a thread that waited is exiting: its entries are complete (every
/// wait is in `STATS` as it ends), to be read once /proc shows it gone.
#[inline(always)]
pub fn notify_freed(w: &Waiter, task: Task) {
    lifecycle::send_exit(&ExitedThread {
        tag: exit_record::FREED,
        tid: w.tid,
        tgid: w.tgid,
        _pad: 0,
        tid_start: w.tid_start,
        cpu_ns: task.u64_at(konst(&KERNEL.task_cpu_ns)),
        queued_ns: lifecycle::run_delay(task),
        at_ns: boot_ns(),
        cgroup_id: 0,
        owner_start: 0,
        comm: lifecycle::comm_bytes(w.comm),
    });
}

/// A thread is exiting: if it ever waited, userspace is told (it may still wait in exit_mm
/// or, the last thread, exit_mmap: those waits say it again).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn contention_exit(_ctx: RawTracePointContext) -> i32 {
    exit::<false>()
}

/// The second copies of the exit and the free, where the kernel may skip the first (see
/// `timing`'s doc): an exit not told keeps the thread's entries until userspace finds it
/// gone; a free not seen keeps its `WAITERS` entry for good.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn contention_exit_second(_ctx: RawTracePointContext) -> i32 {
    exit::<true>()
}

#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn contention_free_second(ctx: RawTracePointContext) -> i32 {
    free::<true>(&ctx)
}

#[inline(always)]
fn exit<const SECOND: bool>() -> i32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let task = Task::current();
    // A thread that never waited: its time is its process's all the same.
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        lifecycle::bystander_exit(task);
        return 0;
    };
    // SAFETY: as in `waiter`.
    let w = unsafe { &mut *p };
    if w.tid_start != task.u64_at(konst(&KERNEL.task_start_boottime)) {
        lifecycle::bystander_exit(task);
        return 0;
    }
    if SECOND {
        if w.exiting != 0 {
            // The first copy ran.
            return 0;
        }
        bump(counter::RESCUED);
    }
    w.exiting = 1;
    notify_freed(w, task);
    0
}

/// A task is freed: its entry goes (it can wait no more).
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn contention_free(ctx: RawTracePointContext) -> i32 {
    free::<false>(&ctx)
}

#[inline(always)]
fn free<const SECOND: bool>(ctx: &RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let tid = kread::u32_at(task + konst(&KERNEL.task_pid) as u64);
    // SAFETY: a map lookup, the values copied out at once.
    let Some((start, lock)) = (unsafe { WAITERS.get(tid) }).map(|w| (w.tid_start, w.lock)) else {
        return 0;
    };
    if start != kread::u64_at(task + konst(&KERNEL.task_start_boottime) as u64) {
        return 0;
    }
    if lock != 0 {
        waiting_done(tid);
    }
    // (Found by the second copy: the first did not run.)
    if SECOND {
        bump(counter::RESCUED);
    }
    let _ = WAITERS.remove(tid);
    0
}

/// Set by userspace when the iterator is to note every profiled process's lock: at the start,
/// when its selection adds processes, and every few readings (a pass over every process of
/// the host is not for every reading).
#[map]
pub static NOTE_LOCKS: Array<u32> = Array::with_max_entries(1, 0);

/// Notes the lock of process `tgid`, whose leader is `task`, if it is profiled (for other
/// tasks' waits on it): from the iterator, and at a profiled process's exec (its new mm).
#[inline(always)]
pub fn note_own_lock(task: Task, tgid: u32) {
    let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
    if mm != 0 && passes_filter(tgid, task.addr()) {
        note_lock(mm, tgid, process_start(task.addr()));
    }
}

/// Run by userspace before a reading (see its `flush_pending`): reports the CPU time of the
/// threads that waited and, when asked (`NOTE_LOCKS`), notes every profiled process's lock
/// for other tasks' waits on it (before any of its own threads waited, a /proc reader's wait
/// would otherwise be missed).
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub extern "C" fn contention_threads(ctx: *mut c_void) -> i32 {
    // SAFETY: the iterator's context: `{ struct bpf_iter_meta *meta; struct task_struct
    // *task; }`, and the meta's first field is its seq_file; the verifier types both loads.
    let (meta, task) = unsafe {
        (
            *ctx.cast::<*const *mut c_void>(),
            *ctx.cast::<*mut c_void>().add(1),
        )
    };
    let Some(task) = Task::from_btf(task) else {
        return 0;
    };
    let tid = task.u32_at(konst(&KERNEL.task_pid));
    let tgid = task.u32_at(konst(&KERNEL.task_tgid));
    // (A load of an array element the verifier inlines: nothing when the flag is clear.)
    if tid == tgid && NOTE_LOCKS.get(0).is_some_and(|&n| n != 0) {
        note_own_lock(task, tgid);
    }
    // SAFETY: `meta` is the iterator's non-null metadata; its first field is the seq_file.
    let seq: *mut c_void = unsafe { (*meta).cast() };
    // A thread that never waited: reported as a bystander of its process.
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        lifecycle::report_bystander(task, seq);
        return 0;
    };
    // SAFETY: as in `waiter`; the iterator writes only `cpu_reported`, which nothing else
    // writes.
    let w = unsafe { &mut *p };
    let start = task.u64_at(konst(&KERNEL.task_start_boottime));
    let cpu = task.u64_at(konst(&KERNEL.task_cpu_ns));
    if w.tid_start != start {
        lifecycle::report_bystander(task, seq);
        return 0;
    }
    if cpu == w.cpu_reported {
        return 0;
    }
    w.cpu_reported = cpu;
    let rec = ThreadCpu {
        tid,
        tgid,
        tid_start: start,
        cpu_ns: cpu,
        queued_ns: lifecycle::run_delay(task),
        at_ns: boot_ns(),
        owner_start: 0,
        comm: lifecycle::comm_bytes(w.comm),
        flags: 0,
        _pad: 0,
    };
    lifecycle::write_cpu(seq, &rec);
    0
}

