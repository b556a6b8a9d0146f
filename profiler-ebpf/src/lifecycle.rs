//! Threads coming and going: the exit path (a thread's last acquisitions are accumulated and
//! copied, then userspace is told it may read its entries one last time), forks followed
//! with `--children`, and the flush iterator userspace runs before each reading, which hands
//! over what every idle thread accumulated, with profiled threads' CPU times.
//!
//! The exit path and the iterator hand the final flush to each other: whoever holds a
//! thread's claim when it exits finishes it. The exit path marks the thread exiting before it
//! tries to claim; the iterator looks at that mark again after letting the claim go, with a
//! full barrier in between, so one of the two always sees the other.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    helpers::{
        bpf_ktime_get_boot_ns,
        generated::{bpf_get_current_cgroup_id, bpf_seq_write},
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::{ExitedThread, NO_RUN_DELAY, ThreadCpu, counter, exit_record, thread_cpu};

use crate::{
    accum,
    kread::{self, Task},
    maps::{EXITED, FILTER, KERNEL, MM_OWNER, SELECTED, bump, konst},
    owner::ctx_id,
    state::{THREAD_STATE, ThreadState, claim, unclaim_full},
};

#[inline(always)]
pub fn boot_ns() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// A thread's run-queue delay (ns runnable but waiting for a CPU), or [`NO_RUN_DELAY`] on a
/// kernel that keeps none.
#[inline(always)]
pub fn run_delay(task: Task) -> u64 {
    let off = konst(&KERNEL.task_run_delay);
    if off == 0 { NO_RUN_DELAY } else { task.u64_at(off) }
}

/// Tells userspace that the thread is exiting (`EXITING`) or that its entries are final
/// (`FREED`: read them one last time).
#[inline(always)]
fn notify(st: &ThreadState, task: Task, tag: u32) {
    send_exit(&ExitedThread {
        tag,
        tid: st.tid,
        tgid: st.tgid,
        _pad: 0,
        tid_start: st.tid_start,
        cpu_ns: task.u64_at(konst(&KERNEL.task_cpu_ns)),
        queued_ns: run_delay(task),
        at_ns: boot_ns(),
        cgroup_id: 0,
        owner_start: 0,
        comm: comm_bytes(st.comm),
    });
}

/// The start time of `task`'s process when that process is profiled (its address space is
/// the one its own profiled threads noted in `MM_OWNER`, in either mode) and `task` is one
/// of its threads: a thread of it that is not profiled itself is a bystander, whose time
/// alive and on CPU is its process's all the same.
#[inline(always)]
pub fn bystander_of(task: Task, tgid: u32) -> Option<u64> {
    let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
    if mm == 0 {
        return None;
    }
    // SAFETY: a map lookup, the value copied out at once.
    let o = unsafe { MM_OWNER.get(mm) }.copied()?;
    (o.pid == tgid && o.ctx_id == ctx_id(mm)).then_some(o.start)
}

/// A task's name, as a record carries it.
#[inline(always)]
fn task_comm(task: Task) -> [u8; profiler_common::COMM_LEN] {
    comm_bytes(kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64))
}

/// A bystander (see [`bystander_of`]) is exiting: userspace is told its end and CPU time.
/// Both copies of the exit program may send it (userspace takes one).
#[inline(always)]
pub fn bystander_exit(task: Task) {
    let tgid = task.u32_at(konst(&KERNEL.task_tgid));
    let Some(owner_start) = bystander_of(task, tgid) else {
        return;
    };
    send_exit(&ExitedThread {
        tag: exit_record::BYSTANDER,
        tid: task.u32_at(konst(&KERNEL.task_pid)),
        tgid,
        _pad: 0,
        tid_start: task.u64_at(konst(&KERNEL.task_start_boottime)),
        cpu_ns: task.u64_at(konst(&KERNEL.task_cpu_ns)),
        queued_ns: run_delay(task),
        at_ns: boot_ns(),
        cgroup_id: 0,
        owner_start,
        comm: task_comm(task),
    });
}

/// A bystander's CPU time into the iterator's output (every pass: it has no state to say
/// whether it changed).
#[inline(always)]
pub fn report_bystander(task: Task, seq: *mut c_void) {
    if seq.is_null() {
        return;
    }
    let tgid = task.u32_at(konst(&KERNEL.task_tgid));
    let Some(owner_start) = bystander_of(task, tgid) else {
        return;
    };
    let rec = ThreadCpu {
        tid: task.u32_at(konst(&KERNEL.task_pid)),
        tgid,
        tid_start: task.u64_at(konst(&KERNEL.task_start_boottime)),
        cpu_ns: task.u64_at(konst(&KERNEL.task_cpu_ns)),
        queued_ns: run_delay(task),
        at_ns: boot_ns(),
        owner_start,
        comm: task_comm(task),
        flags: thread_cpu::BYSTANDER,
        _pad: 0,
    };
    write_cpu(seq, &rec);
}

/// Writes a thread's CPU record into the task iterator's output (`seq`, its seq_file).
#[inline(always)]
pub fn write_cpu(seq: *mut c_void, rec: &ThreadCpu) {
    // SAFETY: `seq` is the iterator's seq_file (from its context), `rec` a plain record of
    // the length given.
    unsafe {
        bpf_seq_write(
            seq.cast(),
            ptr::from_ref(rec).cast(),
            size_of::<ThreadCpu>() as u32,
        )
    };
}

/// Sends an exit notice (see `exit_record`).
#[inline(always)]
pub fn send_exit(rec: &ExitedThread) {
    if EXITED.output::<ExitedThread>(rec, 0).is_err() {
        bump(counter::EXITS_LOST);
    }
}

/// A comm as the bytes a record carries (the same 16 bytes: no copy loop, no memset).
#[inline(always)]
pub fn comm_bytes(c: kread::Comm) -> [u8; profiler_common::COMM_LEN] {
    // SAFETY: two u64 and sixteen u8 are the same bytes; every pattern is valid for both.
    unsafe { core::mem::transmute::<kread::Comm, [u8; profiler_common::COMM_LEN]>(c) }
}

/// The current task's cgroup (v2 id).
#[inline(always)]
fn current_cgroup() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

/// Announces that process `tgid` (whose leader is `task`, the current thread) has exec'd.
#[inline(always)]
pub fn notify_exec(task: Task, tgid: u32) {
    let rec = ExitedThread {
        tag: exit_record::EXEC,
        tid: tgid,
        tgid,
        _pad: 0,
        tid_start: task.u64_at(konst(&KERNEL.task_start_boottime)),
        cpu_ns: task.u64_at(konst(&KERNEL.task_cpu_ns)),
        queued_ns: run_delay(task),
        at_ns: boot_ns(),
        cgroup_id: current_cgroup(),
        owner_start: 0,
        // The new image's name: exec set it before this tracepoint.
        comm: comm_bytes(kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64)),
    };
    if EXITED.output::<ExitedThread>(&rec, 0).is_err() {
        bump(counter::EXITS_LOST);
    }
}

/// The exiting thread's final flush and copy, if nobody else holds its claim (then the
/// holder, the iterator, finishes it). `with_charge`: no lock is held (blockers' charge).
#[inline(always)]
pub fn final_flush(st: &mut ThreadState, task: Task, with_charge: bool) {
    if claim(st) {
        accum::flush_claimed(st, task, with_charge);
        accum::copy_claimed(st);
        notify(st, task, exit_record::FREED);
        unclaim_full(st);
    } else {
        notify(st, task, exit_record::EXITING);
    }
}

/// A thread is exiting: what it accumulated is handed over now (no lock is held here). It may
/// still take locks after this (exit_mm, the last thread's exit_mmap): those releases flush
/// and announce it again.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    exit::<false>()
}

/// The second copy, where the kernel may skip the first (see `timing`'s doc): a thread whose
/// exit the first did not see would lose what it accumulated since its last copy.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_second(_ctx: RawTracePointContext) -> i32 {
    exit::<true>()
}

#[inline(always)]
fn exit<const SECOND: bool>() -> i32 {
    let task = Task::current();
    let Some(st) = THREAD_STATE.get(task, false) else {
        bystander_exit(task);
        return 0;
    };
    // SAFETY: a volatile read of a field the iterator reads too.
    if SECOND && unsafe { ptr::read_volatile(&st.exiting) } != 0 {
        // The first copy ran.
        return 0;
    }
    // SAFETY: `head` is only written by this thread, `tail` by the claim's holder.
    let pending = st.head != unsafe { ptr::read_volatile(&st.tail) };
    if st.profiled == 0 && !pending {
        bystander_exit(task);
        return 0;
    }
    if SECOND {
        bump(counter::RESCUED);
    }
    // SAFETY: a volatile store, ordered before the claim's compare-and-swap below.
    unsafe { ptr::write_volatile(&mut st.exiting, 1) };
    final_flush(st, task, true);
    0
}

/// A process forked by a selected one is selected too, before it runs, when it is followed
/// (`--children`) or was selected by the agent's rules (a child has its parent's comm,
/// executable and cgroup until it execs). Fires in the parent once the child exists; its
/// acquisitions inside fork are the parent's or uncounted. Threads are not processes: only
/// a new thread group counts.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    if konst(&FILTER.use_selection) == 0 {
        return 0;
    }
    let parent: u64 = ctx.arg(0);
    let child: u64 = ctx.arg(1);
    let parent_tgid = kread::u32_at(parent + konst(&KERNEL.task_tgid) as u64);
    // SAFETY: the value is copied out at once.
    let Some(&parent_value) = (unsafe { SELECTED.get(parent_tgid) }) else {
        return 0;
    };
    let Some(mark) = crate::selection::inherited(parent_value) else {
        return 0;
    };
    let pid = kread::u32_at(child + konst(&KERNEL.task_pid) as u64);
    let tgid = kread::u32_at(child + konst(&KERNEL.task_tgid) as u64);
    if pid == 0 || pid != tgid {
        return 0;
    }
    let per_tick = konst(&FILTER.ns_per_tick) as u64;
    if per_tick == 0 {
        return 0;
    }
    let start = kread::u64_at(child + konst(&KERNEL.task_start_boottime) as u64);
    if SELECTED.insert(pid, (start / per_tick) | mark, 0).is_err() {
        bump(counter::MAP_FULL);
        return 0;
    }
    let rec = ExitedThread {
        tag: exit_record::FORK,
        tid: pid,
        tgid: pid,
        _pad: 0,
        tid_start: start,
        cpu_ns: 0,
        queued_ns: 0,
        at_ns: boot_ns(),
        // The parent's, which the child has until it moves.
        cgroup_id: current_cgroup(),
        owner_start: 0,
        comm: comm_bytes(kread::comm_at(child + konst(&KERNEL.task_comm) as u64)),
    };
    if EXITED.output::<ExitedThread>(&rec, 0).is_err() {
        bump(counter::EXITS_LOST);
    }
    0
}

/// Reports a profiled thread's CPU time into the iterator's output, when it changed; a
/// thread with state that is not profiled is a bystander.
#[inline(always)]
fn report_cpu(st: &mut ThreadState, task: Task, seq: *mut c_void) {
    if st.profiled == 0 {
        report_bystander(task, seq);
        return;
    }
    if seq.is_null() {
        return;
    }
    let cpu = task.u64_at(konst(&KERNEL.task_cpu_ns));
    if cpu == st.cpu_reported {
        return;
    }
    st.cpu_reported = cpu;
    let rec = ThreadCpu {
        tid: st.tid,
        tgid: st.tgid,
        tid_start: st.tid_start,
        cpu_ns: cpu,
        queued_ns: run_delay(task),
        at_ns: boot_ns(),
        owner_start: 0,
        comm: comm_bytes(st.comm),
        flags: 0,
        _pad: 0,
    };
    write_cpu(seq, &rec);
}

/// Hands over what every live thread accumulated, when userspace reads the iterator (each
/// reading, and at the end of a run).
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub extern "C" fn flush_threads(ctx: *mut c_void) -> i32 {
    // struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }
    // struct bpf_iter_meta { struct seq_file *seq; ... }
    // SAFETY: the iterator's context has that layout; the verifier types both loads.
    let (meta, task) = unsafe {
        (
            *ctx.cast::<*const *mut c_void>(),
            *ctx.cast::<*mut c_void>().add(1),
        )
    };
    let Some(task) = Task::from_btf(task) else {
        return 0;
    };
    // SAFETY: `meta` is the iterator's non-null metadata; its first field is the seq_file.
    let seq = unsafe { *meta };
    let Some(st) = THREAD_STATE.get(task, false) else {
        report_bystander(task, seq);
        return 0;
    };
    // Twice at most: a second time when the thread began exiting while we held its claim
    // and left its last acquisitions to us.
    for _ in 0..2 {
        if !claim(st) {
            // The thread itself is flushing: it finishes its own exit if it is exiting.
            return 0;
        }
        // SAFETY: volatile reads of fields other CPUs write.
        let was_exiting = unsafe { ptr::read_volatile(&st.exiting) } != 0;
        accum::flush_claimed(st, task, true);
        accum::copy_claimed(st);
        report_cpu(st, task, seq);
        if was_exiting {
            notify(st, task, exit_record::FREED);
        }
        unclaim_full(st);
        // SAFETY: as above, after the exchange's full barrier.
        let exiting = unsafe { ptr::read_volatile(&st.exiting) } != 0;
        // SAFETY: as above.
        let pending = unsafe { ptr::read_volatile(&st.head) } != st.tail;
        if !(exiting && (pending || !was_exiting)) {
            return 0;
        }
    }
    crate::diag::iter_left_pending(st.tid, st.tgid);
    0
}
