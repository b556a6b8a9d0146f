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

/// Index of the read side in [`ThreadStats::rw`].
pub const READ: usize = 0;
/// Index of the write side in [`ThreadStats::rw`].
pub const WRITE: usize = 1;

/// Indices into the `COUNTERS` per-CPU array.
pub mod counter {
    /// A thread's stats entry could not be created because `STATS` was full.
    pub const MAP_FULL: u32 = 0;
    /// An acquisition whose state was overwritten before its release (a thread holding two
    /// mmap_locks at once, e.g. its own and another process's): that acquisition is lost.
    pub const UNPAIRED: u32 = 1;
    /// Per-thread state could not be allocated (task storage full or out of memory).
    pub const NO_STATE: u32 = 2;
    /// Number of counters.
    pub const COUNT: u32 = 3;
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

/// Key of the `STATS` hash map: which mm's lock (by its owner process) and which thread took it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatsKey {
    /// Thread group id of the process owning the `mm_struct` whose lock was taken
    /// (0 when the owner could not be determined).
    pub owner: u32,
    /// Thread id of the thread that took the lock.
    pub tid: u32,
}

/// Value of the `STATS` hash map. Only the thread named by the key ever writes its entry, so
/// the entry needs neither atomics nor per-CPU copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadStats {
    /// Thread group id of the thread that took the lock (differs from `owner` for foreign takers).
    pub tgid: u32,
    pub _pad: u32,
    /// The thread's command name when its entry was created.
    pub comm: [u8; COMM_LEN],
    /// `[READ]` and `[WRITE]` sides.
    pub rw: [LockStats; 2],
}

impl ThreadStats {
    pub const ZERO: ThreadStats = ThreadStats {
        tgid: 0,
        _pad: 0,
        comm: [0; COMM_LEN],
        rw: [LockStats::ZERO; 2],
    };
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
        assert_eq!(size_of::<StatsKey>(), 8);
        assert_eq!(
            size_of::<ThreadStats>(),
            8 + COMM_LEN + 2 * size_of::<LockStats>()
        );
        assert_eq!(size_of::<KernelLayout>(), 5 * 4);
        assert_eq!(
            size_of::<Filter>(),
            8 + 4 * MAX_FILTER_PIDS + COMM_LEN * MAX_FILTER_COMMS
        );
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
