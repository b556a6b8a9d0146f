//! What userspace shares with the programs: the settings it fixes at load time (globals in a
//! frozen read-only map, which the verifier knows, so branches on them cost nothing and dead
//! ones are removed) and the maps it reads.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr,
};

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::generated::bpf_loop,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    BlockedKey, BlockedVal, Filter, KernelLayout, LOCK_SLOTS, LockAcc, Settings, StackSample,
    StatsKey, ThreadStats, counter,
};

/// Kernel facts (struct offsets), set by userspace at load time from the running kernel's BTF.
#[unsafe(no_mangle)]
pub static KERNEL: KernelLayout = KernelLayout {
    task_mm: 0,
    task_tgid: 0,
    task_group_leader: 0,
    task_comm: 0,
    mm_owner: 0,
    task_flags: 0,
    task_fsbase: 0,
    regs_syscall: 0,
    regs_ip: 0,
    regs_sp: 0,
    regs_bp: 0,
    task_start_boottime: 0,
    task_pid: 0,
    mm_lock_count: 0,
    task_cpu_ns: 0,
    has_bpf_loop: 0,
    mm_exe_file: 0,
    file_dentry: 0,
    dentry_name_len: 0,
    dentry_name: 0,
    dentry_parent: 0,
    mm_ctx_id: 0,
    mm_lock: 0,
    rwsem_owner: 0,
    task_stack: 0,
    regs_lr: 0,
    task_run_delay: 0,
};

/// Run-time settings (`--stack-sample`, `--writes-only`, `--blockers`, ...).
#[unsafe(no_mangle)]
pub static SETTINGS: Settings = Settings {
    stack_sample: 0,
    writes_only: 0,
    blockers: 0,
    self_tgid: 0,
    strong_order: 0,
    start_routine_off: 0,
    spill_test: 0,
    sample_floor_ms: 0,
    floor_after_first: 0,
    max_stack_rate: 0,
};

/// With a bound on stacks a second (`Settings::max_stack_rate`), each process's sampling
/// rate and its stacks of the current window, by tgid (see `sampling::every_for`). LRU: a
/// process forgotten starts again at `--stack-sample`.
#[map]
pub static SAMPLE_RATE: LruHashMap<u32, profiler_common::SampleRate> =
    LruHashMap::with_max_entries(4096, 0);

/// With a sampling floor (`Settings::sample_floor_ms`), when each process last had a wait or
/// write sampled by it (ns, the programs' clock), by tgid. Per process, not per thread: what
/// needs the floor (a capture's `before.pb.gz`) is a process's window, and a floor per thread
/// cost the agent one unwound stack a second per waiting thread. LRU: a process gone is
/// forgotten, and one forgotten is only sampled once more.
#[map]
pub static FLOOR_LAST: LruHashMap<u32, u64> = LruHashMap::with_max_entries(4096, 0);

/// Which owners to profile (`--pid`, or the `SELECTED` map).
#[unsafe(no_mangle)]
pub static FILTER: Filter = Filter::ALL;

/// A load-time constant. Read through a volatile load, so that the compiler cannot fold the
/// placeholder value above; the verifier, which knows the frozen map's contents, folds it.
#[inline(always)]
pub fn konst<T: Copy>(r: &T) -> T {
    // SAFETY: `r` is a valid, aligned reference to plain data.
    unsafe { ptr::read_volatile(r) }
}

/// `--blockers`: waits are charged to the holds that made them wait.
#[inline(always)]
pub fn blockers_on() -> bool {
    konst(&SETTINGS.blockers) != 0
}

/// Per-(owner, thread, kind) statistics read by userspace: a copy of each thread's
/// accumulators (see `accum`), plus the rare acquisitions accumulated here directly. Sized at
/// load time (`--max-threads`); not preallocated, so that capacity costs nothing until used.
#[map]
pub static STATS: HashMap<StatsKey, ThreadStats> =
    HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// The selection (`Filter::use_selection`: the agent, `--comm`, `--children`): pid -> start
/// time in clock ticks, with how the process was selected (`profiler_common::selected_value`).
#[map]
pub static SELECTED: HashMap<u32, u64> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// A profiled address space's process, by `mm_struct` address, noted when one of its own
/// threads resolves its verdict (once per thread and selection change). When the last
/// reference to an exited process's address space is another task's (the profiler reading its
/// memory or /proc files), its `exit_mmap` runs on that task with `mm->owner` already cleared:
/// the teardown is charged to the process noted here. LRU: nothing to clean up.
#[map]
pub static MM_OWNER: LruHashMap<u64, MmOwner> = LruHashMap::with_max_entries(16384, 0);

/// [`MM_OWNER`]'s value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MmOwner {
    pub start: u64,
    /// The address space's `context.ctx_id` (0 where the kernel has none): an address is
    /// reused once its mm is freed, the id never is.
    pub ctx_id: u64,
    pub pid: u32,
    pub _pad: u32,
}

/// Bumped whenever `SELECTED` changes, by userspace (element 0, which it sets) or by the
/// kernel (element 1, an atomic add: a rename selected a process): threads then resolve
/// their own process's verdict again instead of trusting their cached one. Two elements, so
/// that neither side's bump can overwrite the other's.
#[map]
pub static SELECTION_GEN: Array<u32> = Array::with_max_entries(2, 0);

/// The selection's generation (both sides' bumps).
#[inline(always)]
pub fn selection_generation() -> u32 {
    let user = SELECTION_GEN.get(0).copied().unwrap_or(0);
    let kernel = SELECTION_GEN.get(1).copied().unwrap_or(0);
    user.wrapping_add(kernel)
}

/// Health counters, see `profiler_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Userspace's reading epoch (see `ThreadStats::epoch`). Userspace drains DIRTY *before*
/// bumping it, and we load it only after a full barrier that follows the entry's update, so a
/// change is either in the reading that follows or noted again for the next one.
#[map]
pub static EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Set when some thread has acquisitions for the flush iterator to hand over (its ring went
/// from empty to not, or a contended wait awaits its charge); userspace clears it before
/// running the iterator, and skips the iterator while it stays clear (idle threads cost
/// nothing).
#[map]
pub static ACTIVITY: Array<u32> = Array::with_max_entries(1, 0);

/// Notes that the iterator has work (a store only when the flag was clear).
#[inline(always)]
pub fn note_activity() {
    if let Some(p) = ACTIVITY.get_ptr_mut(0) {
        // SAFETY: an array element, valid for the map's life; a racy store of 1 is fine (any
        // writer writes 1, userspace writes 0 before it runs the iterator).
        unsafe {
            if ptr::read_volatile(p) == 0 {
                ptr::write_volatile(p, 1);
            }
        }
    }
}

// The rings' sizes count twice in the profiler's resident memory (their pages are mapped
// twice, for records that wrap around), and each of them has a fallback when it overflows.

/// Keys of entries that changed in the current epoch, each once (13,000 a reading; more, and
/// userspace reads the whole map instead).
#[map]
pub static DIRTY: RingBuf = RingBuf::with_byte_size(512 * 1024, 0);

/// Threads with profiler state that are exiting or freed (`ExitedThread`; 1,800 between two
/// readings; more, and userspace looks for exited processes itself).
#[map]
pub static EXITED: RingBuf = RingBuf::with_byte_size(128 * 1024, 0);

/// Threads whose first acquisitions were flushed (one event per thread), to classify early
/// (2,000 between two drains; the others are classified at the next reading).
#[map]
pub static NEW_THREADS: RingBuf = RingBuf::with_byte_size(128 * 1024, 0);

/// Sampled write stacks and their outcomes (sized by userspace for the sampling rate).
#[map]
pub static STACKS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// Set by userspace's stack copier before it waits with no period (nothing came for a
/// while); the next STACKS record wakes it and clears this (`sampling::wakeup_before`).
#[map]
pub static STACKS_WAKE: Array<u32> = Array::with_max_entries(1, 0);

/// Where a sample is assembled before the part of it that was read goes to `STACKS` (a
/// record reserved at full size would take 16 KiB of the ring for a 2 KiB stack).
#[map]
pub static SAMPLE_BUF: PerCpuArray<StackSample> = PerCpuArray::with_max_entries(1, 0);

/// Each profiled lock's hold times per holder (`--blockers`; one element when off).
#[map]
pub static LOCKS: Array<LockAcc> = Array::with_max_entries(LOCK_SLOTS, 0);

/// Waits charged to the holds that made them wait (`--blockers`), cumulative.
#[map]
pub static BLOCKED: HashMap<BlockedKey, BlockedVal> =
    HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// A zeroed `ThreadStats` to insert from: the value is larger than the 512-byte BPF stack.
#[map]
pub static SCRATCH: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// Adds `n` to health counter `idx`: per CPU, no sharing between CPUs, but atomic, since
/// where tracepoint programs can be preempted (Linux 7.x) another program may bump it on
/// this CPU in between a load and a store.
#[inline(always)]
pub fn bump_by(idx: u32, n: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(idx) {
        // SAFETY: a per-CPU array element, valid for the map's life; BPF_ATOMIC.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(c, n) };
    }
    crate::diag::counted(idx, n);
}

#[inline(always)]
pub fn bump(idx: u32) {
    bump_by(idx, 1)
}

/// Calls `cb(i, ctx)` for `i` in `0..n` (at most `MAX`), stopping when it returns non-zero.
/// With `bpf_loop` (5.17+) the verifier checks the callback once, whatever `n`; older kernels
/// get a bounded loop, verified once per iteration. The branch is on a load-time constant, so
/// only one of the two survives verification.
#[inline(always)]
pub fn for_each<const MAX: u32>(
    n: u32,
    cb: extern "C" fn(u64, *mut core::ffi::c_void) -> i64,
    ctx: *mut core::ffi::c_void,
) {
    let n = if n > MAX { MAX } else { n };
    if konst(&KERNEL.has_bpf_loop) != 0 {
        // SAFETY: `cb` has the callback signature bpf_loop expects, and `ctx` points to the
        // caller's stack, alive for the call.
        unsafe { bpf_loop(n, cb as *mut core::ffi::c_void, ctx, 0) };
    } else {
        for i in 0..MAX {
            if i >= n || cb(i as u64, ctx) != 0 {
                break;
            }
        }
    }
}
