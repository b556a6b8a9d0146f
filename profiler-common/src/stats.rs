//! The `STATS` map: what each thread's acquisitions of each kind added up to.

use bytemuck::{Pod, Zeroable};

use crate::{COMM_LEN, HIST_BUCKETS, zeroed};

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
    pub const ZERO: LockStats = zeroed();
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
    /// [`cause::READ`](crate::cause::READ), a write [`cause`](crate::cause), or
    /// [`cause::DOWNGRADE`](crate::cause::DOWNGRADE).
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
    pub const ZERO: ThreadStats = zeroed();
}
