use core::ptr;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, BPF_NOEXIST, bpf_map_type},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, bpf_probe_read_user_buf,
        generated::{bpf_task_pt_regs, bpf_task_storage_get},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use profiler_common::{
    COMM_LEN, Filter, KernelLayout, MAX_FILTER_COMMS, MAX_FILTER_PIDS, NewThread, STACK_BYTES,
    STACK_CHUNK, SampleDone, Settings, StackSample, StatsKey, ThreadStats, bucket_index, cause,
    counter, stack_record,
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
};

/// Run-time settings (`--stack-sample`), set by userspace at load time.
#[unsafe(no_mangle)]
static SETTINGS: Settings = Settings {
    stack_sample: 0,
    writes_only: 0,
};

/// `--writes-only` and this is a read acquisition: nothing to do.
#[inline(always)]
fn skip_read(write: bool) -> bool {
    !write && unsafe { ptr::read_volatile(&SETTINGS.writes_only) } != 0
}

/// Which owners to profile; set by userspace at load time (`--pid`, `--comm`).
#[unsafe(no_mangle)]
static FILTER: Filter = Filter::ALL;

/// Per-(owner, thread, kind) aggregates read by userspace. Sized at load time
/// (`--max-threads`); not preallocated, so that a large capacity costs nothing until used.
#[map]
static STATS: HashMap<StatsKey, ThreadStats> = HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// Health counters, see `profiler_common::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Userspace's reading epoch, bumped before each reading (see `ThreadStats::epoch`).
#[map]
static EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Keys of entries that changed in the current epoch, each once.
#[map]
static DIRTY: RingBuf = RingBuf::with_byte_size(1024 * 1024, 0);

/// Threads that exited after taking a profiled lock (their tids), so that userspace frees
/// their entries once it has read them last.
#[map]
static EXITED: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Threads seen for the first time (one event per thread), for userspace to classify.
#[map]
static NEW_THREADS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Sampled write stacks and their outcomes (only with `--stack-sample`).
#[map]
static STACKS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// A zeroed `ThreadStats` to insert from: the value is larger than the 512-byte BPF stack.
#[map]
static SCRATCH: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// Where a thread is in its current acquisition, plus a cache of which owner the last mm it
/// touched belongs to and whether that owner passes the filter.
#[repr(C)]
struct ThreadState {
    /// The mm of the cached resolution below.
    cached_mm: u64,
    cached_owner: u32,
    cached_tracked: u32,
    /// start_locking timestamp of the pending blocking acquire (0: none, e.g. a trylock).
    wait_start: u64,
    /// Held acquisition: its wait, when it was acquired, which mm and owner.
    wait_ns: u64,
    acq_ts: u64,
    held_mm: u64,
    held_owner: u32,
    /// 0: nothing held; otherwise 1 + the acquisition's kind (`cause::READ` or a write cause).
    held: u32,
    /// The write cause found at start_locking, for the pending acquisition.
    pending_cause: u32,
    /// Whether this thread was announced on NEW_THREADS.
    announced: u32,
    /// Writes started by this thread, for sampling one in `stack_sample`.
    writes: u32,
    /// Sequence number of the sampled acquisition pending or held (0: none).
    sample_seq: u32,
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
fn bump(idx: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *c += 1 };
    }
}

/// The current thread's state; created on first use when `create`.
#[inline(always)]
fn thread_state(create: bool) -> Option<&'static mut ThreadState> {
    let flags = if create {
        BPF_LOCAL_STORAGE_GET_F_CREATE as u64
    } else {
        0
    };
    let p = unsafe {
        bpf_task_storage_get(
            ptr::from_ref(&THREAD_STATE).cast_mut().cast(),
            bpf_get_current_task_btf(),
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

#[inline(always)]
unsafe fn read_u64(addr: u64) -> u64 {
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// Does the process owning the lock pass `--pid`/`--comm`? `owner_task` is a task of that
/// process (0 if unknown).
#[inline(always)]
fn passes_filter(k: &KernelLayout, owner: u32, owner_task: u64) -> bool {
    let f: &Filter = unsafe { &*ptr::from_ref(&FILTER) };
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

/// Resolves (and caches per thread) which process owns `mm` and whether it is profiled.
#[inline(always)]
fn resolve(st: &mut ThreadState, mm: u64) -> bool {
    if st.cached_mm == mm {
        return st.cached_tracked != 0;
    }
    let k = kernel();
    let task = unsafe { bpf_get_current_task() };
    let own_mm = unsafe { read_u64(task + k.task_mm as u64) };
    let (owner, owner_task) = if own_mm == mm {
        ((bpf_get_current_pid_tgid() >> 32) as u32, task)
    } else if k.mm_owner != 0 {
        // Another process's lock (e.g. reading /proc/PID/smaps): mm->owner names its process.
        let owner_task = unsafe { read_u64(mm + k.mm_owner as u64) };
        let tgid = if owner_task == 0 {
            0
        } else {
            unsafe { bpf_probe_read_kernel((owner_task + k.task_tgid as u64) as *const u32) }
                .unwrap_or(0)
        };
        (tgid, owner_task)
    } else {
        (0, 0)
    };
    let tracked = passes_filter(&k, owner, owner_task);
    st.cached_mm = mm;
    st.cached_owner = owner;
    st.cached_tracked = tracked as u32;
    tracked
}

/// The current thread's stats entry for (`owner`, `kind`), created on first use, and noted
/// on DIRTY if this is its first change in the current epoch.
#[inline(always)]
fn stats_entry(owner: u32, kind: u32) -> Option<&'static mut ThreadStats> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = StatsKey {
        owner,
        tid: pid_tgid as u32,
        kind,
        _pad: 0,
    };
    let entry = match STATS.get_ptr_mut(&key) {
        Some(p) => unsafe { &mut *p },
        None => new_stats_entry(&key, pid_tgid)?,
    };
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    if entry.epoch != epoch {
        entry.epoch = epoch;
        if DIRTY.output::<StatsKey>(&key, 0).is_err() {
            bump(counter::DIRTY_LOST);
        }
    }
    Some(entry)
}

#[inline(always)]
fn new_stats_entry(key: &StatsKey, pid_tgid: u64) -> Option<&'static mut ThreadStats> {
    let owner = key.owner;
    let init = SCRATCH.get_ptr_mut(0)?;
    let init = unsafe { &mut *init };
    init.tgid = (pid_tgid >> 32) as u32;
    init.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    let k = kernel();
    init.fsbase = if k.task_fsbase == 0 {
        0
    } else {
        unsafe { read_u64(bpf_get_current_task() + k.task_fsbase as u64) }
    };
    // NOEXIST: another program of this thread cannot race us, but keep existing data if so.
    // epoch 0 is never current (userspace starts at 1): a new entry is always noted.
    init.epoch = 0;
    let _ = STATS.insert(key, &*init, BPF_NOEXIST as u64);
    if let Some(st) = thread_state(false)
        && st.announced == 0
    {
        st.announced = 1;
        let _ = NEW_THREADS.output::<NewThread>(
            &NewThread {
                owner,
                tid: key.tid,
                tgid: init.tgid,
                _pad: 0,
                fsbase: init.fsbase,
                comm: init.comm,
            },
            0,
        );
    }
    match STATS.get_ptr_mut(key) {
        Some(p) => Some(unsafe { &mut *p }),
        None => {
            bump(counter::MAP_FULL);
            None
        }
    }
}

#[inline(always)]
fn add(hist: &mut [u32; profiler_common::HIST_BUCKETS], ns: u64) {
    if let Some(b) = hist.get_mut(bucket_index(ns)) {
        *b = b.wrapping_add(1);
    }
}

/// PF_EXITING and PF_KTHREAD in `task_struct.flags`.
const PF_EXITING: u32 = 0x4;
const PF_KTHREAD: u32 = 0x0020_0000;

/// Why the current thread takes the lock for write: the syscall it is in (x86_64
/// `pt_regs.orig_ax`, see `cause::of_syscall`), a page fault, or its exit.
#[inline(always)]
fn write_cause() -> u32 {
    let k = kernel();
    let task = unsafe { bpf_get_current_task() };
    let flags: u32 =
        unsafe { bpf_probe_read_kernel((task + k.task_flags as u64) as *const u32) }.unwrap_or(0);
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
    cause::of_syscall(unsafe { read_u64(regs + k.regs_orig_ax as u64) })
}

/// Copies the current thread's user registers and the top of its user stack to STACKS.
/// Runs at start_locking, before the lock is held.
#[inline(always)]
fn sample_stack(owner: u32, kind: u32, seq: u32) -> bool {
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

/// The outcome of a sampled acquisition, matched with its stack by (tid, seq).
#[inline(always)]
fn sample_done(seq: u32, wait: u64, hold: u64) {
    let _ = STACKS.output::<SampleDone>(
        &SampleDone {
            tag: stack_record::DONE,
            tid: bpf_get_current_pid_tgid() as u32,
            seq,
            _pad: 0,
            wait_ns: wait,
            hold_ns: hold,
        },
        0,
    );
}

#[inline(always)]
fn record(owner: u32, kind: u32, wait: u64, hold: u64) {
    let Some(stats) = stats_entry(owner, kind) else {
        return;
    };
    let s = &mut stats.stats;
    s.count = s.count.wrapping_add(1);
    s.wait_sum = s.wait_sum.wrapping_add(wait);
    if wait > s.wait_max {
        s.wait_max = wait;
    }
    s.hold_sum = s.hold_sum.wrapping_add(hold);
    if hold > s.hold_max {
        s.hold_max = hold;
    }
    add(&mut s.wait_hist, wait);
    add(&mut s.hold_hist, hold);
}

#[inline(always)]
fn record_failed(owner: u32, kind: u32) {
    if let Some(stats) = stats_entry(owner, kind) {
        stats.stats.failed = stats.stats.failed.wrapping_add(1);
    }
}

// The verifier needs constant context offsets, and rejects reads past a tracepoint's last
// argument at attach time, so each tracepoint prototype gets its own programs and userspace
// loads the ones the kernel's BTF describes.

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
    if resolve(st, mm) {
        // A write's cause (and sampled stack) is found now, before the lock is held, so it
        // adds nothing to holds.
        st.sample_seq = 0;
        st.pending_cause = if write {
            let c = write_cause();
            let every = unsafe { ptr::read_volatile(&SETTINGS.stack_sample) };
            if every != 0 {
                st.writes = st.writes.wrapping_add(1);
                if st.writes % every == 0 {
                    // Never 0, which means "not sampled".
                    let seq = st.writes / every;
                    let seq = if seq == 0 { 1 } else { seq };
                    if sample_stack(st.cached_owner, c, seq) {
                        st.sample_seq = seq;
                    }
                }
            }
            c
        } else {
            cause::READ
        };
        st.wait_start = unsafe { bpf_ktime_get_ns() };
    }
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

#[inline(always)]
fn acquire_returned<const WRITE_ARG: usize>(ctx: &RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    if skip_read((ctx.arg::<u64>(WRITE_ARG) & 0xff) != 0) {
        // Under --writes-only, a downgrade is not seen: its write hold ends at the release.
        return 0;
    }
    // A trylock has no start_locking before it, so the state may not exist yet.
    let Some(st) = thread_state(true) else {
        return 0;
    };
    if !resolve(st, mm) {
        return 0;
    }
    // `bool` arguments arrive as u64 slots; only the low byte is defined.
    let write = (ctx.arg::<u64>(WRITE_ARG) & 0xff) != 0;
    let success = (ctx.arg::<u64>(WRITE_ARG + 1) & 0xff) != 0;
    let now = unsafe { bpf_ktime_get_ns() };
    let started = st.wait_start;
    st.wait_start = 0;
    let owner = st.cached_owner;
    let kind = if !write {
        cause::READ
    } else if started != 0 && st.pending_cause != cause::READ {
        st.pending_cause
    } else {
        // A write trylock: no start_locking came first.
        write_cause()
    };
    if !success {
        if st.sample_seq != 0 {
            sample_done(st.sample_seq, now.wrapping_sub(started), 0);
            st.sample_seq = 0;
        }
        record_failed(owner, kind);
        return 0;
    }
    if st.held != 0 {
        if st.held != 1 + cause::READ && !write && started == 0 && st.held_mm == mm {
            // mmap_write_downgrade: the write hold ends here, a read hold begins.
            let hold = now.wrapping_sub(st.acq_ts);
            record(st.held_owner, st.held - 1, st.wait_ns, hold);
            if st.sample_seq != 0 {
                sample_done(st.sample_seq, st.wait_ns, hold);
                st.sample_seq = 0;
            }
        } else {
            bump(counter::UNPAIRED);
        }
    }
    st.wait_ns = if started == 0 {
        0
    } else {
        now.wrapping_sub(started)
    };
    st.acq_ts = now;
    st.held_mm = mm;
    st.held_owner = owner;
    st.held = 1 + kind;
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn mmap_lock_released(ctx: RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    let Some(st) = thread_state(false) else {
        return 0;
    };
    // Nothing held: acquired before we attached, or not profiled.
    if st.held == 0 || st.held_mm != mm {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let kind = st.held - 1;
    st.held = 0;
    let hold = now.wrapping_sub(st.acq_ts);
    record(st.held_owner, kind, st.wait_ns, hold);
    if st.sample_seq != 0 && kind != cause::READ {
        sample_done(st.sample_seq, st.wait_ns, hold);
        st.sample_seq = 0;
    }
    0
}

/// A thread exits: if it has stats entries, tell userspace. Fires once per thread exit, never
/// on the lock's hot path.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    if let Some(st) = thread_state(false)
        && st.announced != 0
    {
        let tid = bpf_get_current_pid_tgid() as u32;
        if EXITED.output::<u32>(&tid, 0).is_err() {
            bump(counter::EXITS_LOST);
        }
    }
    0
}
