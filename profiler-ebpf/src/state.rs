//! Per-thread state, in task local storage: looked up without hashing or locks, and freed by
//! the kernel with the thread.
//!
//! Three maps, so that a thread pays memory only for what it uses: `VERDICT` (a few bytes:
//! is the lock of the thread's own mm profiled?) for every thread that takes any mm lock,
//! `THREAD_STATE` (lock slots, the ring of completed acquisitions, the accumulators: ~4 KiB)
//! only for threads that take a profiled lock, and `BLOCK_STATE` only with `--blockers`.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xchg},
    ptr,
};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type},
    helpers::generated::bpf_task_storage_get,
};
use profiler_common::{HOLDER_SLOTS, LockStats, counter};

use crate::{
    kread::{Comm, Task},
    maps::{SETTINGS, bump, konst},
};

/// Where a slot's acquisition is. `Free` is 0: a thread's state is created zeroed by the
/// kernel, and only these values are ever stored.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free = 0,
    Waiting = 1,
    Held = 2,
}

/// One mm lock a thread is waiting for or holding. Two per thread: fork's dup_mmap holds the
/// parent's lock for write while it takes the child's. The fields the locked path touches
/// come first.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Slot {
    pub mm: u64,
    /// start_locking timestamp (0: a trylock, which does not wait).
    pub start_ts: u64,
    pub acq_ts: u64,
    pub state: SlotState,
    /// `cause::READ`, a write cause, or `cause::DOWNGRADE` (a downgraded write's read hold).
    pub kind: u32,
    pub owner_start: u64,
    pub owner: u32,
    /// Sequence number of this acquisition's sampled stack (0: not sampled; < 2^16).
    pub sample_seq: u16,
    /// 1: `--blockers` took a snapshot of the lock's holders when this wait began.
    pub snapped: u16,
}

/// A completed acquisition, waiting in its thread's ring to be accumulated (32 bytes: two
/// to a cache line).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Done {
    pub wait: u64,
    pub hold: u64,
    pub owner_start: u64,
    pub owner: u32,
    pub sample_seq: u16,
    pub kind: u8,
    /// 1: the acquisition failed (trylock, killed waiter): counted in `failed`.
    pub failed: u8,
}

/// One accumulator: a thread's acquisitions of one kind on its accumulators' lock,
/// cumulative over its life (what userspace reads is a copy).
#[repr(C)]
pub struct Acc {
    pub stats: LockStats,
    pub kind: u8,
    /// 1: changed since it was last copied to `STATS`.
    pub dirty: u8,
    /// 1: its `STATS` entry could not be created (the map was full): it is never copied, and
    /// what it gains is counted as lost.
    pub lost: u8,
    pub _pad: u8,
    /// Acquisitions and failed trylocks already counted as lost (`lost`), so that each is
    /// counted once (low 32 bits: only differences are used).
    pub lost_acquired: u32,
    pub lost_failed: u32,
    pub _pad2: u32,
}

/// Completed acquisitions a thread can keep pending (a power of two).
pub const RING: u32 = 16;
/// A thread accumulates its pending acquisitions at `start_locking` once this many are
/// pending (well under the ring's size, so that trylocks in between, or the iterator holding
/// the ring a moment, rarely fill it): the claim and the call are paid once per batch, not
/// per acquisition. The iterator takes the rest.
pub const FLUSH_AT: u32 = 6;
/// Accumulators per thread (a power of two): a thread's first this-many kinds of acquisition
/// on its own process's lock; further kinds and other processes' locks go to `STATS`
/// directly (rare).
pub const ACCS: u32 = 8;

/// Resolution of the lock of a thread's own mm: profiled or not (cached, since it is the
/// lock taken nearly every time).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OwnCache {
    pub mm: u64,
    pub owner_start: u64,
    pub owner: u32,
    /// 0: not resolved; [`NOT_TRACKED`] or [`TRACKED`].
    pub tracked: u32,
    /// `SELECTION_GEN` when resolved.
    pub generation: u32,
    pub _pad: u32,
}

impl OwnCache {
    /// A field-by-field copy (a struct assignment between two maps' values becomes a call of
    /// a byte-wise memmove).
    #[inline(always)]
    pub fn set(&mut self, o: &OwnCache) {
        self.mm = o.mm;
        self.owner_start = o.owner_start;
        self.owner = o.owner;
        self.tracked = o.tracked;
        self.generation = o.generation;
    }
}

pub const NOT_TRACKED: u32 = 1;
pub const TRACKED: u32 = 2;

/// The state of a thread that takes a profiled lock. What the locked path touches (the ring's
/// indices, the exit mark, the slots) comes first, near the storage header the lookup has
/// just read.
#[repr(C)]
pub struct ThreadState {
    /// Completed acquisitions written (only the thread itself, at release, writes it).
    pub head: u32,
    /// Completed acquisitions accumulated (only the holder of `flushing` writes it).
    pub tail: u32,
    /// Set at sched_process_exit: its next releases (exit_mm's, the last thread's exit_mmap)
    /// are its last, and flush at once.
    pub exiting: u32,
    /// 1: a contended wait waits in `BLOCK_STATE` to be charged (`--blockers`).
    pub charge_pending: u8,
    /// 1: the first copy of the lock programs ran for this thread's latest event (see
    /// `timing::this_copy_runs`).
    pub first_ran: u8,
    /// 1: the thread was announced on NEW_THREADS. It is announced at its first
    /// `start_locking` holding no lock, with the start routine it reads there itself, so that
    /// userspace learns its role while it runs, even in a process that lives a tenth of a
    /// second or a thread that takes one lock and then waits (otherwise not flushed before
    /// its exit, when its process may be gone and its role unreadable).
    pub announced: u16,
    pub slots: [Slot; 2],
    pub own: OwnCache,
    /// 1 while a context accumulates or copies (claimed with a compare-and-swap; 64 bits, as
    /// the BPF instruction set without alu32 has a 64-bit compare-and-swap only).
    pub flushing: u64,
    /// The last floor sample of its process this thread knows of (ns, the programs' clock;
    /// see `sampling::floor_due`).
    pub floor_seen_ns: u64,
    /// Writes started by this thread: the sequence numbers of its samples.
    pub writes: u32,
    /// Writes until the next sample (0: draw the next gap; see `sampling::pick`).
    pub sample_left: u32,
    /// The one-in-N the current gap was drawn at (see `sampling::pick_in`).
    pub sample_every: u32,
    /// Whether the thread accumulated an acquisition of a profiled lock (only then are its
    /// exits announced).
    pub profiled: u32,
    /// Some accumulator changed since the accumulators were last copied to `STATS`.
    pub dirty: u32,
    /// Accumulators in use, and which one holds each kind (index + 1; 0: none).
    pub accs_used: u32,
    pub acc_of_kind: [u8; 16],
    /// The lock the accumulators are for (the first profiled lock the thread took: its own
    /// process's, nearly always).
    pub acc_owner: u32,
    pub acc_owner_set: u32,
    pub acc_owner_start: u64,
    /// Who the thread is; filled by its first flush (outside any lock).
    pub tid_start: u64,
    pub fsbase: u64,
    /// Its glibc start routine, as read by the thread itself (0: not read).
    pub start_routine: u64,
    pub tid: u32,
    pub tgid: u32,
    pub comm: Comm,
    pub identified: u32,
    /// CPU time when last reported by the iterator.
    pub cpu_reported: u64,
    pub ring: [Done; RING as usize],
    pub accs: [Acc; ACCS as usize],
}

// A thread's state must fit the allocator's 4 KiB class with the storage element's header
// (72 bytes): one byte over doubles the kernel memory every profiled thread costs.
const _: () = assert!(size_of::<ThreadState>() + 72 <= 4096);

/// Blockers' part of a slot: what the lock's holders had held when its wait began.
#[repr(C)]
pub struct SlotSnap {
    /// The lock's `releases` when the wait began (`snap` holds its `held`), and the part of
    /// the write hold in progress then that lay before the wait, with its slot.
    pub releases0: u64,
    pub pre: u64,
    pub pre_slot: u32,
    /// 1: `snap` was taken for this wait.
    pub snapped: u32,
}

/// A contended wait to charge to what the holders held during it, outside the lock.
#[repr(C)]
pub struct Charge {
    pub mm: u64,
    pub wait: u64,
    pub owner_start: u64,
    /// Hold time before the wait began of the write hold in progress then, in `pre_slot`.
    pub pre: u64,
    pub pre_slot: u32,
    pub owner: u32,
    /// `READ` or `WRITE`.
    pub op: u32,
    pub _pad0: u32,
    /// From the last hold's release to the acquisition (the lock handed over), and its slot.
    pub handover: u64,
    pub handover_slot: u32,
    pub _pad: u32,
    /// The lock's `held` at the acquisition (`snap`: when the wait began).
    pub held: [u64; HOLDER_SLOTS],
}

/// The state `--blockers` adds to a thread.
#[repr(C)]
pub struct BlockState {
    pub slots: [SlotSnap; 2],
    /// The last contended wait, charged with the next flush.
    pub charge: Charge,
    /// `held` of the lock being waited for, when the wait began (kept until the charge).
    pub snap: [u64; HOLDER_SLOTS],
}

/// A BTF-defined task local storage map (aya-ebpf has no type for it): the fields only
/// describe the map in BTF and are never dereferenced.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
}

// SAFETY: the fields are placeholders that describe the map in BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        TaskStorage {
            r#type: ptr::null(),
            map_flags: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
        }
    }

    /// `task`'s value, created (zeroed) on first use when `create`. A mutable reference
    /// from a shared one: the kernel owns the storage; which context may write which field
    /// is the flush claim's protocol (see `claim`), not Rust's borrows.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub fn get(&'static self, task: Task, create: bool) -> Option<&'static mut T> {
        let flags = if create {
            BPF_LOCAL_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        // SAFETY: `self` is a task storage map (by its BTF description above) and `task` a
        // BTF task pointer, as the helper requires; a null value pointer creates zeroed.
        let p = unsafe {
            bpf_task_storage_get(
                ptr::from_ref(self).cast_mut().cast(),
                task.as_ptr().cast(),
                ptr::null_mut(),
                flags,
            )
        };
        if p.is_null() {
            if create {
                bump(counter::NO_STATE);
            }
            return None;
        }
        // SAFETY: the kernel returned the task's value, sized and aligned for `T`, alive as
        // long as the task; programs reach it only through this map.
        Some(unsafe { &mut *p.cast::<T>() })
    }
}

#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "THREAD_STATE")]
pub static THREAD_STATE: TaskStorage<ThreadState> = TaskStorage::new();

#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "VERDICT")]
pub static VERDICT: TaskStorage<OwnCache> = TaskStorage::new();

#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "BLOCK_STATE")]
pub static BLOCK_STATE: TaskStorage<BlockState> = TaskStorage::new();

/// Takes the right to accumulate `st`'s ring and copy its accumulators (the thread itself,
/// the iterator and the exit path may try at once).
#[inline(always)]
pub fn claim(st: &mut ThreadState) -> bool {
    // SAFETY: an atomic compare-and-swap on a field of the thread's state, which outlives
    // the call; BPF_CMPXCHG.
    let (_, won) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
            &mut st.flushing,
            0,
            1,
        )
    };
    won
}

/// Gives the claim back. On a CPU that orders stores (x86-64) a plain store publishes
/// everything written before it; elsewhere an exchange is the barrier.
#[inline(always)]
pub fn unclaim(st: &mut ThreadState) {
    if konst(&SETTINGS.strong_order) != 0 {
        // SAFETY: a volatile store to a field of the thread's state.
        unsafe { ptr::write_volatile(&mut st.flushing, 0) };
    } else {
        unclaim_full(st);
    }
}

/// Gives the claim back with a full barrier: loads after it (the iterator's look at
/// `exiting`) cannot be satisfied before it.
#[inline(always)]
pub fn unclaim_full(st: &mut ThreadState) {
    // SAFETY: an atomic exchange on a field of the thread's state; BPF_XCHG.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(&mut st.flushing, 0) };
}
