//! The programs. Two of them run while the lock is held (`acquire_returned` after the lock is
//! taken, `released` before it is let go), so those only take timestamps: a completed
//! acquisition goes into its thread's pending ring in task storage, and the statistics are
//! updated later, outside any locked window, by [`flush`]: at the thread's next
//! `start_locking` (when it holds no mm lock), from the flush iterator when userspace asks,
//! and once more when the thread is freed (after its last acquisition, exit_mmap's included).

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd, atomic_xchg},
    ptr,
};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, BPF_NOEXIST, bpf_map_type},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_task_btf,
        bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_buf,
        bpf_probe_read_user_buf,
        generated::{bpf_loop, bpf_task_pt_regs, bpf_task_storage_get},
    },
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use profiler_common::{
    BlockedKey, BlockedVal, COMM_LEN, ExitedThread, Filter, HIST_BUCKETS, HOLDER_SLOTS,
    KernelLayout, LOCK_SLOTS, LockAcc, MAX_FILTER_COMMS, MAX_FILTER_PIDS, NewThread, STACK_BYTES,
    STACK_CHUNK, SampleDone, Settings, StackSample, StatsKey, ThreadStats, bucket_index, cause,
    counter, exit_record, holder_slot, stack_record,
};

/// Set by userspace at load time from the running kernel's BTF.
#[unsafe(no_mangle)]
static KERNEL: KernelLayout = KernelLayout {
    task_mm: 0,
    task_tgid: 0,
    task_group_leader: 0,
    task_comm: 0,
    mm_owner: 0,
    task_flags: 0,
    task_fsbase: 0,
    regs_orig_ax: 0,
    regs_ip: 0,
    regs_sp: 0,
    regs_bp: 0,
    task_start_boottime: 0,
    task_pid: 0,
    mm_lock_count: 0,
};

/// Run-time settings (`--stack-sample`, `--writes-only`), set by userspace at load time.
#[unsafe(no_mangle)]
static SETTINGS: Settings = Settings {
    stack_sample: 0,
    writes_only: 0,
    blockers: 0,
};

/// Which owners to profile; set by userspace at load time (`--pid`, `--comm`).
#[unsafe(no_mangle)]
static FILTER: Filter = Filter::ALL;

/// Per-(owner, thread, kind) aggregates read by userspace. Sized at load time
/// (`--max-threads`); not preallocated, so that a large capacity costs nothing until used.
#[map]
static STATS: HashMap<StatsKey, ThreadStats> = HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// The agent's selection (`Filter::use_selection`): pid -> start time in clock ticks, kept
/// by userspace from its scans of /proc.
#[map]
static SELECTED: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// Bumped by userspace whenever `SELECTED` changes: threads then resolve their own process's
/// verdict again instead of trusting their cached one.
#[map]
static SELECTION_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// Health counters, see `profiler_common::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Userspace's reading epoch (see `ThreadStats::epoch`). Userspace drains DIRTY *before*
/// bumping it, and we load it only after a full barrier that follows the entry's update, so a
/// change is either in the reading that follows or noted again for the next one.
#[map]
static EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Keys of entries that changed in the current epoch, each once.
#[map]
static DIRTY: RingBuf = RingBuf::with_byte_size(1024 * 1024, 0);

/// Threads with profiler state that are exiting or freed (`ExitedThread`).
#[map]
static EXITED: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Threads whose first acquisitions were flushed (one event per thread), to classify.
#[map]
static NEW_THREADS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Sampled write stacks and their outcomes (only with `--stack-sample`).
#[map]
static STACKS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// Each profiled lock's hold times per holder (a slot per lock, by a hash of its mm address),
/// added at release: waits are charged to what the holders held meanwhile. An array, so that
/// the lookup under the lock is an address computation, not a hash-table walk.
#[map]
static LOCKS: Array<LockAcc> = Array::with_max_entries(LOCK_SLOTS, 0);

/// Waits charged to the holds that made them wait (`--blockers`), cumulative.
#[map]
static BLOCKED: HashMap<BlockedKey, BlockedVal> =
    HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// A zeroed `ThreadStats` to insert from: the value is larger than the 512-byte BPF stack.
#[map]
static SCRATCH: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// Slot states.
const FREE: u32 = 0;
const WAITING: u32 = 1;
const HELD: u32 = 2;

/// One mm lock a thread is waiting for or holding. Two per thread: fork's dup_mmap holds the
/// parent's lock for write while it takes the child's.
#[repr(C)]
struct Slot {
    mm: u64,
    owner_start: u64,
    /// start_locking timestamp (0: a trylock, which does not wait).
    start_ts: u64,
    acq_ts: u64,
    owner: u32,
    /// `cause::READ`, a write cause, or `cause::DOWNGRADE` (a downgraded write's read hold).
    kind: u32,
    state: u32,
    /// Sequence number of this acquisition's sampled stack (0: not sampled).
    sample_seq: u32,
    /// Blockers: the lock's `releases` when the wait began (`snap` holds its `held`), and
    /// the part of the write hold in progress then that lay before the wait, with its slot.
    releases0: u64,
    pre: u64,
    pre_slot: u32,
    /// 1: `snap` was taken for this wait.
    snapped: u32,
}

/// A contended wait to charge to what the holders held during it, outside the lock.
#[repr(C)]
struct Charge {
    mm: u64,
    wait: u64,
    owner_start: u64,
    /// Hold time before the wait began of the write hold in progress then, in `pre_slot`.
    pre: u64,
    pre_slot: u32,
    owner: u32,
    /// `READ` or `WRITE`.
    op: u32,
    /// 1 while this charge waits to be made.
    pending: u32,
    /// From the last hold's release to the acquisition (the lock handed over), and its slot.
    handover: u64,
    handover_slot: u32,
    _pad: u32,
    /// The lock's `held` at the acquisition (`snap`: when the wait began).
    held: [u64; HOLDER_SLOTS],
}

/// A completed acquisition, waiting in its thread's ring to be added to `STATS`.
#[repr(C)]
struct Done {
    owner_start: u64,
    wait: u64,
    hold: u64,
    owner: u32,
    kind: u32,
    sample_seq: u32,
    /// 1: the acquisition failed (trylock, killed waiter): counted in `failed`.
    failed: u32,
}

/// Completed acquisitions a thread can keep pending (a power of two).
const RING: u32 = 16;
/// Completed acquisitions one call of [`flush`] adds to STATS: the verifier walks the loop
/// once per iteration, so the programs that flush stay small; the free and iterator programs
/// call it until the ring is empty.
const FLUSH_BATCH: u32 = 8;

/// Owner resolution of the thread's own mm (cached: it is the mm taken nearly every time).
const NOT_TRACKED: u32 = 1;
const TRACKED: u32 = 2;

/// Per-thread state in task storage, freed by the kernel with the thread.
#[repr(C)]
struct ThreadState {
    /// Who the thread is; filled by the first flush or exit notice (`identify`).
    tid_start: u64,
    fsbase: u64,
    tid: u32,
    tgid: u32,
    comm: [u8; COMM_LEN],
    /// The thread's own mm and its resolution (0: not resolved yet).
    own_mm: u64,
    own_owner_start: u64,
    own_owner: u32,
    own_tracked: u32,
    /// `SELECTION_GEN` when the own verdict was cached.
    own_gen: u32,
    _pad3: u32,
    slots: [Slot; 2],
    /// Completed acquisitions written (only the thread itself, at release, writes it).
    head: u32,
    /// Completed acquisitions flushed (only the holder of `flushing` writes it).
    tail: u32,
    /// Whether this thread was announced on NEW_THREADS.
    announced: u32,
    /// Writes started by this thread, for sampling one in `stack_sample`.
    writes: u32,
    identified: u32,
    /// Whether the thread ever completed an acquisition of a profiled lock (only then are
    /// its exits announced).
    profiled: u32,
    /// Set at sched_process_exit: the thread's next releases (exit_mm's, the last thread's
    /// exit_mmap) are its last, and flush at once.
    exiting: u32,
    _pad2: u32,
    /// 1 while a context flushes the ring (claimed with a compare-and-swap; 64 bits, as the
    /// BPF instruction set without alu32 has 64-bit compare-and-swap only).
    flushing: u64,
    ring: [Done; RING as usize],
    /// The last contended wait, charged with the next flush (`--blockers`).
    charge: Charge,
    /// `held` of the lock being waited for, when the wait began (kept until the charge).
    snap: [u64; HOLDER_SLOTS],
}

/// A BTF-defined task local storage map: per-thread state that the kernel frees with the
/// thread, looked up without hashing or locks.
#[repr(C)]
struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
}

// SAFETY: the fields are placeholders that only describe the map in BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "THREAD_STATE")]
static THREAD_STATE: TaskStorage<ThreadState> = TaskStorage {
    r#type: ptr::null(),
    map_flags: ptr::null(),
    key: ptr::null(),
    value: ptr::null(),
    max_entries: ptr::null(),
};

#[inline(always)]
fn kernel() -> KernelLayout {
    // Volatile: the value is only known at load time, the compiler must not fold the default.
    unsafe { ptr::read_volatile(&KERNEL) }
}

#[inline(always)]
fn bump_by(idx: u32, n: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *c += n };
    }
}

#[inline(always)]
fn bump(idx: u32) {
    bump_by(idx, 1)
}

/// `--blockers`: waits are charged to the holds that made them wait.
#[inline(always)]
fn blockers_on() -> bool {
    (unsafe { ptr::read_volatile(&SETTINGS.blockers) }) != 0
}

/// The accumulator slot of the lock of `mm` (a multiplicative hash of its address).
#[inline(always)]
fn lock_acc(mm: u64) -> Option<&'static mut LockAcc> {
    let idx = (mm.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as u32 & (LOCK_SLOTS - 1);
    LOCKS.get_ptr_mut(idx).map(|p| unsafe { &mut *p })
}

/// The accumulator of `mm`'s lock, if its slot accumulates that lock now.
#[inline(always)]
fn lock_acc_of(mm: u64) -> Option<&'static mut LockAcc> {
    lock_acc(mm).filter(|a| unsafe { ptr::read_volatile(&a.mm) } == mm)
}

/// A write hold of `mm`'s lock begins (with the lock held: a few stores). While writers
/// wait, the time the lock stayed free since the last hold ended (the waiters not running
/// yet, or this thread taking the lock before them) is the hand-over after that hold: it
/// goes to that hold's slot, so that every moment of a wait is someone's hold or hand-over.
#[inline(always)]
fn note_write_hold(mm: u64, kind: u32, now: u64) {
    if let Some(a) = lock_acc_of(mm) {
        let last = a.last_rel;
        if last != 0 && now > last && unsafe { ptr::read_volatile(&a.waiting) } != 0 {
            let slot = a.last_slot as usize & (HOLDER_SLOTS - 1);
            if let Some(h) = a.held.get_mut(slot) {
                // Exclusive: no reader holds, none adds.
                *h = h.wrapping_add(now - last);
            }
        }
        a.last_rel = 0;
        let tid = bpf_get_current_pid_tgid() as u32;
        a.cur_slot = holder_slot(tid, kind) as u64;
        a.cur_acq = now;
    }
}

/// A read hold of `mm`'s lock begins while writers wait: like a write hold's beginning, the
/// lock's time free since the last hold ended goes to that hold (readers begin at once:
/// whoever takes the last release's time first charges it).
#[inline(always)]
fn note_read_hold(mm: u64, now: u64) {
    let Some(a) = lock_acc_of(mm) else {
        return;
    };
    if unsafe { ptr::read_volatile(&a.waiting) } == 0 {
        return;
    }
    let last = unsafe { ptr::read_volatile(&a.last_rel) };
    if last == 0 || now <= last {
        return;
    }
    let slot = a.last_slot as usize & (HOLDER_SLOTS - 1);
    let (_, won) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
            &mut a.last_rel,
            last,
            0,
        )
    };
    if won && let Some(h) = a.held.get_mut(slot) {
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(h, now - last) };
    }
}

/// A hold of `mm`'s lock ends (with the lock held: a few stores): its time goes to its
/// holder's slot. A read hold counts only while a profiled writer waits for the lock: only
/// then can it make anyone wait (readers wait for readers only behind a waiting writer).
#[inline(always)]
fn add_hold(st: &ThreadState, mm: u64, kind: u32, acq_ts: u64, now: u64) {
    let write = write_kind(kind);
    let Some(a) = lock_acc(mm) else {
        return;
    };
    let ours = unsafe { ptr::read_volatile(&a.mm) } == mm;
    if !write && (!ours || unsafe { ptr::read_volatile(&a.waiting) } == 0) {
        return;
    }
    if !ours {
        // The slot changes hands (two profiled locks hashing alike: rare); waiters of the
        // other lock notice and charge nothing.
        unsafe { ptr::write_volatile(&mut a.mm, mm) };
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let slot = holder_slot(tid, kind);
    if let Some(h) = a.held.get_mut(slot) {
        if write {
            // Write holds are exclusive: nobody else adds now.
            *h = h.wrapping_add(now.wrapping_sub(acq_ts));
        } else {
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(h, now.wrapping_sub(acq_ts))
            };
        }
    }
    if let Some(id) = a.ids.get_mut(slot)
        && (id.tid != tid || id.kind != kind)
    {
        id.tid = tid;
        id.tgid = (pid_tgid >> 32) as u32;
        id.kind = kind;
        // Identified at its first flush (never earlier: a vfork child runs on its parent's
        // mm, with its parent's name, until it execs); before that, read it here.
        id.tid_start = if st.identified != 0 {
            st.tid_start
        } else {
            let task = unsafe { bpf_get_current_task() };
            unsafe { read_u64(task + kernel().task_start_boottime as u64) }
        };
    }
    if write {
        a.cur_acq = 0;
    }
    a.last_rel = now;
    a.last_slot = slot as u64;
    // Only a hint that something was added (waiters compare it): readers releasing at once
    // may lose an increment, never all of them.
    a.releases = a.releases.wrapping_add(1);
}

/// Can the lock of `mm` be taken at once (no writer, no waiter; for a write, no reader
/// either)? Then a wait is not worth a snapshot for blockers.
#[inline(always)]
fn lock_free(mm: u64, write: bool) -> bool {
    let off = kernel().mm_lock_count;
    if off == 0 {
        return false;
    }
    let count = unsafe { read_u64(mm + off as u64) };
    if write { count == 0 } else { count & 7 == 0 }
}

/// Is `kind` a write hold's?
#[inline(always)]
fn write_kind(kind: u32) -> bool {
    kind != cause::READ && kind != cause::DOWNGRADE
}

/// A wait that was snapshotted for blockers ends (acquired, failed or stale): a writer no
/// longer waits.
#[inline(always)]
fn end_wait(s: &mut Slot, write: bool) {
    if s.snapped != 0 && write {
        if let Some(a) = lock_acc_of(s.mm) {
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut a.waiting, u64::MAX)
            };
        }
    }
}

/// `--writes-only` and this is a read acquisition: nothing to do.
#[inline(always)]
fn skip_read(write: bool) -> bool {
    !write && unsafe { ptr::read_volatile(&SETTINGS.writes_only) } != 0
}

/// The state of `task` (a BTF task pointer), created on first use when `create`.
#[inline(always)]
fn state_of(task: *mut c_void, create: bool) -> Option<&'static mut ThreadState> {
    let flags = if create {
        BPF_LOCAL_STORAGE_GET_F_CREATE as u64
    } else {
        0
    };
    let p = unsafe {
        bpf_task_storage_get(
            ptr::from_ref(&THREAD_STATE).cast_mut().cast(),
            task.cast(),
            ptr::null_mut(),
            flags,
        )
    };
    if p.is_null() {
        if create {
            bump(counter::NO_STATE);
        }
        None
    } else {
        Some(unsafe { &mut *p.cast::<ThreadState>() })
    }
}

/// The current thread's state.
#[inline(always)]
fn thread_state(create: bool) -> Option<&'static mut ThreadState> {
    state_of(unsafe { bpf_get_current_task_btf() }.cast(), create)
}

#[inline(always)]
unsafe fn read_u64(addr: u64) -> u64 {
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

#[inline(always)]
unsafe fn read_u32(addr: u64) -> u32 {
    unsafe { bpf_probe_read_kernel(addr as *const u32) }.unwrap_or(0)
}

/// Start time of the process `task` belongs to: its group leader's `start_boottime`.
#[inline(always)]
fn process_start(k: &KernelLayout, task: u64) -> u64 {
    let leader = unsafe { read_u64(task + k.task_group_leader as u64) };
    if leader == 0 {
        return 0;
    }
    unsafe { read_u64(leader + k.task_start_boottime as u64) }
}

/// Records who the thread is, from its task (a plain kernel address), once.
#[inline(always)]
fn identify(st: &mut ThreadState, task: u64) {
    if st.identified != 0 {
        return;
    }
    let k = kernel();
    st.tid = unsafe { read_u32(task + k.task_pid as u64) };
    st.tgid = unsafe { read_u32(task + k.task_tgid as u64) };
    st.tid_start = unsafe { read_u64(task + k.task_start_boottime as u64) };
    st.fsbase = if k.task_fsbase == 0 {
        0
    } else {
        unsafe { read_u64(task + k.task_fsbase as u64) }
    };
    let _ = unsafe {
        bpf_probe_read_kernel_buf((task + k.task_comm as u64) as *const u8, &mut st.comm)
    };
    st.identified = 1;
}

/// Does the process owning the lock pass `--pid`/`--comm`? `owner_task` is a task of that
/// process (0 if unknown).
#[inline(always)]
fn passes_filter(k: &KernelLayout, owner: u32, owner_task: u64) -> bool {
    let f: &Filter = unsafe { &*ptr::from_ref(&FILTER) };
    if unsafe { ptr::read_volatile(&f.use_selection) } != 0 {
        // The pid with the same start: a reused pid is not the selected process.
        let Some(&ticks) = (unsafe { SELECTED.get(&owner) }) else {
            return false;
        };
        let per_tick = unsafe { ptr::read_volatile(&f.ns_per_tick) } as u64;
        return owner_task != 0
            && per_tick != 0
            && process_start(k, owner_task) / per_tick == ticks;
    }
    let n_pids = unsafe { ptr::read_volatile(&f.n_pids) } as usize;
    let n_comms = unsafe { ptr::read_volatile(&f.n_comms) } as usize;
    if n_pids == 0 && n_comms == 0 {
        return true;
    }
    for i in 0..MAX_FILTER_PIDS {
        if i >= n_pids {
            break;
        }
        if unsafe { ptr::read_volatile(&f.pids[i]) } == owner {
            return true;
        }
    }
    if n_comms == 0 || owner_task == 0 {
        return false;
    }
    // The process's name is its thread group leader's comm.
    let leader = unsafe { read_u64(owner_task + k.task_group_leader as u64) };
    if leader == 0 {
        return false;
    }
    let mut comm = [0u8; COMM_LEN];
    if unsafe { bpf_probe_read_kernel_buf((leader + k.task_comm as u64) as *const u8, &mut comm) }
        .is_err()
    {
        return false;
    }
    for i in 0..MAX_FILTER_COMMS {
        if i >= n_comms {
            break;
        }
        let want = unsafe { ptr::read_volatile(&f.comms[i]) };
        if want == comm {
            return true;
        }
    }
    false
}

/// Which process owns `mm`, for a lock the current thread takes.
enum Owner {
    /// Profiled: its pid and start time.
    Tracked(u32, u64),
    /// Filtered out.
    Ignored,
    /// A child's new mm inside fork's dup_mmap: counted apart, never charged.
    ForkChild,
}

/// Resolves which process owns `mm`. The thread's own mm is cached (it is nearly every
/// lock a thread takes); another process's mm is resolved each time (rare, and a cached mm
/// address could be reused by another process's mm once freed).
#[inline(always)]
fn resolve(st: &mut ThreadState, mm: u64) -> Owner {
    let generation = SELECTION_GEN.get(0).copied().unwrap_or(0);
    if mm == st.own_mm && st.own_tracked != 0 && st.own_gen == generation {
        return if st.own_tracked == TRACKED {
            Owner::Tracked(st.own_owner, st.own_owner_start)
        } else {
            Owner::Ignored
        };
    }
    let k = kernel();
    let task = unsafe { bpf_get_current_task() };
    let own_mm = unsafe { read_u64(task + k.task_mm as u64) };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if own_mm == mm {
        let start = process_start(&k, task);
        let tracked = passes_filter(&k, tgid, task);
        st.own_mm = mm;
        st.own_owner = tgid;
        st.own_owner_start = start;
        st.own_tracked = if tracked { TRACKED } else { NOT_TRACKED };
        st.own_gen = generation;
        return if tracked {
            Owner::Tracked(tgid, start)
        } else {
            Owner::Ignored
        };
    }
    // dup_mmap write-locks the parent's mm (a FORK write held in a slot), then the child's.
    for s in &st.slots {
        if s.state == HELD && s.kind == cause::FORK && s.mm != mm {
            return Owner::ForkChild;
        }
    }
    if k.mm_owner == 0 {
        // No mm->owner in this kernel (no CONFIG_MEMCG): charged to owner 0.
        return if passes_filter(&k, 0, 0) {
            Owner::Tracked(0, 0)
        } else {
            Owner::Ignored
        };
    }
    // Another process's lock (e.g. reading /proc/PID/smaps): mm->owner names its process.
    let owner_task = unsafe { read_u64(mm + k.mm_owner as u64) };
    if owner_task == 0 {
        return if passes_filter(&k, 0, 0) {
            Owner::Tracked(0, 0)
        } else {
            Owner::Ignored
        };
    }
    let owner = unsafe { read_u32(owner_task + k.task_tgid as u64) };
    if owner == tgid {
        // A task of our own thread group whose mm is not ours yet: execve's new mm (a fork
        // child's was caught above by the held fork slot). It is this process's lock.
        let start = process_start(&k, task);
        return if passes_filter(&k, tgid, task) {
            Owner::Tracked(tgid, start)
        } else {
            Owner::Ignored
        };
    }
    if passes_filter(&k, owner, owner_task) {
        Owner::Tracked(owner, process_start(&k, owner_task))
    } else {
        Owner::Ignored
    }
}

/// PF_EXITING and PF_KTHREAD in `task_struct.flags`.
const PF_EXITING: u32 = 0x4;
const PF_KTHREAD: u32 = 0x0020_0000;

/// Why the current thread takes the lock for write: its exit, the syscall it is in, or a
/// user page fault (x86_64 `pt_regs.orig_ax`, see `cause::of_orig_ax`).
#[inline(always)]
fn write_cause() -> u32 {
    let k = kernel();
    let task = unsafe { bpf_get_current_task() };
    let flags = unsafe { read_u32(task + k.task_flags as u64) };
    if flags & PF_EXITING != 0 {
        return cause::EXIT;
    }
    if flags & PF_KTHREAD != 0 || k.regs_orig_ax == 0 {
        return cause::OTHER;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    if regs == 0 {
        return cause::OTHER;
    }
    cause::of_orig_ax(unsafe { read_u64(regs + k.regs_orig_ax as u64) })
}

/// Copies the current thread's user registers and the top of its user stack to STACKS.
/// Runs at start_locking, before the lock is held.
#[inline(always)]
fn sample_stack(owner: u32, owner_start: u64, kind: u32, seq: u32) -> bool {
    let k = kernel();
    if k.regs_sp == 0 {
        return false;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    if regs == 0 {
        return false;
    }
    let Some(mut entry) = STACKS.reserve::<StackSample>(0) else {
        bump(counter::STACKS_LOST);
        return false;
    };
    let e = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let sp = unsafe { read_u64(regs + k.regs_sp as u64) };
    unsafe {
        (*e).tag = stack_record::SAMPLE;
        (*e).owner = owner;
        (*e).tid = pid_tgid as u32;
        (*e).tgid = (pid_tgid >> 32) as u32;
        (*e).kind = kind;
        (*e).seq = seq;
        (*e).ip = read_u64(regs + k.regs_ip as u64);
        (*e).sp = sp;
        (*e).bp = read_u64(regs + k.regs_bp as u64);
        (*e).owner_start = owner_start;
        (*e)._pad = 0;
    }
    // Chunk by chunk, so that a stack whose mapping ends within STACK_BYTES still yields the
    // part that exists.
    let mut len = 0u32;
    for i in 0..STACK_BYTES / STACK_CHUNK {
        let off = i * STACK_CHUNK;
        let dst = unsafe { &mut (&mut (*e).stack)[off..off + STACK_CHUNK] };
        if unsafe { bpf_probe_read_user_buf((sp + off as u64) as *const u8, dst) }.is_err() {
            break;
        }
        len += STACK_CHUNK as u32;
    }
    unsafe { (*e).stack_len = len };
    entry.submit(0);
    true
}

// ---------------------------------------------------------------------------------------
// Flushing: pending acquisitions into STATS, outside any locked window.
// ---------------------------------------------------------------------------------------

/// Takes the right to flush `st`'s ring (the thread itself, the iterator, the exit program
/// may try at once).
#[inline(always)]
fn claim(st: &mut ThreadState) -> bool {
    // The bpfel target has no atomic types; the intrinsic compiles to BPF_CMPXCHG.
    let (_, won) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
            &mut st.flushing,
            0,
            1,
        )
    };
    won
}

#[inline(always)]
fn unclaim(st: &mut ThreadState) {
    // An exchange: the BPF instruction set has no release store; this is a full barrier.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(&mut st.flushing, 0) };
}

#[inline(always)]
fn add(hist: &mut [u32; HIST_BUCKETS], ns: u64) {
    if let Some(b) = hist.get_mut(bucket_index(ns)) {
        *b = b.wrapping_add(1);
    }
}

/// The entry of `key`, created on first use.
#[inline(always)]
fn stats_entry(key: &StatsKey, st: &ThreadState) -> Option<&'static mut ThreadStats> {
    if let Some(p) = STATS.get_ptr_mut(key) {
        return Some(unsafe { &mut *p });
    }
    let init = SCRATCH.get_ptr_mut(0)?;
    let init = unsafe { &mut *init };
    init.tgid = st.tgid;
    init.comm = st.comm;
    init.fsbase = st.fsbase;
    // epoch 0 is never current (userspace starts at 1): a new entry is always noted.
    init.epoch = 0;
    // NOEXIST: only the holder of this thread's flush claim inserts its keys.
    let _ = STATS.insert(key, &*init, BPF_NOEXIST as u64);
    match STATS.get_ptr_mut(key) {
        Some(p) => Some(unsafe { &mut *p }),
        None => {
            bump(counter::MAP_FULL);
            None
        }
    }
}

/// Adds one completed acquisition to its entry and notes the entry as changed.
#[inline(always)]
fn record(st: &ThreadState, d: &Done) {
    let key = StatsKey {
        owner: d.owner,
        tid: st.tid,
        kind: d.kind,
        _pad: 0,
        owner_start: d.owner_start,
        tid_start: st.tid_start,
    };
    let Some(entry) = stats_entry(&key, st) else {
        return;
    };
    let s = &mut entry.stats;
    if d.failed != 0 {
        // Atomic: a full barrier between the update and the epoch load below.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut s.failed, 1) };
    } else {
        s.wait_sum = s.wait_sum.wrapping_add(d.wait);
        if d.wait > s.wait_max {
            s.wait_max = d.wait;
        }
        s.hold_sum = s.hold_sum.wrapping_add(d.hold);
        if d.hold > s.hold_max {
            s.hold_max = d.hold;
        }
        add(&mut s.wait_hist, d.wait);
        add(&mut s.hold_hist, d.hold);
        // Last, and atomic: userspace tells changes by the count, and the barrier orders
        // the whole update before the epoch load.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut s.count, 1) };
    }
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    if entry.epoch != epoch {
        entry.epoch = epoch;
        if DIRTY.output::<StatsKey>(&key, 0).is_err() {
            bump(counter::DIRTY_LOST);
        }
    }
    if d.sample_seq != 0 {
        let _ = STACKS.output::<SampleDone>(
            &SampleDone {
                tag: stack_record::DONE,
                tid: st.tid,
                seq: d.sample_seq,
                _pad: 0,
                wait_ns: d.wait,
                hold_ns: d.hold,
            },
            0,
        );
    }
}

/// Tells userspace about a thread the first time its acquisitions are flushed.
#[inline(always)]
fn announce(st: &mut ThreadState, owner: u32, owner_start: u64) {
    if st.announced != 0 {
        return;
    }
    st.announced = 1;
    let _ = NEW_THREADS.output::<NewThread>(
        &NewThread {
            owner,
            tid: st.tid,
            tgid: st.tgid,
            _pad: 0,
            owner_start,
            tid_start: st.tid_start,
            fsbase: st.fsbase,
            comm: st.comm,
        },
        0,
    );
}

/// Adds up to [`FLUSH_BATCH`] of the thread's pending acquisitions to STATS. `task` is the
/// thread's task (a kernel address), to identify it the first time. Returns false if another
/// context is flushing.
#[inline(never)]
fn flush(st: &mut ThreadState, task: u64, with_charge: bool) -> bool {
    if !claim(st) {
        return false;
    }
    identify(st, task);
    if with_charge && blockers_on() && st.charge.pending != 0 {
        charge_wait(st);
    }
    let head = unsafe { ptr::read_volatile(&st.head) };
    let tail = st.tail;
    if st.announced == 0 && head != tail {
        let first = unsafe { st.ring.get_unchecked((tail & (RING - 1)) as usize) };
        let (owner, owner_start) = (first.owner, first.owner_start);
        announce(st, owner, owner_start);
    }
    let mut done = tail;
    for _ in 0..FLUSH_BATCH {
        if done == head {
            break;
        }
        // SAFETY: masked into the ring's bounds.
        let d = unsafe { st.ring.get_unchecked((done & (RING - 1)) as usize) };
        let d: &Done = unsafe { &*ptr::from_ref(d) };
        record(st, d);
        done = done.wrapping_add(1);
    }
    unsafe { ptr::write_volatile(&mut st.tail, done) };
    unclaim(st);
    true
}

/// Flushes the whole ring (its capacity is two batches), and the pending charge when no
/// lock is held (`with_charge`).
#[inline(always)]
fn flush_all(st: &mut ThreadState, task: u64, with_charge: bool) -> bool {
    flush(st, task, with_charge) && flush(st, task, false)
}

/// Charges the thread's last contended wait to the holders: each is charged what it held the
/// lock for during the wait (a hold in progress when the wait began, from then on). Read
/// holds overlap one another, so when the parts add up to more than the wait, each is scaled
/// down in proportion. Runs outside any lock, under the thread's flush claim. The slots are
/// walked with `bpf_loop`, so the verifier checks one slot, not 32 times two passes.
#[inline(never)]
fn charge_wait(st: &mut ThreadState) {
    st.charge.pending = 0;
    let (mm, wait) = (st.charge.mm, st.charge.wait);
    if wait == 0 || wait >= 1 << 40 {
        return;
    }
    let Some(acc) = lock_acc_of(mm) else {
        bump(counter::BLOCKERS_OVERRUN);
        return;
    };
    // The part of the hold in progress when the wait began that lay before it.
    let pre_slot = st.charge.pre_slot as usize & (HOLDER_SLOTS - 1);
    if let Some(s) = st.snap.get_mut(pre_slot) {
        *s = s.wrapping_add(st.charge.pre);
    }
    let mut ctx = ChargeCtx {
        st: ptr::from_mut(st),
        acc: ptr::from_mut(acc),
        wait,
        total: 0,
        scale: 0,
        pass: 0,
    };
    // Only through this pointer from here on: the callback reads and writes the context.
    let ctx = ptr::from_mut(&mut ctx);
    let cb = charge_slot as *mut c_void;
    unsafe { bpf_loop(HOLDER_SLOTS as u32, cb, ctx.cast(), 0) };
    let total = unsafe { ptr::read_volatile(&(*ctx).total) };
    if total == 0 {
        return;
    }
    // 16-bit fixed point: wait < 2^40 and each part is capped at the wait.
    let scale = if total > wait {
        (wait << 16) / total
    } else {
        1 << 16
    };
    unsafe {
        ptr::write_volatile(&mut (*ctx).scale, scale);
        ptr::write_volatile(&mut (*ctx).pass, 1);
        bpf_loop(HOLDER_SLOTS as u32, cb, ctx.cast(), 0)
    };
}

/// The state `charge_slot` works on, on `charge_wait`'s stack.
#[repr(C)]
struct ChargeCtx {
    st: *mut ThreadState,
    acc: *mut LockAcc,
    wait: u64,
    /// Pass 0 sums the slots' parts; pass 1 charges them, scaled by `scale / 2^16`.
    total: u64,
    scale: u64,
    pass: u64,
}

/// One holder slot of a charge (a `bpf_loop` callback; returns 0 to go on).
extern "C" fn charge_slot(i: u64, ctx: *mut c_void) -> i64 {
    let ctx = unsafe { &mut *ctx.cast::<ChargeCtx>() };
    let (st, acc) = unsafe { (&mut *ctx.st, &*ctx.acc) };
    let i = i as usize & (HOLDER_SLOTS - 1);
    let (Some(&end), Some(&begin)) = (st.charge.held.get(i), st.snap.get(i)) else {
        return 1;
    };
    // A hold begun before the wait can leave the slot below its start: nothing to charge.
    let d = end.wrapping_sub(begin);
    let c = &st.charge;
    let d = if i == c.handover_slot as usize & (HOLDER_SLOTS - 1) {
        d.wrapping_add(c.handover)
    } else {
        d
    };
    let d = if (d as i64) < 0 {
        0
    } else if d > ctx.wait {
        ctx.wait
    } else {
        d
    };
    if ctx.pass == 0 {
        ctx.total += d;
        return 0;
    }
    let part = (d * ctx.scale) >> 16;
    if part == 0 {
        return 0;
    }
    let Some(id) = acc.ids.get(i) else {
        return 1;
    };
    if id.tid == st.tid {
        // The slot is shared with one of the waiter's own holds, released since: whose
        // time it was cannot be told, so it stays unattributed.
        return 0;
    }
    let key = BlockedKey {
        owner: c.owner,
        waiter_tid: st.tid,
        holder_tid: id.tid,
        holder_tgid: id.tgid,
        holder_kind: id.kind,
        waiter_op: c.op,
        owner_start: c.owner_start,
        waiter_start: st.tid_start,
        holder_start: id.tid_start,
    };
    add_blocked(&key, part);
    0
}

#[inline(never)]
fn add_blocked(key: &BlockedKey, ns: u64) {
    let mut p = BLOCKED.get_ptr_mut(key);
    if p.is_none() {
        let _ = BLOCKED.insert(key, &BlockedVal::default(), BPF_NOEXIST as u64);
        p = BLOCKED.get_ptr_mut(key);
    }
    let Some(v) = p else {
        bump(counter::BLOCKERS_MAP_FULL);
        return;
    };
    // Atomic: waiters of one holder charge it from several CPUs at once.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut (*v).waits, 1);
        atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut (*v).wait_ns, ns);
    }
}

/// Puts a completed acquisition in the thread's ring. Runs with the lock held: stores only,
/// unless the ring is full.
#[inline(always)]
fn complete(st: &mut ThreadState, d: Done) {
    let head = st.head;
    let tail = unsafe { ptr::read_volatile(&st.tail) };
    if head.wrapping_sub(tail) >= RING {
        // Many trylocks and no start_locking in between: flush now, under the lock, rather
        // than lose them; counted so the cost is visible.
        if flush(st, unsafe { bpf_get_current_task() }, false) {
            bump(counter::FLUSH_UNDER_LOCK);
        } else {
            bump(counter::RING_FULL);
            return;
        }
    }
    let idx = (head & (RING - 1)) as usize;
    if let Some(slot) = st.ring.get_mut(idx) {
        *slot = d;
    }
    st.profiled = 1;
    bump(counter::COMPLETED);
    // The record before the index that publishes it (x86-64 keeps stores in order).
    unsafe { ptr::write_volatile(&mut st.head, head.wrapping_add(1)) };
}

/// The completed record of a held slot, released at `now`.
#[inline(always)]
fn done_of(s: &Slot, now: u64) -> Done {
    Done {
        owner_start: s.owner_start,
        wait: if s.start_ts == 0 {
            0
        } else {
            s.acq_ts.wrapping_sub(s.start_ts)
        },
        hold: now.wrapping_sub(s.acq_ts),
        owner: s.owner,
        kind: s.kind,
        sample_seq: s.sample_seq,
        failed: 0,
    }
}

// ---------------------------------------------------------------------------------------
// The tracepoints. The verifier needs constant context offsets, and rejects reads past a
// tracepoint's last argument at attach time, so each tracepoint prototype gets its own
// programs and userspace loads the ones the kernel's BTF describes.
// ---------------------------------------------------------------------------------------

/// Linux 6.14+: `(mm, write)`.
#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn mmap_lock_start_locking(ctx: RawTracePointContext) -> i32 {
    start_locking::<1>(&ctx)
}

/// Linux 5.8 to 6.13: `(mm, memcg_path, write)`.
#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn mmap_lock_start_locking_memcg(ctx: RawTracePointContext) -> i32 {
    start_locking::<2>(&ctx)
}

/// Before a blocking acquire, with no lock of this one held: the place to flush, to find a
/// write's cause and to sample its stack, none of which then adds to a hold.
#[inline(always)]
fn start_locking<const WRITE_ARG: usize>(ctx: &RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    let write = (ctx.arg::<u64>(WRITE_ARG) & 0xff) != 0;
    if skip_read(write) {
        return 0;
    }
    let Some(st) = thread_state(true) else {
        return 0;
    };
    // A thread waits for one lock at a time: a slot still waiting is stale (its acquire was
    // never seen), and is reused.
    for s in st.slots.iter_mut() {
        if s.state == WAITING {
            s.state = FREE;
            end_wait(s, write_kind(s.kind));
        }
    }
    let free0 = st.slots[0].state == FREE;
    let free1 = st.slots[1].state == FREE;
    // Holding nothing: flush what is pending (inside dup_mmap, the parent's lock is held).
    if free0
        && free1
        && (st.head != unsafe { ptr::read_volatile(&st.tail) } || st.charge.pending != 0)
    {
        flush(st, unsafe { bpf_get_current_task() }, true);
    }
    let (owner, owner_start) = match resolve(st, mm) {
        Owner::Tracked(o, s) => (o, s),
        // A fork child's lock is counted once, when acquired.
        Owner::Ignored | Owner::ForkChild => return 0,
    };
    let idx = if free0 {
        0
    } else if free1 {
        1
    } else {
        bump(counter::NESTED);
        return 0;
    };
    let mut sample_seq = 0;
    let kind = if write {
        let c = write_cause();
        let every = unsafe { ptr::read_volatile(&SETTINGS.stack_sample) };
        if every != 0 {
            st.writes = st.writes.wrapping_add(1);
            // At random, one in `every`: a counter would alias with periodic workloads (a
            // loop of mmap then munmap sampled one in an even N shows munmaps only).
            if every == 1 || unsafe { bpf_get_prandom_u32() } % every == 0 {
                // Never 0, which means "not sampled"; unique per thread.
                let seq = if st.writes == 0 { 1 } else { st.writes };
                if sample_stack(owner, owner_start, c, seq) {
                    sample_seq = seq;
                }
            }
        }
        c
    } else {
        cause::READ
    };
    // Blockers: what the holders had held when the wait began (one wait at a time: not
    // while the thread holds another lock).
    let mut snapped = 0;
    let (mut releases0, mut pre, mut pre_slot) = (0, 0, 0);
    if blockers_on()
        && idx == 0
        && st.charge.pending == 0
        && !lock_free(mm, write)
        && let Some(a) = lock_acc_of(mm)
    {
        releases0 = unsafe { ptr::read_volatile(&a.releases) };
        if write {
            // Read holds count while we wait (undone when the wait ends).
            unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut a.waiting, 1) };
        }
        let cur = unsafe { ptr::read_volatile(&a.cur_acq) };
        pre_slot = a.cur_slot as u32;
        // Marked even if the copy fails: `waiting` must be undone.
        snapped = 1;
        if unsafe {
            bpf_probe_read_kernel_buf(ptr::from_ref(&a.held).cast(), as_bytes(&mut st.snap))
        }
        .is_ok()
        {
            let now = unsafe { bpf_ktime_get_ns() };
            pre = if cur != 0 && now > cur { now - cur } else { 0 };
        }
    }
    let s = &mut st.slots[idx];
    s.mm = mm;
    s.owner = owner;
    s.owner_start = owner_start;
    s.kind = kind;
    s.sample_seq = sample_seq;
    s.releases0 = releases0;
    s.pre = pre;
    s.pre_slot = pre_slot;
    s.snapped = snapped;
    s.acq_ts = 0;
    s.state = WAITING;
    s.start_ts = unsafe { bpf_ktime_get_ns() };
    0
}

/// Linux 6.14+: `(mm, write, success)`.
#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn mmap_lock_acquire_returned(ctx: RawTracePointContext) -> i32 {
    acquire_returned::<1>(&ctx)
}

/// Linux 5.8 to 6.13: `(mm, memcg_path, write, success)`.
#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn mmap_lock_acquire_returned_memcg(ctx: RawTracePointContext) -> i32 {
    acquire_returned::<2>(&ctx)
}

/// After any acquire, with the lock held when it succeeded: timestamps and flags only.
#[inline(always)]
fn acquire_returned<const WRITE_ARG: usize>(ctx: &RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    // `bool` arguments arrive as u64 slots; only the low byte is defined.
    let write = (ctx.arg::<u64>(WRITE_ARG) & 0xff) != 0;
    if skip_read(write) {
        // Under --writes-only a downgrade is not seen: its write hold ends at the release.
        return 0;
    }
    // A trylock has no start_locking before it, so the state may not exist yet.
    let Some(st) = thread_state(true) else {
        return 0;
    };
    let success = (ctx.arg::<u64>(WRITE_ARG + 1) & 0xff) != 0;
    let now = unsafe { bpf_ktime_get_ns() };
    // One completed record at most, put in the ring at the end (one call site keeps the
    // program small for the verifier).
    if let Some(d) = on_acquire(st, mm, write, success, now) {
        complete(st, d);
    }
    0
}

/// The state change of an acquire; returns what it completed, if anything.
#[inline(always)]
fn on_acquire(st: &mut ThreadState, mm: u64, write: bool, success: bool, now: u64) -> Option<Done> {
    // The blocking acquire this ends (a thread waits for one lock at a time).
    let waiting = if st.slots[1].state == WAITING && st.slots[1].mm == mm {
        1
    } else if st.slots[0].state == WAITING && st.slots[0].mm == mm {
        0
    } else {
        2
    };
    if waiting < 2 {
        let s = &mut st.slots[waiting];
        if blockers_on() {
            end_wait(s, write);
        }
        if success {
            s.acq_ts = now;
            s.state = HELD;
            if blockers_on() {
                let (kind, snapped, releases0) = (s.kind, s.snapped, s.releases0);
                let (wait, pre, pre_slot) = (now.wrapping_sub(s.start_ts), s.pre, s.pre_slot);
                let (owner, owner_start) = (s.owner, s.owner_start);
                if write {
                    note_write_hold(mm, kind, now);
                } else {
                    note_read_hold(mm, now);
                }
                if snapped != 0 {
                    take_charge(
                        st,
                        mm,
                        releases0,
                        (now, wait),
                        (pre, pre_slot),
                        (owner, owner_start),
                        write,
                    );
                }
            }
            return None;
        }
        s.state = FREE;
        return Some(Done {
            owner_start: s.owner_start,
            wait: now.wrapping_sub(s.start_ts),
            hold: 0,
            owner: s.owner,
            kind: s.kind,
            sample_seq: s.sample_seq,
            failed: 1,
        });
    }
    // No start_locking: a downgrade of a write lock this thread holds, or a trylock.
    if !write && success {
        let i = if downgradable(&st.slots[1], mm) {
            1
        } else if downgradable(&st.slots[0], mm) {
            0
        } else {
            2
        };
        if i < 2 {
            // mmap_write_downgrade: the write hold ends, a read hold begins that is not a
            // read acquisition.
            if blockers_on() {
                let (kind, acq_ts) = (st.slots[i].kind, st.slots[i].acq_ts);
                add_hold(st, mm, kind, acq_ts, now);
            }
            let s = &mut st.slots[i];
            let d = done_of(s, now);
            s.kind = cause::DOWNGRADE;
            s.start_ts = 0;
            s.sample_seq = 0;
            s.acq_ts = now;
            return Some(d);
        }
    }
    let (owner, owner_start) = match resolve(st, mm) {
        Owner::Tracked(o, s) => (o, s),
        Owner::Ignored => return None,
        Owner::ForkChild => {
            bump(counter::FORK_CHILD);
            return None;
        }
    };
    // A write trylock (rare) finds its cause now.
    let kind = if write { write_cause() } else { cause::READ };
    if !success {
        return Some(Done {
            owner_start,
            wait: 0,
            hold: 0,
            owner,
            kind,
            sample_seq: 0,
            failed: 1,
        });
    }
    let idx = if st.slots[0].state == FREE {
        0
    } else if st.slots[1].state == FREE {
        1
    } else {
        bump(counter::NESTED);
        return None;
    };
    if blockers_on() {
        if write {
            note_write_hold(mm, kind, now);
        } else {
            note_read_hold(mm, now);
        }
    }
    let s = &mut st.slots[idx];
    s.mm = mm;
    s.owner = owner;
    s.owner_start = owner_start;
    s.kind = kind;
    s.sample_seq = 0;
    s.snapped = 0;
    s.start_ts = 0;
    s.acq_ts = now;
    s.state = HELD;
    None
}

/// At a contended acquisition (with the lock held): if holds were added during the wait,
/// what each holder slot held meanwhile is kept for the charge, made later outside the lock.
#[inline(always)]
fn take_charge(
    st: &mut ThreadState,
    mm: u64,
    releases0: u64,
    (now, wait): (u64, u64),
    (pre, pre_slot): (u64, u32),
    (owner, owner_start): (u32, u64),
    write: bool,
) {
    let Some(a) = lock_acc_of(mm) else {
        bump(counter::BLOCKERS_OVERRUN);
        return;
    };
    if unsafe { ptr::read_volatile(&a.releases) } == releases0 {
        return;
    }
    if st.charge.pending != 0 {
        bump(counter::BLOCKERS_BUSY);
        return;
    }
    // Waiting for the lock to be handed over after the last hold: charged to that hold.
    let last = unsafe { ptr::read_volatile(&a.last_rel) };
    let since = now.wrapping_sub(wait);
    // (A write acquisition added it to `held` already, and cleared `last_rel`.)
    let (handover, handover_slot) = if last > since && last < now {
        (now - last, a.last_slot as u32)
    } else {
        (0, 0)
    };
    let c = &mut st.charge;
    if unsafe { bpf_probe_read_kernel_buf(ptr::from_ref(&a.held).cast(), as_bytes(&mut c.held)) }
        .is_err()
    {
        return;
    }
    c.handover = handover;
    c.handover_slot = handover_slot;
    c.mm = mm;
    c.wait = wait;
    c.pre = pre;
    c.pre_slot = pre_slot;
    c.owner = owner;
    c.owner_start = owner_start;
    c.op = write as u32;
    c.pending = 1;
}

/// The bytes of an array of u64, to copy into.
#[inline(always)]
fn as_bytes(a: &mut [u64; HOLDER_SLOTS]) -> &mut [u8; HOLDER_SLOTS * 8] {
    unsafe { &mut *ptr::from_mut(a).cast() }
}

/// Is `s` a write lock of `mm` that a read acquire without start_locking downgrades?
#[inline(always)]
fn downgradable(s: &Slot, mm: u64) -> bool {
    s.state == HELD && s.mm == mm && s.kind != cause::READ && s.kind != cause::DOWNGRADE
}

/// Before the lock is let go: a timestamp, and the completed acquisition into the ring.
#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn mmap_lock_released(ctx: RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    let Some(st) = thread_state(false) else {
        return 0;
    };
    // The innermost lock first; nothing held: acquired before we attached, or not profiled.
    let idx = if st.slots[1].state == HELD && st.slots[1].mm == mm {
        1
    } else if st.slots[0].state == HELD && st.slots[0].mm == mm {
        0
    } else {
        return 0;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    if blockers_on() {
        let (kind, acq_ts) = (st.slots[idx].kind, st.slots[idx].acq_ts);
        add_hold(st, mm, kind, acq_ts, now);
    }
    let s = &mut st.slots[idx];
    s.state = FREE;
    let d = done_of(s, now);
    complete(st, d);
    if st.exiting != 0 {
        // The exit path only: nothing would flush this thread's ring before the task is
        // freed, which lazy RCU may put off for seconds. Its entries are then final (unless
        // it takes another lock, which flushes and announces again).
        // If the iterator holds the ring now, sched_process_free flushes what is left.
        flush_all(st, unsafe { bpf_get_current_task() }, false);
        notify_exit(st, exit_record::FREED);
    }
    0
}

/// `--children`: a process forked by a selected process is selected too, before it runs
/// (fires in the parent once the child exists; its acquisitions inside fork are the parent's
/// or uncounted). Threads are not processes: only a new thread group counts.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    let f: &Filter = unsafe { &*ptr::from_ref(&FILTER) };
    if unsafe { ptr::read_volatile(&f.follow_children) } == 0 {
        return 0;
    }
    let k = kernel();
    let parent: u64 = ctx.arg(0);
    let child: u64 = ctx.arg(1);
    let parent_tgid = unsafe { read_u32(parent + k.task_tgid as u64) };
    if unsafe { SELECTED.get(&parent_tgid) }.is_none() {
        return 0;
    }
    let pid = unsafe { read_u32(child + k.task_pid as u64) };
    let tgid = unsafe { read_u32(child + k.task_tgid as u64) };
    if pid == 0 || pid != tgid {
        return 0;
    }
    let per_tick = unsafe { ptr::read_volatile(&f.ns_per_tick) } as u64;
    if per_tick == 0 {
        return 0;
    }
    let ticks = unsafe { read_u64(child + k.task_start_boottime as u64) } / per_tick;
    if SELECTED.insert(&pid, &ticks, 0).is_err() {
        bump(counter::MAP_FULL);
    }
    0
}

/// A thread that took a profiled lock is exiting: its pending acquisitions are flushed now (no
/// lock is held here). It may still take locks after this (exit_mm on some kernels, the last
/// thread's exit_mmap): those releases flush and announce it again.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    if let Some(st) = thread_state(false)
        && st.profiled != 0
    {
        let task = unsafe { bpf_get_current_task() };
        identify(st, task);
        st.exiting = 1;
        // No lock is held here: flush now, for a thread that takes none after this.
        if flush_all(st, task, true) {
            notify_exit(st, exit_record::FREED);
        } else {
            // The iterator holds the ring: userspace waits for a later flush.
            notify_exit(st, exit_record::EXITING);
        }
    }
    0
}

#[inline(always)]
fn notify_exit(st: &ThreadState, tag: u32) {
    let rec = ExitedThread {
        tag,
        tid: st.tid,
        tgid: st.tgid,
        _pad: 0,
        tid_start: st.tid_start,
    };
    if EXITED.output::<ExitedThread>(&rec, 0).is_err() {
        bump(counter::EXITS_LOST);
    }
}

/// A task is freed (after an RCU grace period, which lazy RCU may stretch to seconds): the
/// safety net for anything `exit_files` did not see (it could not be attached, or the thread
/// took a lock after it); then userspace reads the entries once more.
#[btf_tracepoint(function = "sched_process_free")]
pub fn sched_process_free(ctx: BtfTracePointContext) -> i32 {
    let task: *mut c_void = ctx.arg(0);
    if task.is_null() {
        return 0;
    }
    let Some(st) = state_of(task, false) else {
        return 0;
    };
    if st.profiled != 0 && (st.head != st.tail || st.charge.pending != 0) {
        if !flush_all(st, task as u64, true) {
            bump_by(counter::EXIT_FLUSH, st.head.wrapping_sub(st.tail) as u64);
        }
        notify_exit(st, exit_record::FREED);
    }
    0
}

/// Flushes every live thread's pending acquisitions, when userspace reads the iterator (each
/// reading, and at the end of a run).
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub extern "C" fn flush_threads(ctx: *mut c_void) -> i32 {
    // struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }
    let task = unsafe { *(ctx as *const *mut c_void).add(1) };
    if task.is_null() {
        return 0;
    }
    if let Some(st) = state_of(task, false)
        && (st.head != unsafe { ptr::read_volatile(&st.tail) } || st.charge.pending != 0)
    {
        flush_all(st, task as u64, true);
    }
    0
}

// ---------------------------------------------------------------------------------------
// The floor: empty programs on the same tracepoints (`--floor`, for the benchmark).
// ---------------------------------------------------------------------------------------

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn floor_start_locking(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn floor_acquire_returned(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn floor_released(_ctx: RawTracePointContext) -> i32 {
    0
}

// The clock floor (`--floor-clock`): one clock read per run, the least any program that times
// acquisitions must do under the lock.

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn clock_start_locking(_ctx: RawTracePointContext) -> i32 {
    (unsafe { bpf_ktime_get_ns() } & 1) as i32
}

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn clock_acquire_returned(_ctx: RawTracePointContext) -> i32 {
    (unsafe { bpf_ktime_get_ns() } & 1) as i32
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn clock_released(_ctx: RawTracePointContext) -> i32 {
    (unsafe { bpf_ktime_get_ns() } & 1) as i32
}
