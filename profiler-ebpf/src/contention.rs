//! Contention mode (`--mode contention`): programs on `lock:contention_begin` and
//! `lock:contention_end` (Linux 5.19+), which the kernel fires only on a lock's slow path, for
//! every kind of lock it has. The mmap_lock tracepoints stay detached, so an acquisition that
//! does not wait costs nothing; a wait that does is timed from its slow path's start to its
//! end, and counted in the same `STATS` entries as full mode's (count and wait, no hold).
//!
//! Every lock in the kernel fires these, so the first lines only look at the flags (an rwsem
//! waits with READ or WRITE alone; spinlocks, mutexes and per-CPU rwsems carry other bits),
//! then at the address: the current task's own `&mm->mmap_lock`, or a profiled process's
//! lock in `MM_OWNER` (another task waiting on it: the profiler's reads of /proc, khugepaged,
//! a debugger, an exit_mmap on the last reference). `contention_end` first looks at a counter
//! of waits in progress, indexed by thread id, which is zero for nearly every thread.
//!
//! No task local storage: allocating it under a contended lock recursed in the kernel's own
//! perf tool (commit c66a36af7ba3), which removed it from these handlers. A thread's state is
//! in a preallocated hash map (`WAITERS`), made at its first wait and deleted when the task
//! is freed.
//!
//! Who made whom wait, without `--blockers`' holder slots: the rwsem's `owner` word names the
//! writer holding the lock when the wait begins (with its syscall, read from its saved user
//! registers); with its reader bit set the lock is held by readers, whom it does not name.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr,
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_seq_write},
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use profiler_common::{
    BlockedKey, HolderId, READ, SampleDone, StatsKey, ThreadCpu, WRITE, cause, counter,
    exit_record, stack_record,
};

use crate::{
    accum::{self, Identity},
    blockers,
    kread::{self, Comm, Task},
    lifecycle::{self, boot_ns},
    maps::{KERNEL, MM_OWNER, MmOwner, SETTINGS, STACKS, bump, konst, note_activity},
    owner::{ctx_id, passes_filter, process_start},
    sampling,
    timing::{self, PF_EXITING, PF_KTHREAD, now},
};

/// `lock:contention_begin`'s flags (include/trace/events/lock.h): an rwsem's reader or
/// writer waits with one of these alone.
const LCB_F_READ: u64 = 1 << 1;
const LCB_F_WRITE: u64 = 1 << 2;

/// `rw_semaphore.owner`'s low bits: flags (bit 0: owned by readers), the rest a task.
const RWSEM_READER_OWNED: u64 = 1;
const RWSEM_OWNER_FLAGS: u64 = 7;

/// `HolderId::kind` of a wait whose holder is not known (the owner word named nobody).
pub const HOLDER_UNKNOWN: u32 = u32::MAX;

/// A thread that waited for a profiled lock: who it is, its sampling state, the wait in
/// progress.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Waiter {
    pub tid_start: u64,
    pub fsbase: u64,
    pub comm: Comm,
    pub tid: u32,
    pub tgid: u32,
    /// The lock waited for now (0: none).
    pub lock: u64,
    pub start_ts: u64,
    pub owner_start: u64,
    pub owner: u32,
    /// `cause::READ` or the write's cause.
    pub kind: u32,
    /// Who held it for write when the wait began (`tid` 0: readers; `kind`
    /// [`HOLDER_UNKNOWN`]: nobody the lock named), and what userspace needs to tell the
    /// holder's role, should it never wait itself.
    pub holder: HolderId,
    pub holder_fsbase: u64,
    pub holder_comm: Comm,
    /// Sequence number of this wait's sampled stack (0: not sampled).
    pub sample_seq: u32,
    /// Contended writes so far, and writes until the next sample (see `sampling::pick_in`).
    pub writes: u32,
    pub sample_left: u32,
    /// 1 once its exit was announced: a wait after that (exit_mm, the last thread's
    /// exit_mmap) announces it again, as full mode's releases do.
    pub exiting: u32,
    /// CPU time when last reported by the iterator.
    pub cpu_reported: u64,
}

/// Threads that waited for a profiled lock, by tid (sized at load time; preallocated: no
/// allocation under a contended lock).
#[map]
pub static WAITERS: HashMap<u32, Waiter> = HashMap::with_max_entries(16384, 0);

/// Waits in progress, by `tid & (WAITING_SLOTS - 1)`: `contention_end`, which every lock
/// in the kernel fires, looks here first, one array load, and goes no further for the threads
/// that wait for no profiled lock.
const WAITING_SLOTS: u32 = 4096;
#[map]
static WAITING: Array<u64> = Array::with_max_entries(WAITING_SLOTS, 0);

/// Where a new `WAITERS` value is assembled (too large to build on the 512-byte stack with
/// stores the verifier accepts cheaply).
#[map]
static NEW_WAITER: PerCpuArray<Waiter> = PerCpuArray::with_max_entries(1, 0);

/// The distance from a task's `stack` to its saved user registers (the same for every task
/// of this kernel), found on the first waiter: a holder's syscall is read at that distance
/// from its own stack.
#[map]
static REGS_DELTA: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn atomic_add(p: &mut u64, n: u64) {
    // SAFETY: an atomic add to a live map value's field; BPF_ATOMIC.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, n) };
}

/// The counter of waits in progress of threads like `tid`.
#[inline(always)]
fn waiting_slot(tid: u32) -> Option<&'static mut u64> {
    // SAFETY: an array element, valid for the map's life; changed with atomics only.
    WAITING
        .get_ptr_mut(tid & (WAITING_SLOTS - 1))
        .map(|p| unsafe { &mut *p })
}

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
/// page fault, as `timing::write_cause` tells it of the current task.
#[inline(always)]
fn holder_cause(h: u64, delta: u64) -> u32 {
    let flags = kread::u32_at(h + konst(&KERNEL.task_flags) as u64);
    if flags & PF_EXITING != 0 {
        return cause::EXIT;
    }
    let orig_ax = konst(&KERNEL.regs_orig_ax);
    if flags & PF_KTHREAD != 0 || orig_ax == 0 || delta == 0 {
        return cause::OTHER;
    }
    let stack = kread::u64_at(h + konst(&KERNEL.task_stack) as u64);
    if stack == 0 {
        return cause::OTHER;
    }
    cause::of_orig_ax(kread::u64_at(stack + delta + orig_ax as u64))
}

/// Who holds `lock` (an rwsem) as its wait begins, from its owner word, into `w`.
#[inline(always)]
fn note_holder(w: &mut Waiter, lock: u64, task: Task) {
    let id = &mut w.holder;
    id.tid = 0;
    id.tgid = 0;
    id.tid_start = 0;
    id.kind = HOLDER_UNKNOWN;
    // (0: this kernel's rwsem has no owner word, as under PREEMPT_RT; `count` is first.)
    let owner_off = konst(&KERNEL.rwsem_owner);
    if owner_off == 0 {
        return;
    }
    let word = kread::u64_at(lock + owner_off as u64);
    if word & RWSEM_READER_OWNED != 0 {
        id.kind = cause::READ;
        return;
    }
    let h = word & !RWSEM_OWNER_FLAGS;
    if h == 0 {
        return;
    }
    id.tid = kread::u32_at(h + konst(&KERNEL.task_pid) as u64);
    if id.tid == 0 {
        return;
    }
    id.tgid = kread::u32_at(h + konst(&KERNEL.task_tgid) as u64);
    id.tid_start = kread::u64_at(h + konst(&KERNEL.task_start_boottime) as u64);
    id.kind = holder_cause(h, regs_delta(task));
    let fs_off = konst(&KERNEL.task_fsbase);
    w.holder_fsbase = if fs_off == 0 {
        0
    } else {
        kread::u64_at(h + fs_off as u64)
    };
    let comm = kread::comm_at(h + konst(&KERNEL.task_comm) as u64);
    kread::set_comm(&mut w.holder_comm, &comm);
}

/// Whose lock `lock` is, if it is a profiled process's mmap_lock: the current task's own
/// mm's (nearly always), or another process's noted in `MM_OWNER`.
#[inline(always)]
fn owner_of(lock: u64, task: Task) -> Option<(u32, u64, bool)> {
    let off = konst(&KERNEL.mm_lock) as u64;
    let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
    if mm != 0 && mm + off == lock {
        let tgid = task.u32_at(konst(&KERNEL.task_tgid));
        if !passes_filter(tgid, task.addr()) {
            return None;
        }
        return Some((tgid, process_start(task.addr()), true));
    }
    let mm = lock.wrapping_sub(off);
    // SAFETY: a map lookup, the value copied out at once.
    let o = unsafe { MM_OWNER.get(mm) }.copied()?;
    if o.ctx_id != ctx_id(mm) {
        return None;
    }
    let mm_owner = konst(&KERNEL.mm_owner);
    let owner_task = if mm_owner == 0 {
        0
    } else {
        kread::u64_at(mm + mm_owner as u64)
    };
    // Torn down on another task's last reference (mm->owner cleared): it was profiled when
    // it was noted. Otherwise, is it (still) selected?
    if owner_task != 0 && !passes_filter(o.pid, owner_task) {
        return None;
    }
    Some((o.pid, o.start, false))
}

/// Notes a profiled process's lock, for other tasks' waits on it.
#[inline(always)]
fn note_lock(mm: u64, pid: u32, start: u64) {
    let id = ctx_id(mm);
    // SAFETY: a map lookup, the value copied out at once.
    if let Some(o) = unsafe { MM_OWNER.get(mm) }
        && o.pid == pid
        && o.ctx_id == id
    {
        return;
    }
    let o = MmOwner {
        start,
        ctx_id: id,
        pid,
        _pad: 0,
    };
    // A full map evicts its least used entry; a failed insert only loses the note.
    let _ = MM_OWNER.insert(mm, o, 0);
}

/// Whose lock a new waiter waits for: its owner, and its mm when it is the waiter's own.
#[repr(C)]
struct LockOf {
    owner_start: u64,
    /// 0 when the lock is another process's.
    own_mm: u64,
    owner: u32,
    _pad: u32,
}

/// The current thread's entry, made (and the thread announced) at its first wait.
#[inline(always)]
fn waiter(task: Task, tid: u32, of: &LockOf) -> Option<&'static mut Waiter> {
    let tid_start = task.u64_at(konst(&KERNEL.task_start_boottime));
    if let Some(p) = WAITERS.get_ptr_mut(tid) {
        // SAFETY: a map value; only its own thread (and the free program, once it cannot
        // wait any more) writes it.
        let w = unsafe { &mut *p };
        if w.tid_start == tid_start {
            return Some(w);
        }
    }
    new_waiter(task, tid, tid_start, of)
}

/// Makes the current thread's entry and announces the thread (out of line: once a thread);
/// notes its process's lock (`own_mm`, 0 when it waits for another's).
#[inline(never)]
fn new_waiter(task: Task, tid: u32, tid_start: u64, of: &LockOf) -> Option<&'static mut Waiter> {
    if of.own_mm != 0 {
        note_lock(of.own_mm, of.owner, of.owner_start);
    }
    let init = NEW_WAITER.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch element; programs do not migrate while they run.
    let init = unsafe { &mut *init };
    init.tid_start = tid_start;
    init.tid = tid;
    init.tgid = task.u32_at(konst(&KERNEL.task_tgid));
    let fs_off = konst(&KERNEL.task_fsbase);
    init.fsbase = if fs_off == 0 {
        0
    } else {
        kread::u64_at(task.addr() + fs_off as u64)
    };
    let comm = kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64);
    kread::set_comm(&mut init.comm, &comm);
    init.lock = 0;
    init.writes = 0;
    init.sample_left = 0;
    init.exiting = 0;
    init.cpu_reported = 0;
    init.sample_seq = 0;
    // (A pid reused since its last thread was freed replaces that thread's entry.) By
    // reference: a value would be copied to the stack first.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if WAITERS.insert(tid, &*init, 0).is_err() {
        bump(counter::NO_STATE);
        return None;
    }
    // Its start routine, read from its own memory now (no lock held: the wait has not begun).
    let off = konst(&SETTINGS.start_routine_off);
    let start_routine = if off != 0 && init.fsbase != 0 {
        kread::user_u64(init.fsbase + off as u64)
    } else {
        0
    };
    let who = Identity {
        tid,
        tgid: init.tgid,
        tid_start,
        fsbase: init.fsbase,
        comm,
    };
    accum::announce_thread(&who, of.owner, of.owner_start, start_routine);
    // SAFETY: as in `waiter`.
    WAITERS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn contention_begin(ctx: RawTracePointContext) -> i32 {
    // `unsigned int flags`, widened to the argument's 64 bits.
    let flags = ctx.arg::<u64>(1) & 0xffff_ffff;
    if flags != LCB_F_READ && flags != LCB_F_WRITE {
        return 0;
    }
    begin(ctx.arg(0), flags == LCB_F_WRITE);
    0
}

/// A contended wait for rwsem `lock` begins (the thread is about to sleep or spin for it;
/// no lock of its own is held here).
#[inline(always)]
fn begin(lock: u64, write: bool) {
    let task = Task::current();
    let Some((owner, owner_start, own)) = owner_of(lock, task) else {
        return;
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    // Its own process's lock is noted for other tasks' waits on it when the thread first
    // waits.
    let own_mm = if own {
        lock - konst(&KERNEL.mm_lock) as u64
    } else {
        0
    };
    let of = LockOf {
        owner_start,
        own_mm,
        owner,
        _pad: 0,
    };
    let Some(w) = waiter(task, tid, &of) else {
        return;
    };
    let kind = if !write {
        cause::READ
    } else if !own && task.u32_at(konst(&KERNEL.task_flags)) & PF_EXITING != 0 {
        cause::EXIT
    } else {
        timing::write_cause(task)
    };
    let key = StatsKey {
        owner,
        tid,
        kind,
        _pad: 0,
        owner_start,
        tid_start: w.tid_start,
    };
    // Made now, before the lock is held: the end only adds to it (if the map is full, the
    // end counts the wait as lost).
    let _ = accum::stats_entry_of(&key, w.tgid, &w.comm, w.fsbase);
    let mut seq = 0;
    if write {
        let s = sampling::pick_in(&mut w.writes, &mut w.sample_left);
        if s != 0 && sampling::sample(task, tid, w.tgid, owner, owner_start, kind, s) {
            seq = s;
        }
    }
    note_holder(w, lock, task);
    if w.lock == 0
        && let Some(n) = waiting_slot(tid)
    {
        atomic_add(n, 1);
    }
    w.owner = owner;
    w.owner_start = owner_start;
    w.kind = kind;
    w.sample_seq = seq as u32;
    w.lock = lock;
    w.start_ts = now();
}

#[raw_tracepoint(tracepoint = "contention_end")]
pub fn contention_end(ctx: RawTracePointContext) -> i32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(n) = waiting_slot(tid) else {
        return 0;
    };
    // SAFETY: a volatile read of an array element other CPUs change atomically.
    if unsafe { ptr::read_volatile(n) } == 0 {
        return 0;
    }
    // `int ret`: 0, or -EINTR for a killed waiter, which did not get the lock.
    let failed = ctx.arg::<u64>(1) as u32 != 0;
    end(ctx.arg(0), tid, failed);
    0
}

/// A contended wait ends: with the lock held unless it failed. A few lookups and stores.
#[inline(always)]
fn end(lock: u64, tid: u32, failed: bool) {
    let now = now();
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in `waiter`.
    let w = unsafe { &mut *p };
    // Another lock's end (the rwsem's own wait_lock, contended inside this wait), or
    // another thread's slot.
    if w.lock != lock || lock == 0 {
        return;
    }
    w.lock = 0;
    if let Some(n) = waiting_slot(tid) {
        atomic_add(n, u64::MAX);
    }
    let wait = now.wrapping_sub(w.start_ts);
    let key = StatsKey {
        owner: w.owner,
        tid,
        kind: w.kind,
        _pad: 0,
        owner_start: w.owner_start,
        tid_start: w.tid_start,
    };
    match stats_of(&key) {
        Some(e) => {
            let s = &mut e.stats;
            if failed {
                s.failed = s.failed.wrapping_add(1);
            } else {
                s.count = s.count.wrapping_add(1);
                s.wait_sum = s.wait_sum.wrapping_add(wait);
                if wait > s.wait_max {
                    s.wait_max = wait;
                }
                accum::add_hist(&mut s.wait_hist, wait);
            }
            accum::note_changed(&key, e);
        }
        None => accum::count_map_full(w.kind, (!failed) as u64, failed as u64),
    }
    charge(w, tid, wait);
    if w.sample_seq != 0 {
        let _ = STACKS.output::<SampleDone>(
            &SampleDone {
                tag: stack_record::DONE,
                tid,
                seq: w.sample_seq,
                _pad: 0,
                wait_ns: wait,
                hold_ns: 0,
            },
            sampling::wakeup_before(size_of::<SampleDone>() as u64),
        );
    }
    if w.exiting != 0 {
        notify_freed(w, Task::current());
    }
    note_activity();
}

/// `STATS`'s entry of `key`, as it stands.
#[inline(always)]
fn stats_of(key: &StatsKey) -> Option<&'static mut profiler_common::ThreadStats> {
    // SAFETY: a map value of the right type; only the thread the key names writes it.
    crate::maps::STATS
        .get_ptr_mut(key)
        .map(|p| unsafe { &mut *p })
}

/// Charges the wait to the writer that held the lock when it began, or to its readers. A
/// holder first charged is announced, as a waiter is: it may never wait itself, and its role
/// is told while it lives.
#[inline(always)]
fn charge(w: &Waiter, tid: u32, wait: u64) {
    if w.holder.kind == HOLDER_UNKNOWN || blockers::ours(w.tgid) {
        return;
    }
    let key = BlockedKey {
        owner: w.owner,
        waiter_tid: tid,
        holder_tid: w.holder.tid,
        holder_tgid: w.holder.tgid,
        holder_kind: w.holder.kind,
        waiter_op: if w.kind == cause::READ {
            READ as u32
        } else {
            WRITE as u32
        },
        owner_start: w.owner_start,
        waiter_start: w.tid_start,
        holder_start: w.holder.tid_start,
    };
    if blockers::add_blocked(&key, wait) && w.holder.tid != 0 {
        let who = Identity {
            tid: w.holder.tid,
            tgid: w.holder.tgid,
            tid_start: w.holder.tid_start,
            fsbase: w.holder_fsbase,
            comm: w.holder_comm,
        };
        accum::announce_thread(&who, w.owner, w.owner_start, 0);
    }
}

/// Tells userspace that a thread that waited is exiting: its entries are complete (every
/// wait is in `STATS` as it ends), to be read once /proc shows it gone.
#[inline(always)]
fn notify_freed(w: &Waiter, task: Task) {
    lifecycle::send_exit(
        exit_record::FREED,
        w.tid,
        w.tgid,
        w.tid_start,
        task.u64_at(konst(&KERNEL.task_cpu_ns)),
        boot_ns(),
    );
}

/// A thread is exiting: if it ever waited, userspace is told (it may still wait in exit_mm
/// or, the last thread, exit_mmap: those waits say it again).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn contention_exit(_ctx: RawTracePointContext) -> i32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: as in `waiter`.
    let w = unsafe { &mut *p };
    let task = Task::current();
    if w.tid_start != task.u64_at(konst(&KERNEL.task_start_boottime)) {
        return 0;
    }
    w.exiting = 1;
    notify_freed(w, task);
    0
}

/// A task is freed: its entry goes (it can wait no more).
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn contention_free(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let tid = kread::u32_at(task + konst(&KERNEL.task_pid) as u64);
    // SAFETY: a map lookup, the values copied out at once.
    let Some((start, lock)) = (unsafe { WAITERS.get(tid) }).map(|w| (w.tid_start, w.lock)) else {
        return 0;
    };
    if start != kread::u64_at(task + konst(&KERNEL.task_start_boottime) as u64) {
        return 0;
    }
    if lock != 0
        && let Some(n) = waiting_slot(tid)
    {
        atomic_add(n, u64::MAX);
    }
    let _ = WAITERS.remove(tid);
    0
}

/// Run by userspace before each reading (see its `flush_pending`): notes every profiled
/// process's lock for other tasks' waits on it (before any of its own threads waited, a
/// /proc reader's wait would otherwise be missed), and reports the CPU time of the threads
/// that waited.
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
    if tid == tgid {
        let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
        if mm != 0 && passes_filter(tgid, task.addr()) {
            note_lock(mm, tgid, process_start(task.addr()));
        }
    }
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: as in `waiter`; the iterator writes only `cpu_reported`, which nothing else
    // writes.
    let w = unsafe { &mut *p };
    let start = task.u64_at(konst(&KERNEL.task_start_boottime));
    let cpu = task.u64_at(konst(&KERNEL.task_cpu_ns));
    if w.tid_start != start || cpu == w.cpu_reported {
        return 0;
    }
    w.cpu_reported = cpu;
    let rec = ThreadCpu {
        tid,
        tgid,
        tid_start: start,
        cpu_ns: cpu,
        at_ns: boot_ns(),
    };
    // SAFETY: `meta` is the iterator's non-null metadata; its first field is the seq_file,
    // and `rec` a plain record on our stack of the length given.
    unsafe {
        bpf_seq_write(
            (*meta).cast(),
            ptr::from_ref(&rec).cast(),
            size_of::<ThreadCpu>() as u32,
        )
    };
    0
}
