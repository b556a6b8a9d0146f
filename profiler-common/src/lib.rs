//! Types shared by the eBPF programs (`profiler-ebpf`) and the userspace agent (`profiler`).
//!
//! Every type is `#[repr(C)]` with explicit padding so both sides agree on the layout byte for
//! byte; `aya::Pod` is implemented only with the `user` feature, keeping the eBPF side free of
//! userspace dependencies.
#![no_std]

use bytemuck::{Pod, Zeroable};

/// Number of log2 buckets per histogram. Bucket `i` holds durations `d` with
/// `2^(i-1) <= d < 2^i` nanoseconds (bucket 0 holds `d == 0`); the last bucket also takes
/// everything longer (2^38 ns is about 4.6 minutes).
pub const HIST_BUCKETS: usize = 40;

/// Largest number of `--pid` values the in-kernel filter holds.
pub const MAX_FILTER_PIDS: usize = 16;
/// Largest number of `--comm` values the in-kernel filter holds.
pub const MAX_FILTER_COMMS: usize = 8;
/// Length of a kernel task command name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Index of the read side in `[read, write]` pairs.
pub const READ: usize = 0;
/// Index of the write side in `[read, write]` pairs.
pub const WRITE: usize = 1;

/// What an acquisition was for: [`cause::READ`] for every read acquisition, otherwise the
/// syscall or kernel path that took the lock for write. Part of [`StatsKey`].
pub mod cause {
    pub const READ: u32 = 0;
    pub const MMAP: u32 = 1;
    pub const MUNMAP: u32 = 2;
    pub const MPROTECT: u32 = 3;
    pub const BRK: u32 = 4;
    pub const MADVISE: u32 = 5;
    pub const MREMAP: u32 = 6;
    /// A user page fault that needed the write lock (stack growth).
    pub const PAGE_FAULT: u32 = 7;
    /// The address space being torn down (exit_mmap), or any write by an exiting thread.
    pub const EXIT: u32 = 8;
    /// fork/clone copying the address space (dup_mmap write-locks the parent's mm).
    pub const FORK: u32 = 9;
    /// Anything else: mlock, prctl, execve, shmat, kernel threads (khugepaged)...
    pub const OTHER: u32 = 10;
    /// Not an acquisition: a write lock downgraded to a read lock (`mmap_write_downgrade`, by
    /// munmap, brk, mremap and stack growth). Its entry counts downgrades, and its hold is the
    /// read hold that follows; it never counts as a read acquisition.
    pub const DOWNGRADE: u32 = 11;
    pub const COUNT: u32 = 12;

    /// Report name of a write cause.
    pub fn name(c: u32) -> &'static str {
        match c {
            MMAP => "mmap",
            MUNMAP => "munmap",
            MPROTECT => "mprotect",
            BRK => "brk",
            MADVISE => "madvise",
            MREMAP => "mremap",
            PAGE_FAULT => "page_fault",
            EXIT => "exit",
            FORK => "fork",
            READ => "read",
            DOWNGRADE => "downgrade",
            _ => "other",
        }
    }

    /// `pt_regs.orig_ax` outside a syscall: x86 exception entry stores -1 there ("no syscall
    /// to restart"; the hardware error code goes to the handler as an argument).
    pub const NOT_A_SYSCALL: u64 = u64::MAX;
    /// x32 syscalls carry this bit in their number.
    const X32_SYSCALL_BIT: u64 = 0x4000_0000;

    /// The write cause of a user thread taking the lock for write, from x86_64
    /// `pt_regs.orig_ax` at its kernel entry: the syscall it is in, or, outside any syscall
    /// (`NOT_A_SYSCALL`), a user page fault: the only exception that takes mmap_lock for write
    /// (stack growth upgrading `lock_mm_and_find_vma`'s read lock).
    #[inline(always)]
    pub fn of_orig_ax(orig_ax: u64) -> u32 {
        if orig_ax == NOT_A_SYSCALL {
            return PAGE_FAULT;
        }
        match orig_ax & !X32_SYSCALL_BIT {
            9 => MMAP,
            11 => MUNMAP,
            10 | 329 => MPROTECT, // mprotect, pkey_mprotect
            12 => BRK,
            28 | 440 => MADVISE, // madvise, process_madvise
            25 => MREMAP,
            60 | 231 => EXIT,           // exit, exit_group
            56 | 57 | 58 | 435 => FORK, // clone, fork, vfork, clone3
            _ => OTHER,
        }
    }
}

/// Indices into the `COUNTERS` per-CPU array. Those marked "lost" are acquisitions that the
/// profile does not contain (never downgrades, which are not acquisitions).
pub mod counter {
    /// Lost: acquisitions whose stats entry could not be created because `STATS` was full
    /// (`--max-threads` too small); counted once each, never again when the entry is retried.
    pub const MAP_FULL: u32 = 0;
    /// Lost: a thread had a third mm_lock acquisition pending or held at once (the
    /// per-thread state tracks two: dup_mmap's parent and child locks).
    pub const NESTED: u32 = 1;
    /// Lost: per-thread state could not be allocated (task storage full or out of memory).
    pub const NO_STATE: u32 = 2;
    /// A sampled stack did not fit in the STACKS ring buffer (userspace fell behind).
    pub const STACKS_LOST: u32 = 3;
    /// A changed key did not fit in the DIRTY ring buffer: userspace must read everything.
    pub const DIRTY_LOST: u32 = 4;
    /// An exit notice did not fit in the EXITED ring buffer: userspace must look for exited
    /// threads itself.
    pub const EXITS_LOST: u32 = 5;
    /// Lost: a completed acquisition found its thread's pending ring full while another
    /// context was flushing it (a race with the flush iterator; should stay 0).
    pub const RING_FULL: u32 = 6;
    /// Not lost: a thread's pending ring filled up (many trylocks and no start_locking in
    /// between), so it was flushed at a release, while the lock was held.
    pub const FLUSH_UNDER_LOCK: u32 = 7;
    /// Lost: an exited thread's pending acquisitions could not be flushed (kept for the
    /// report's `lost.exit_flush`; the exit path and the iterator hand the final flush to each
    /// other, so it stays 0).
    pub const EXIT_FLUSH: u32 = 8;
    /// Not counted on purpose: a child's new mm locked inside fork's dup_mmap (the child has
    /// no pid of its own yet; the lock is uncontended and its hold lies within the parent's
    /// fork write hold).
    pub const FORK_CHILD: u32 = 9;
    /// Not acquisitions, so not lost: downgrades and failed trylocks whose entry could not be
    /// created because `STATS` was full (`uncounted.not_acquisitions_map_full`).
    pub const NOT_ACQUIRED_MAP_FULL: u32 = 10;
    /// Blockers, not acquisitions: contended waits not charged because their lock's slot
    /// in `LOCKS` was taken over by another lock (two profiled locks hashing alike).
    pub const BLOCKERS_OVERRUN: u32 = 11;
    /// Blockers: a contended wait completed while the thread's previous one was still to be
    /// charged (it held a lock ever since); its wait is not attributed.
    pub const BLOCKERS_BUSY: u32 = 12;
    /// Blockers: a (waiter, holder) entry could not be created because `BLOCKED` was full.
    pub const BLOCKERS_MAP_FULL: u32 = 13;
    /// Number of counters.
    pub const COUNT: u32 = 14;
}

/// Log2 bucket index of a duration in nanoseconds (`64 - ns.leading_zeros()`, capped); see
/// [`HIST_BUCKETS`].
///
/// Written for the BPF side, where it runs twice per accumulated acquisition: BPF has no
/// count-leading-zeros instruction (LLVM expands `leading_zeros` into some forty
/// instructions), and a binary search with branches makes the verifier walk every
/// combination of them. This narrows the value to its top byte without branches (at each
/// step, the sign of `2^k - 1 - v` says whether `v >= 2^k`), then looks the byte up.
#[inline(always)]
pub fn bucket_index(ns: u64) -> usize {
    // Below 2^63 first (a halving counted in b), for the sign trick below.
    let top = ns >> 63;
    let mut v = ns >> top;
    let mut b = top;
    let mut step = |k: u64| {
        let ge = ((1u64 << k) - 1).wrapping_sub(v) >> 63;
        let shift = ge * k;
        v >>= shift;
        b += shift;
    };
    step(32);
    step(16);
    step(8);
    // v < 256 here.
    let idx = (b + BIT_LENGTH[(v & 0xff) as usize] as u64) as usize;
    if idx >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        idx
    }
}

/// The bit length of each byte value (0 for 0).
static BIT_LENGTH: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 1;
    while i < 256 {
        t[i] = (8 - (i as u8).leading_zeros()) as u8;
        i += 1;
    }
    t
};

/// Aggregated acquisitions of one lock side (read or write) by one thread.
///
/// Sums wrap on overflow; histogram buckets are `u32` and wrap too: userspace only ever uses
/// differences between two reads (`wrapping_sub`), which stay exact as long as fewer than 2^32
/// acquisitions land in one bucket between two reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct LockStats {
    /// Successful acquisitions.
    pub count: u64,
    /// Acquisitions that returned without the lock (failed trylock, killed waiter).
    pub failed: u64,
    pub wait_sum: u64,
    pub wait_max: u64,
    pub hold_sum: u64,
    pub hold_max: u64,
    pub wait_hist: [u32; HIST_BUCKETS],
    pub hold_hist: [u32; HIST_BUCKETS],
}

impl LockStats {
    pub const ZERO: LockStats = LockStats {
        count: 0,
        failed: 0,
        wait_sum: 0,
        wait_max: 0,
        hold_sum: 0,
        hold_max: 0,
        wait_hist: [0; HIST_BUCKETS],
        hold_hist: [0; HIST_BUCKETS],
    };
}

/// Key of the `STATS` hash map: which mm's lock (by its owner process), which thread took
/// it, and what for (one entry for its reads, one per write cause it used, one for its
/// downgrades). Processes and threads are named by id *and* start time, so that a reused
/// pid or tid never adds to, or inherits, the entries of the one before it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct StatsKey {
    /// Thread group id of the process owning the `mm_struct` whose lock was taken
    /// (0 when the owner could not be determined).
    pub owner: u32,
    /// Thread id of the thread that took the lock.
    pub tid: u32,
    /// [`cause::READ`], a write [`cause`], or [`cause::DOWNGRADE`].
    pub kind: u32,
    pub _pad: u32,
    /// The owner's start time (`task_struct.start_boottime` of its group leader, ns since
    /// boot; `/proc/PID/stat` field 22 is this in clock ticks); 0 with owner 0.
    pub owner_start: u64,
    /// The thread's start time (`start_boottime`, ns since boot).
    pub tid_start: u64,
}

/// Value of the `STATS` hash map. Only the thread named by the key ever writes its entry, so
/// the entry needs neither atomics nor per-CPU copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ThreadStats {
    /// Thread group id of the thread that took the lock (differs from `owner` for foreign takers).
    pub tgid: u32,
    /// The `EPOCH` in which this entry last changed: the first change in each epoch puts the
    /// key on the `DIRTY` ring buffer, so that userspace reads only the entries that changed.
    pub epoch: u32,
    /// The thread's command name when its entry was created.
    pub comm: [u8; COMM_LEN],
    /// The thread's fs base (x86_64 TLS pointer: glibc's `struct pthread`) when its entry was
    /// created; userspace reads the thread's start routine there to tell its role.
    pub fsbase: u64,
    pub stats: LockStats,
}

impl ThreadStats {
    pub const ZERO: ThreadStats = ThreadStats {
        tgid: 0,
        epoch: 0,
        comm: [0; COMM_LEN],
        fsbase: 0,
        stats: LockStats::ZERO,
    };
}

/// Sent on the `NEW_THREADS` ring buffer when a thread's first acquisitions of a profiled
/// lock are flushed (outside the lock), so that userspace classifies it while it (very
/// likely) still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct NewThread {
    pub owner: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub owner_start: u64,
    pub tid_start: u64,
    pub fsbase: u64,
    pub comm: [u8; COMM_LEN],
    /// The thread's start routine, read from its glibc `struct pthread` (at the fs base, at
    /// the offset `Settings::start_routine_off` calibrated on our glibc) by the thread itself
    /// as it was announced: kept even if its process is gone when userspace reads the record,
    /// and meaningful only for a process that maps our C library. 0: not read.
    pub start_routine: u64,
}

/// Records of the `EXITED` ring buffer: a thread that had profiler state is exiting, or is
/// gone for good.
pub mod exit_record {
    /// The thread is exiting but its pending acquisitions could not be flushed yet (another
    /// context held its ring): wait for its `FREED`.
    pub const EXITING: u32 = 1;
    /// The exiting thread's acquisitions are flushed into `STATS` (at `sched_process_exit`,
    /// at any release after it, or when the task is freed): its entries may be read one last
    /// time and deleted. Sent again if it takes a lock after that (the last thread's
    /// exit_mmap).
    pub const FREED: u32 = 2;
    /// A profiled (or newly selected) process has exec'd: its name, maps and code are new
    /// (`tid` is the process's pid, `tid_start` its start time).
    pub const EXEC: u32 = 3;
    /// A process was selected as it forked from a selected one (`tid` is its pid,
    /// `tid_start` its start time): it runs its parent's image, in its parent's cgroup.
    pub const FORK: u32 = 4;
}

/// A record of the `EXITED` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ExitedThread {
    /// An [`exit_record`] tag.
    pub tag: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub tid_start: u64,
    /// The thread's CPU time (`se.sum_exec_runtime`, ns) when the notice was sent.
    pub cpu_ns: u64,
    /// When the notice was sent, ns since boot (the clock of `tid_start`).
    pub at_ns: u64,
    /// EXEC and FORK: the process's cgroup (v2 id), so that one gone before userspace could
    /// read its /proc entry is still labelled by its cgroup.
    pub cgroup_id: u64,
}

/// A profiled thread's CPU time, written by the flush iterator into its output (read by
/// userspace each time it runs the iterator) whenever it changed since the last time.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ThreadCpu {
    pub tid: u32,
    pub tgid: u32,
    pub tid_start: u64,
    /// `se.sum_exec_runtime`, ns.
    pub cpu_ns: u64,
    /// When it was read, ns since boot.
    pub at_ns: u64,
}

/// Bytes of user stack copied per sampled write (from the stack pointer up).
pub const STACK_BYTES: usize = 16384;
/// The stack is read in chunks, so that a stack shallower than `STACK_BYTES` (the top of the
/// mapping is near) still yields what is there.
pub const STACK_CHUNK: usize = 2048;

/// Decodes a plain-data record from a ring buffer or an iterator's output (their records are
/// 8-byte aligned at best, hence unaligned); `None` if `bytes` is too short.
pub fn read_record<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytes
        .get(..size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}

/// The eBPF programs' rare diagnostics, logged with aya-log (docs/cli.md, `--log-level`).
pub mod diag {
    /// Their `log` target: under the binary's own (`mmaplock_prof`), so that
    /// `RUST_LOG=mmaplock_prof=debug` takes them in with the rest.
    pub const LOG_TARGET: &str = "mmaplock_prof::ebpf";
    /// Each diagnostic is logged once a run: one flag per [`super::counter`] (their first
    /// non-zero), then [`ITER_LEFT_PENDING`], then one per syscall number from
    /// [`SYSCALLS_AT`] (the last one standing for every larger number).
    pub const ITER_LEFT_PENDING: u32 = super::counter::COUNT;
    pub const SYSCALLS_AT: u32 = 32;
    pub const SYSCALLS: u32 = 512;
    /// Entries of the eBPF side's once-flags map.
    pub const FLAGS: u32 = SYSCALLS_AT + SYSCALLS;
    const _: () = assert!(ITER_LEFT_PENDING < SYSCALLS_AT);
}

/// Records on the `STACKS` ring buffer start with one of these tags.
pub mod stack_record {
    /// A [`super::StackSample`], sent at `start_locking` (before the lock is held).
    pub const SAMPLE: u32 = 1;
    /// A [`super::SampleDone`], sent when that acquisition is released.
    pub const DONE: u32 = 2;
}

/// What a sampled write's record says before its stack: a [`stack_record::SAMPLE`] record on
/// the ring is this header followed by `stack_len` bytes of stack (not `STACK_BYTES`: a
/// record as long as the stack is deep keeps eight times more shallow samples in the ring).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct StackHeader {
    pub tag: u32,
    pub owner: u32,
    pub tid: u32,
    pub tgid: u32,
    /// The write cause.
    pub kind: u32,
    /// Per-thread sequence number, matched by the [`SampleDone`] of the same acquisition.
    pub seq: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Start time of the owner (see [`StatsKey::owner_start`]).
    pub owner_start: u64,
    /// Bytes of stack that follow (from `sp` up; a multiple of `STACK_CHUNK`).
    pub stack_len: u32,
    pub _pad: u32,
}

/// A sample as the eBPF side assembles it (in a per-CPU buffer) before sending the header and
/// the `stack_len` bytes of `stack` that were read.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct StackSample {
    pub head: StackHeader,
    pub stack: [u8; STACK_BYTES],
}

/// The outcome of a sampled acquisition: its wait and hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SampleDone {
    pub tag: u32,
    pub tid: u32,
    pub seq: u32,
    pub _pad: u32,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

/// Run-time settings, passed as the `SETTINGS` global at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Settings {
    /// Capture the user stack of one in this many write acquisitions per thread (0: never).
    pub stack_sample: u32,
    /// Non-zero: profile write acquisitions only (`--writes-only`). Read acquisitions then
    /// cost a few instructions; a downgraded write's hold runs to its final release.
    pub writes_only: u32,
    /// Non-zero: charge each wait to the holds that made it wait (`BLOCKED`): every write
    /// hold, and read holds released while a profiled writer waits, add their time to the
    /// lock's accumulators (`LOCKS`) at release.
    pub blockers: u32,
    /// The profiler's own process (tgid): its threads' acquisitions of a profiled lock are
    /// counted apart (`counter::PROFILER_OWN`, role `profiler`) and never charged as blockers.
    pub self_tgid: u32,
    /// Non-zero when the CPU orders stores (x86-64): a flush claim is then released with a
    /// plain store instead of an atomic exchange (the BPF instruction set has no release
    /// store; on weakly ordered CPUs the exchange is the barrier).
    pub strong_order: u32,
    /// Offset of `start_routine` in our glibc's `struct pthread` (0: unknown): a thread reads
    /// its own when it is announced (`NewThread::start_routine`).
    pub start_routine_off: u32,
}

/// Kernel facts the eBPF programs need, found by userspace in the running kernel's BTF and
/// passed as the `KERNEL` global at load time (offsets in bytes; 0 = absent).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KernelLayout {
    pub task_mm: u32,
    pub task_tgid: u32,
    pub task_group_leader: u32,
    pub task_comm: u32,
    /// `mm_struct.owner` (CONFIG_MEMCG); 0 when the kernel has none, and then a foreign
    /// thread's acquisition is charged to owner 0.
    pub mm_owner: u32,
    /// `task_struct.flags` (PF_EXITING, PF_KTHREAD).
    pub task_flags: u32,
    /// `task_struct.thread.fsbase` (x86_64).
    pub task_fsbase: u32,
    /// `pt_regs.orig_ax` (x86_64: the syscall number at kernel entry).
    pub regs_orig_ax: u32,
    /// `pt_regs.ip`, `pt_regs.sp`, `pt_regs.bp` (x86_64: the user registers at kernel entry).
    pub regs_ip: u32,
    pub regs_sp: u32,
    pub regs_bp: u32,
    /// `task_struct.start_boottime` (ns since boot, what /proc reports as a start time).
    pub task_start_boottime: u32,
    /// `task_struct.pid`.
    pub task_pid: u32,
    /// `mm_struct.mmap_lock.count` (the rwsem's count word): a blocking acquisition that
    /// finds the lock free takes no blockers snapshot (`--blockers`).
    pub mm_lock_count: u32,
    /// `task_struct.se.sum_exec_runtime` (a thread's CPU time, ns).
    pub task_cpu_ns: u32,
    /// Non-zero when the kernel has `bpf_loop` (Linux 5.17+): loops over a thread's pending
    /// acquisitions, accumulators and holder slots are then verified once, not per
    /// iteration, which is most of the attach time.
    pub has_bpf_loop: u32,
    /// The executable a process runs, for `--exe` selectors matched at exec:
    /// `mm_struct.exe_file`, `file.f_path.dentry`, `dentry.d_name.len`, `dentry.d_name.name`
    /// and `dentry.d_parent`.
    pub mm_exe_file: u32,
    pub file_dentry: u32,
    pub dentry_name_len: u32,
    pub dentry_name: u32,
    pub dentry_parent: u32,
    /// `mm_struct.context.ctx_id` (x86_64: an id the kernel gives each address space and never
    /// reuses; 0 elsewhere): tells a freed address space from a new one at the same address.
    pub mm_ctx_id: u32,
}

/// Holder slots per lock: a holder (thread and kind of hold) adds its hold times to slot
/// `holder_slot(tid, kind)`; two holders sharing a slot are charged as its latest one.
pub const HOLDER_SLOTS: usize = 64;
/// Locks whose holds are accumulated at once: a slot each, by a hash of the mm address.
pub const LOCK_SLOTS: u32 = 1024;

/// The slot of a holder (a thread, and what it held the lock for) in [`LockAcc::held`].
#[inline(always)]
pub fn holder_slot(tid: u32, kind: u32) -> usize {
    let h = (tid as u64 ^ ((kind as u64) << 24)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 58) as usize & (HOLDER_SLOTS - 1)
}

/// Who last added to a holder slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HolderId {
    pub tid_start: u64,
    pub tid: u32,
    pub tgid: u32,
    /// [`cause::READ`], a write cause, or [`cause::DOWNGRADE`].
    pub kind: u32,
    pub _pad: u32,
}

/// One lock's hold times, cumulative per holder slot (an element of the `LOCKS` array). A
/// waiter copies `held` when it starts waiting and when it gets the lock: the difference is
/// what each holder held the lock for while it waited, however many holds that was.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct LockAcc {
    /// The lock (`mm_struct` address) this slot accumulates now.
    pub mm: u64,
    /// Holds added so far (a waiter that saw none released during its wait has nothing to
    /// charge).
    pub releases: u64,
    /// The write hold in progress: its start (0: none) and its holder slot.
    pub cur_acq: u64,
    pub cur_slot: u64,
    /// The last hold added: when it ended and its slot (a waiter that got the lock later
    /// waited that long for it to be handed over).
    pub last_rel: u64,
    pub last_slot: u64,
    /// Profiled writers waiting for the lock now: while there are any, read holds are added
    /// too (only then can a read hold make anyone wait).
    pub waiting: u64,
    pub _pad: u64,
    pub held: [u64; HOLDER_SLOTS],
    pub ids: [HolderId; HOLDER_SLOTS],
}

/// Key of the `BLOCKED` map: who waited for which lock (the waiter's side), and whose hold
/// made it wait (the holder's side).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct BlockedKey {
    pub owner: u32,
    pub waiter_tid: u32,
    pub holder_tid: u32,
    pub holder_tgid: u32,
    /// The holder's hold: [`cause::READ`], a write cause, or [`cause::DOWNGRADE`].
    pub holder_kind: u32,
    /// [`READ`] or [`WRITE`]: what the waiter waited for.
    pub waiter_op: u32,
    pub owner_start: u64,
    pub waiter_start: u64,
    pub holder_start: u64,
}

/// Value of the `BLOCKED` map, cumulative (updated with atomic adds by any waiter).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockedVal {
    /// Waits that this holder's hold overlapped.
    pub waits: u64,
    /// The part of those waits charged to it, ns.
    pub wait_ns: u64,
}

/// Which processes to profile, decided in the kernel; passed as the `FILTER` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Filter {
    pub n_pids: u32,
    pub n_comms: u32,
    pub pids: [u32; MAX_FILTER_PIDS],
    pub comms: [[u8; COMM_LEN]; MAX_FILTER_COMMS],
    /// Non-zero: the `SELECTED` map decides instead (the agent, whose selection changes at
    /// run time): an owner is profiled when its pid is there with its start time.
    pub use_selection: u32,
    /// Nanoseconds per clock tick of /proc start times, to compare the kernel's start times
    /// with the ticks userspace put in `SELECTED`.
    pub ns_per_tick: u32,
    /// Non-zero (`--children`): a process forked by a selected one is selected at once, in
    /// the kernel, from its first acquisition on.
    pub follow_children: u32,
    pub _pad: u32,
}

/// In `SELECTED`'s values (start ticks), the mark of a process the kernel selected by the
/// selectors (at exec, or as the child of one): its forks are selected too, and an exec into
/// something the selectors do not match deselects it. Processes selected by pid have no mark.
pub const SELECTED_BY_RULE: u64 = 1 << 63;

/// Executable selectors (`--exe`) the kernel matches at exec: up to this many...
pub const MAX_EXE_SELECTORS: u32 = 16;
/// ...of up to this many path components...
pub const EXE_COMPONENTS: usize = 4;
/// ...each shorter than this (bytes, the kernel's inline dentry names).
pub const EXE_COMPONENT_LEN: usize = 32;
/// Cgroup subtrees (`--cgroup`) the kernel matches at exec.
pub const MAX_CGROUP_SELECTORS: u32 = 16;

/// An executable selector: the last components of the executable's path (the file it runs,
/// `mm->exe_file`), innermost first: `node` is `["node"]`, `*/bin/node` `["node", "bin"]`,
/// `/usr/bin/node` the same, anchored at the root of its file system.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ExeSelector {
    /// Components in use.
    pub n: u32,
    /// Non-zero: the path has no other component (its file system's root comes next).
    pub anchored: u32,
    pub lens: [u32; EXE_COMPONENTS],
    /// NUL-padded.
    pub comps: [[u8; EXE_COMPONENT_LEN]; EXE_COMPONENTS],
}

/// A cgroup subtree selector: the cgroup (v2) id of its root and that root's depth.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CgroupSelector {
    pub id: u64,
    pub level: u32,
    pub _pad: u32,
}

/// How many of each selector are in use (the `SEL_COUNTS` map: changes on SIGHUP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SelectorCounts {
    pub exes: u32,
    pub cgroups: u32,
    pub comms: u32,
    pub _pad: u32,
}

impl Filter {
    /// Everything passes.
    pub const ALL: Filter = Filter {
        n_pids: 0,
        n_comms: 0,
        pids: [0; MAX_FILTER_PIDS],
        comms: [[0; COMM_LEN]; MAX_FILTER_COMMS],
        use_selection: 0,
        ns_per_tick: 10_000_000,
        follow_children: 0,
        _pad: 0,
    };
}

#[cfg(feature = "user")]
mod user {
    use super::*;

    /// `aya::Pod` for types that are `bytemuck::Pod`, which the derive checks at compile
    /// time (repr(C), no padding, plain integers and arrays of them).
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `$t: bytemuck::Pod` (asserted below): any bit pattern is valid and
            // there are no padding bytes, which is what `aya::Pod` requires.
            unsafe impl aya::Pod for $t {}
            const _: fn() = || {
                fn is_pod<T: bytemuck::Pod>() {}
                is_pod::<$t>();
            };
        )*};
    }

    aya_pod!(
        LockStats,
        StatsKey,
        ThreadStats,
        NewThread,
        ExitedThread,
        ThreadCpu,
        Settings,
        KernelLayout,
        Filter,
        ExeSelector,
        CgroupSelector,
        SelectorCounts,
        HolderId,
        LockAcc,
        BlockedKey,
        BlockedVal,
    );
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::size_of;
    use std::vec;

    /// A record is read from any offset (rings align to 8 bytes, an iterator's output not at
    /// all), trailing bytes ignored; a short one is refused.
    #[test]
    fn records_are_read_unaligned_and_whole() {
        let rec = ThreadCpu {
            tid: 7,
            tgid: 5,
            tid_start: 1 << 40,
            cpu_ns: 123_456,
            at_ns: u64::MAX,
        };
        let mut bytes = vec![0xa5u8; 3];
        bytes.extend_from_slice(bytemuck::bytes_of(&rec));
        bytes.push(1);
        assert_eq!(read_record::<ThreadCpu>(&bytes[3..]), Some(rec));
        assert_eq!(read_record::<ThreadCpu>(&bytes[3..bytes.len() - 2]), None);
        assert_eq!(read_record::<u32>(&bytes[3..]), Some(7));
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<LockStats>(), 6 * 8 + 2 * 4 * HIST_BUCKETS);
        assert_eq!(size_of::<StatsKey>(), 32);
        assert_eq!(size_of::<ExitedThread>(), 48);
        assert_eq!(size_of::<ThreadCpu>(), 32);
        assert_eq!(
            size_of::<ThreadStats>(),
            16 + COMM_LEN + size_of::<LockStats>()
        );
        assert_eq!(size_of::<KernelLayout>(), 22 * 4);
        assert_eq!(size_of::<HolderId>(), 24);
        assert_eq!(size_of::<LockAcc>(), 64 + HOLDER_SLOTS * (8 + 24));
        assert_eq!(size_of::<BlockedKey>(), 6 * 4 + 3 * 8);
        assert_eq!(size_of::<BlockedVal>(), 16);
        assert!(HOLDER_SLOTS.is_power_of_two() && LOCK_SLOTS.is_power_of_two());
        // Holder slots spread: the threads of a process, and the kinds of one thread.
        let mut used = [0u32; HOLDER_SLOTS];
        for tid in 1000..1016 {
            used[holder_slot(tid, cause::MPROTECT)] += 1;
        }
        assert!(used.iter().filter(|&&n| n > 0).count() >= 10, "{used:?}");
        assert_ne!(holder_slot(7, cause::READ), holder_slot(7, cause::MUNMAP));
        assert_eq!(size_of::<StackHeader>(), 64);
        assert_eq!(size_of::<StackSample>(), 64 + STACK_BYTES);
        assert_eq!(size_of::<SampleDone>(), 32);
        assert_eq!(STACK_BYTES % STACK_CHUNK, 0);
        assert_eq!(size_of::<NewThread>(), 16 + 24 + COMM_LEN + 8);
        assert_eq!(
            size_of::<Filter>(),
            24 + 4 * MAX_FILTER_PIDS + COMM_LEN * MAX_FILTER_COMMS
        );
    }

    /// How the kernel fills `pt_regs.orig_ax` on x86_64: the syscall entry stores the
    /// syscall number (rax) there; every exception entry, the page fault included, stores -1
    /// (arch/x86/entry: "no syscall to restart"), and passes the hardware error code as an
    /// argument, never in orig_ax.
    #[test]
    fn write_causes_follow_how_the_kernel_sets_orig_ax() {
        use cause::*;
        // Syscall entry: orig_ax = the syscall number.
        assert_eq!(of_orig_ax(9), MMAP);
        assert_eq!(of_orig_ax(11), MUNMAP);
        assert_eq!(of_orig_ax(10), MPROTECT);
        assert_eq!(of_orig_ax(329), MPROTECT);
        assert_eq!(of_orig_ax(12), BRK);
        assert_eq!(of_orig_ax(28), MADVISE);
        assert_eq!(of_orig_ax(25), MREMAP);
        assert_eq!(of_orig_ax(231), EXIT);
        assert_eq!(of_orig_ax(56), FORK);
        assert_eq!(of_orig_ax(435), FORK);
        // x32 syscalls carry bit 30.
        assert_eq!(of_orig_ax(0x4000_0000 | 9), MMAP);
        // Small syscall numbers are syscalls, not fault error codes: shmat (30) with a
        // mapping to create, stat (4), poll (7), writev (20) stay as they are.
        assert_eq!(of_orig_ax(30), OTHER);
        assert_eq!(of_orig_ax(4), OTHER);
        assert_eq!(of_orig_ax(6), OTHER);
        assert_eq!(of_orig_ax(149), OTHER); // mlock
        // Exception entry (a user page fault growing the stack): orig_ax = -1.
        assert_eq!(of_orig_ax(NOT_A_SYSCALL), PAGE_FAULT);
        assert_eq!(of_orig_ax(-1i64 as u64), PAGE_FAULT);
        assert_eq!(name(MPROTECT), "mprotect");
        assert_eq!(name(DOWNGRADE), "downgrade");
        assert_eq!(name(COUNT + 5), "other");
    }

    /// The binary search agrees with the definition, at every power of two and its
    /// neighbours, and on a spread of other values.
    #[test]
    fn bucket_index_is_the_capped_bit_length() {
        let by_definition = |ns: u64| ((64 - ns.leading_zeros()) as usize).min(HIST_BUCKETS - 1);
        let mut values = vec![0, 1, 2, 3, u64::MAX, (1 << 63) - 1];
        for i in 0..64 {
            let p = 1u64 << i;
            values.extend([p - 1, p, p + 1]);
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            assert_eq!(bucket_index(v), by_definition(v), "{v}");
        }
    }

    #[test]
    fn bucket_boundaries() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1), 1);
        assert_eq!(bucket_index(2), 2);
        assert_eq!(bucket_index(3), 2);
        assert_eq!(bucket_index(4), 3);
        assert_eq!(bucket_index(1023), 10);
        assert_eq!(bucket_index(1024), 11);
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(bucket_index(1 << 38), HIST_BUCKETS - 1);
        assert_eq!(bucket_index((1 << 38) - 1), 38);
    }
}
