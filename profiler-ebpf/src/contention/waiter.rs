//! A thread that waits for a profiled lock: its entry in a preallocated hash map (no task
//! local storage here, see the module above), made and announced at its first wait, and
//! whose lock it waits for.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{HolderId, counter};

use crate::{
    announce::{self, Identity},
    kread::{self, Comm, Task},
    maps::{KERNEL, MM_OWNER, MmOwner, SETTINGS, bump, konst},
    owner::{ctx_id, passes_filter, process_start},
};

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
    /// The same for contended reads, one in `--stack-sample` of which has the stack of the
    /// writer it waits behind taken (not its own: samples are of writes).
    pub reads: u32,
    pub read_left: u32,
    /// The one-in-N each side's current gap was drawn at (see `sampling::pick_in`).
    pub write_every: u32,
    pub read_every: u32,
    /// 1 once its exit was announced: a wait after that (exit_mm, the last thread's
    /// exit_mmap) announces it again, as full mode's releases do.
    pub exiting: u32,
    /// CPU time when last reported by the iterator.
    pub cpu_reported: u64,
    /// The last floor sample of its process it knows of (see `sampling::floor_due`).
    pub floor_seen_ns: u64,
}


/// Threads that waited for a profiled lock, by tid (sized at load time; preallocated: no
/// allocation under a contended lock).
#[map]
pub static WAITERS: HashMap<u32, Waiter> = HashMap::with_max_entries(16384, 0);

/// Where a new `WAITERS` value is assembled (too large to build on the 512-byte stack with
/// stores the verifier accepts cheaply).
#[map]
static NEW_WAITER: PerCpuArray<Waiter> = PerCpuArray::with_max_entries(1, 0);

/// Whose lock `lock` is, if it is a profiled process's mmap_lock: the current task's own
/// mm's (nearly always), or another process's noted in `MM_OWNER`.
#[inline(always)]
pub fn owner_of(lock: u64, task: Task) -> Option<(u32, u64, bool)> {
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
pub fn note_lock(mm: u64, pid: u32, start: u64) {
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
pub struct LockOf {
    pub owner_start: u64,
    /// 0 when the lock is another process's.
    pub own_mm: u64,
    pub owner: u32,
    pub _pad: u32,
}

/// The current thread's entry, made (and the thread announced) at its first wait.
#[inline(always)]
pub fn waiter(task: Task, tid: u32, of: &LockOf) -> Option<&'static mut Waiter> {
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
    init.reads = 0;
    init.read_left = 0;
    init.write_every = 0;
    init.read_every = 0;
    init.exiting = 0;
    init.cpu_reported = 0;
    init.floor_seen_ns = 0;
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
        kread::user_u64(init.fsbase.wrapping_add(off as i64 as u64))
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
    announce::announce_thread(&who, of.owner, of.owner_start, start_routine);
    // SAFETY: as in `waiter`.
    WAITERS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

