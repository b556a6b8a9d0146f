//! Indices into the `COUNTERS` per-CPU array. Those marked "lost" are acquisitions that the
//! profile does not contain (never downgrades, which are not acquisitions).

/// Lost: acquisitions whose stats entry could not be created because `STATS` was full
/// (`--max-threads` too small); counted once each, never again when the entry is retried.
pub const MAP_FULL: u32 = 0;
/// Lost: a thread had a third mm_lock acquisition pending or held at once (the
/// per-thread state tracks two: dup_mmap's parent and child locks).
pub const NESTED: u32 = 1;
/// Lost: per-thread state could not be allocated (task storage full or out of memory).
pub const NO_STATE: u32 = 2;
/// A sampled stack did not fit in the STACKS ring buffer (userspace fell behind), or could not
/// be taken: the write was counted by a program's second copy (the first skipped, 7.x).
pub const STACKS_LOST: u32 = 3;
/// A changed key did not fit in the DIRTY ring buffer: userspace must read everything.
pub const DIRTY_LOST: u32 = 4;
/// An exit notice did not fit in the EXITED ring buffer: userspace must look for exited
/// threads itself.
pub const EXITS_LOST: u32 = 5;
/// Lost: a completed acquisition found its thread's pending ring full while another
/// context was flushing it. No longer counted: such an acquisition is spilled
/// ([`SPILLED`]); kept so that the report's `lost.ring_full` keeps its place (always 0).
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
/// Not lost: lock events whose first program the kernel skipped (another thread was inside
/// it on that CPU, where tracepoint programs can be preempted) and the second copy handled.
pub const RESCUED: u32 = 14;
/// Not lost: completed acquisitions that found their thread's pending ring full while
/// another context (the flush iterator) held it, and went to the thread's spill entry in
/// `STATS` instead (see [`crate::cause::SPILLED`]): a hash update with the lock held.
pub const SPILLED: u32 = 15;
/// Contention mode, lost stacks: the holder's stack of a sampled wait begun behind a writer
/// of the waiter's own process could not be taken (its saved registers not found, or the
/// STACKS ring full).
pub const HOLDER_STACKS_LOST: u32 = 16;
/// Number of counters.
pub const COUNT: u32 = 17;
