//! Types shared by the eBPF programs (`profiler-ebpf`) and the userspace agent (`profiler`).
//!
//! Every type is `#[repr(C)]` with explicit padding so both sides agree on the layout byte for
//! byte; `aya::Pod` is implemented only with the `user` feature, keeping the eBPF side free of
//! userspace dependencies.
#![no_std]

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
    pub const COUNT: u32 = 11;

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
            _ => "other",
        }
    }

    /// The write cause of x86_64 syscall `nr` (`pt_regs.orig_ax` at kernel entry). In an
    /// exception, `orig_ax` holds the hardware error code instead: a user-mode page fault's
    /// has the user bit (4) set and fits in 6 bits, and none of the syscalls with those
    /// numbers (stat, poll, writev, pipe, getitimer, ...) takes mmap_lock for write.
    #[inline(always)]
    pub fn of_syscall(nr: u64) -> u32 {
        match nr {
            9 => MMAP,
            11 => MUNMAP,
            10 | 329 => MPROTECT, // mprotect, pkey_mprotect
            12 => BRK,
            28 | 440 => MADVISE, // madvise, process_madvise
            25 => MREMAP,
            60 | 231 => EXIT,           // exit, exit_group
            56 | 57 | 58 | 435 => FORK, // clone, fork, vfork, clone3
            n if n < 64 && n & 4 != 0 => PAGE_FAULT,
            _ => OTHER,
        }
    }
}

/// Indices into the `COUNTERS` per-CPU array.
pub mod counter {
    /// A thread's stats entry could not be created because `STATS` was full.
    pub const MAP_FULL: u32 = 0;
    /// An acquisition whose state was overwritten before its release (a thread holding two
    /// mmap_locks at once, e.g. its own and another process's): that acquisition is lost.
    pub const UNPAIRED: u32 = 1;
    /// Per-thread state could not be allocated (task storage full or out of memory).
    pub const NO_STATE: u32 = 2;
    /// A sampled stack did not fit in the STACKS ring buffer (userspace fell behind).
    pub const STACKS_LOST: u32 = 3;
    /// A changed key did not fit in the DIRTY ring buffer: userspace must read everything.
    pub const DIRTY_LOST: u32 = 4;
    /// An exited thread did not fit in the EXITED ring buffer: userspace must look for
    /// exited threads itself.
    pub const EXITS_LOST: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}

/// Log2 bucket index of a duration in nanoseconds; see [`HIST_BUCKETS`].
#[inline(always)]
pub fn bucket_index(ns: u64) -> usize {
    let idx = (64 - ns.leading_zeros()) as usize;
    if idx >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        idx
    }
}

/// Aggregated acquisitions of one lock side (read or write) by one thread.
///
/// Sums wrap on overflow; histogram buckets are `u32` and wrap too: userspace only ever uses
/// differences between two reads (`wrapping_sub`), which stay exact as long as fewer than 2^32
/// acquisitions land in one bucket between two reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
/// it, and what for (one entry for its reads, one per write cause it used).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatsKey {
    /// Thread group id of the process owning the `mm_struct` whose lock was taken
    /// (0 when the owner could not be determined).
    pub owner: u32,
    /// Thread id of the thread that took the lock.
    pub tid: u32,
    /// [`cause::READ`], or the write's [`cause`].
    pub kind: u32,
    pub _pad: u32,
}

/// Value of the `STATS` hash map. Only the thread named by the key ever writes its entry, so
/// the entry needs neither atomics nor per-CPU copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Sent on the `NEW_THREADS` ring buffer when a thread takes a profiled lock for the first
/// time, so that userspace classifies it at once, while it (very likely) still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewThread {
    pub owner: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub fsbase: u64,
    pub comm: [u8; COMM_LEN],
}

/// Bytes of user stack copied per sampled write (from the stack pointer up).
pub const STACK_BYTES: usize = 16384;
/// The stack is read in chunks, so that a stack shallower than `STACK_BYTES` (the top of the
/// mapping is near) still yields what is there.
pub const STACK_CHUNK: usize = 2048;

/// Records on the `STACKS` ring buffer start with one of these tags.
pub mod stack_record {
    /// A [`super::StackSample`], sent at `start_locking` (before the lock is held).
    pub const SAMPLE: u32 = 1;
    /// A [`super::SampleDone`], sent when that acquisition is released.
    pub const DONE: u32 = 2;
}

/// The user stack of a sampled write acquisition.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackSample {
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
    /// Valid bytes of `stack` (from `sp` up).
    pub stack_len: u32,
    pub _pad: u32,
    pub stack: [u8; STACK_BYTES],
}

/// The outcome of a sampled acquisition: its wait and hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Capture the user stack of one in this many write acquisitions per thread (0: never).
    pub stack_sample: u32,
    /// Non-zero: profile write acquisitions only (`--writes-only`). Read acquisitions then
    /// cost a few instructions; a downgraded write's hold runs to its final release.
    pub writes_only: u32,
}

/// Kernel facts the eBPF programs need, found by userspace in the running kernel's BTF and
/// passed as the `KERNEL` global at load time (offsets in bytes; 0 = absent).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

/// Which processes to profile, decided in the kernel; passed as the `FILTER` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    pub n_pids: u32,
    pub n_comms: u32,
    pub pids: [u32; MAX_FILTER_PIDS],
    pub comms: [[u8; COMM_LEN]; MAX_FILTER_COMMS],
}

impl Filter {
    /// Everything passes.
    pub const ALL: Filter = Filter {
        n_pids: 0,
        n_comms: 0,
        pids: [0; MAX_FILTER_PIDS],
        comms: [[0; COMM_LEN]; MAX_FILTER_COMMS],
    };
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all types are repr(C), contain only integers and arrays of integers, and have no
    // implicit padding (checked by the layout tests below).
    unsafe impl aya::Pod for LockStats {}
    unsafe impl aya::Pod for StatsKey {}
    unsafe impl aya::Pod for ThreadStats {}
    unsafe impl aya::Pod for NewThread {}
    unsafe impl aya::Pod for Settings {}
    unsafe impl aya::Pod for KernelLayout {}
    unsafe impl aya::Pod for Filter {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<LockStats>(), 6 * 8 + 2 * 4 * HIST_BUCKETS);
        assert_eq!(size_of::<StatsKey>(), 16);
        assert_eq!(
            size_of::<ThreadStats>(),
            16 + COMM_LEN + size_of::<LockStats>()
        );
        assert_eq!(size_of::<KernelLayout>(), 11 * 4);
        assert_eq!(size_of::<StackSample>(), 56 + STACK_BYTES);
        assert_eq!(size_of::<SampleDone>(), 32);
        assert_eq!(STACK_BYTES % STACK_CHUNK, 0);
        assert_eq!(size_of::<NewThread>(), 16 + 8 + COMM_LEN);
        assert_eq!(
            size_of::<Filter>(),
            8 + 4 * MAX_FILTER_PIDS + COMM_LEN * MAX_FILTER_COMMS
        );
    }

    #[test]
    fn write_causes_from_syscall_numbers() {
        use cause::*;
        assert_eq!(of_syscall(9), MMAP);
        assert_eq!(of_syscall(11), MUNMAP);
        assert_eq!(of_syscall(10), MPROTECT);
        assert_eq!(of_syscall(12), BRK);
        assert_eq!(of_syscall(28), MADVISE);
        assert_eq!(of_syscall(25), MREMAP);
        assert_eq!(of_syscall(231), EXIT);
        assert_eq!(of_syscall(56), FORK);
        // A user write fault on a missing page: error code 6.
        assert_eq!(of_syscall(6), PAGE_FAULT);
        assert_eq!(of_syscall(149), OTHER); // mlock
        assert_eq!(of_syscall(u64::MAX), OTHER); // not in a syscall
        assert_eq!(name(MPROTECT), "mprotect");
        assert_eq!(name(COUNT + 5), "other");
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
