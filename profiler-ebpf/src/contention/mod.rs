//! Contention mode (`--mode contention`): programs on `lock:contention_begin` and
//! `lock:contention_end` (Linux 5.19+), which the kernel fires only on a lock's slow path, for
//! every kind of lock it has. The mmap_lock tracepoints stay detached, so an acquisition that
//! does not wait costs nothing; a wait that does is timed from its slow path's start to its
//! end, and counted in the same `STATS` entries as full mode's (count and wait, no hold).
//!
//! Every lock in the kernel fires these, so the first lines only look at the flags (an rwsem
//! waits with READ or WRITE alone; spinlocks, mutexes and per-CPU rwsems carry other bits),
//! then at the address: the current task's own `&mm->mmap_lock`, or a profiled process's
//! lock in `MM_OWNER` (another task waiting on it: the profiler's reads of /proc, khugepaged,
//! a debugger, an exit_mmap on the last reference). `contention_end` first looks at a counter
//! of waits in progress, indexed by thread id, which is zero for nearly every thread.
//!
//! No task local storage: allocating it under a contended lock recursed in the kernel's own
//! perf tool (commit c66a36af7ba3), which removed it from these handlers. A thread's state is
//! in a preallocated hash map (`WAITERS`), made at its first wait and deleted when the task
//! is freed.
//!
//! Who made whom wait, without `--blockers`' holder slots: the rwsem's `owner` word names the
//! writer holding the lock when the wait begins (with its syscall, read from its saved user
//! registers); with its reader bit set the lock is held by readers, whom it does not name.

pub mod holder;
mod queued;
mod threads;
mod waiter;

pub use threads::note_own_lock;

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr,
};

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use profiler_common::{
    BlockedKey, HolderId, READ, READ_WAIT_SEQ, StackHeader, StatsKey, WRITE, cause, counter,
};

use crate::{
    accum,
    announce::{self, Identity},
    blockers,
    kread::Task,
    maps::{KERNEL, bump, konst, note_activity},
    sampling,
    timing::{self, PF_EXITING, now},
};
use holder::{HOLDER_UNKNOWN, note_holder};
use waiter::{LockOf, Waiter, WAITERS, owner_of, waiter};

/// `lock:contention_begin`'s flags (include/trace/events/lock.h): an rwsem's reader or
/// writer waits with one of these alone.
const LCB_F_READ: u64 = 1 << 1;
const LCB_F_WRITE: u64 = 1 << 2;

/// Waits in progress, by `tid & (WAITING_SLOTS - 1)`: `contention_end`, which every lock
/// in the kernel fires, looks here first, one array load, and goes no further for the threads
/// that wait for no profiled lock.
const WAITING_SLOTS: u32 = 4096;
#[map]
static WAITING: Array<u64> = Array::with_max_entries(WAITING_SLOTS, 0);

#[inline(always)]
fn atomic_add(p: &mut u64, n: u64) {
    // SAFETY: an atomic add to a live map value's field; BPF_ATOMIC.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, n) };
}

/// The counter of waits in progress of threads like `tid`.
#[inline(always)]
fn waiting_slot(tid: u32) -> Option<&'static mut u64> {
    // SAFETY: an array element, valid for the map's life; changed with atomics only.
    WAITING
        .get_ptr_mut(tid & (WAITING_SLOTS - 1))
        .map(|p| unsafe { &mut *p })
}

/// A wait in progress of thread `tid` is over (its end, or its task freed).
#[inline(always)]
pub fn waiting_done(tid: u32) {
    if let Some(n) = waiting_slot(tid) {
        atomic_add(n, u64::MAX);
    }
}

#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn contention_begin(ctx: RawTracePointContext) -> i32 {
    begin_of::<false>(&ctx)
}

/// The second copy, where the kernel may skip the first (see `timing`'s doc): a reader's
/// begin runs preemptible (a writer's, with interrupts off, is never skipped). When the first
/// ran, the second finds the wait begun.
#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn contention_begin_second(ctx: RawTracePointContext) -> i32 {
    begin_of::<true>(&ctx)
}

#[inline(always)]
fn begin_of<const SECOND: bool>(ctx: &RawTracePointContext) -> i32 {
    // `unsigned int flags`, widened to the argument's 64 bits.
    let flags = ctx.arg::<u64>(1) & 0xffff_ffff;
    if flags != LCB_F_READ && flags != LCB_F_WRITE {
        return 0;
    }
    begin::<SECOND>(ctx.arg(0), flags == LCB_F_WRITE);
    0
}

/// A contended wait for rwsem `lock` begins: the thread is about to sleep for it. A reader
/// holds nothing here; a writer holds the rwsem's internal wait_lock, with interrupts off,
/// which whoever releases the lock takes to wake the waiters: what runs here delays them
/// (a stack sample, one write in `--stack-sample`, most of all). Nothing runs here for an
/// acquisition that did not wait.
#[inline(always)]
fn begin<const SECOND: bool>(lock: u64, write: bool) {
    let task = Task::current();
    let Some((owner, owner_start, own)) = owner_of(lock, task) else {
        return;
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    // Its own process's lock is noted for other tasks' waits on it when the thread first
    // waits.
    let own_mm = if own {
        lock - konst(&KERNEL.mm_lock) as u64
    } else {
        0
    };
    let of = LockOf {
        owner_start,
        own_mm,
        owner,
        _pad: 0,
    };
    let Some(w) = waiter(task, tid, &of) else {
        return;
    };
    if SECOND {
        if w.lock == lock {
            // The first copy ran.
            return;
        }
        bump(counter::RESCUED);
    }
    // The holder first: a writer clears the owner word as it releases, without the rwsem's
    // wait_lock, and the stack copy below takes microseconds.
    let holder_regs = note_holder(w, lock, task);
    let kind = if !write {
        cause::READ
    } else if !own && task.u32_at(konst(&KERNEL.task_flags)) & PF_EXITING != 0 {
        cause::EXIT
    } else {
        timing::write_cause(task)
    };
    let key = StatsKey {
        owner,
        tid,
        kind,
        _pad: 0,
        owner_start,
        tid_start: w.tid_start,
    };
    // Made now, not while the lock is held: the end only adds to it (if the map is full,
    // the end counts the wait as lost).
    let _ = accum::stats_entry_of(&key, w.tgid, &w.comm, w.fsbase);
    let mut seq = 0u32;
    if SECOND {
        // The second copy takes no stack (the per-CPU sample buffer may be a preempted
        // first copy's): a wait the sampling picks has the stack it would have taken
        // counted lost, a write's own or a read's holder's.
        if write {
            if sampling::pick_in(w.tgid, &mut w.writes, &mut w.sample_left, &mut w.write_every)
                != 0
            {
                bump(counter::STACKS_LOST);
            }
        } else if sampling::pick_in(w.tgid, &mut w.reads, &mut w.read_left, &mut w.read_every)
            != 0
            && own
            && w.holder.tgid == w.tgid
            && w.holder.tid != 0
            && w.holder.tid != tid
        {
            bump(counter::HOLDER_STACKS_LOST);
        }
    } else {
        // One contended write in `--stack-sample` has its stack taken, and one read in as
        // many (apart: the reads' sequence numbers have bit 16 set) has only its holder's.
        // With a floor, a process's first wait and any after a floor's time without a
        // sample are sampled too (the agent's captures: every process that waits has stacks).
        let t = if write {
            sampling::floor_due(w.tgid, &mut w.sample_left, &mut w.floor_seen_ns)
        } else {
            sampling::floor_due(w.tgid, &mut w.read_left, &mut w.floor_seen_ns)
        };
        let s = if write {
            sampling::pick_in(w.tgid, &mut w.writes, &mut w.sample_left, &mut w.write_every)
                as u32
        } else {
            match sampling::pick_in(w.tgid, &mut w.reads, &mut w.read_left, &mut w.read_every) {
                0 => 0,
                s => s as u32 | READ_WAIT_SEQ,
            }
        };
        let every = if write { w.write_every } else { w.read_every };
        if s != 0
            && write
            && sampling::sample(task, tid, w.tgid, owner, owner_start, kind, s as u16, every)
        {
            seq = s;
        }
        // The writer it waits behind, if of its own process (their address space is this
        // one): the holder's stack, charged the wait at its end. (Not for a write whose own
        // stack was lost: its outcome would then be a lost stack counted twice.)
        let taken = !write || seq != 0;
        if s != 0
            && taken
            && own
            && w.holder.tgid == w.tgid
            && w.holder.tid != 0
            && w.holder.tid != tid
        {
            let head = StackHeader {
                tag: 0,
                owner,
                tid: w.holder.tid,
                tgid: w.holder.tgid,
                kind: w.holder.kind,
                seq: s,
                ip: 0,
                sp: 0,
                bp: 0,
                owner_start,
                stack_len: 0,
                waiter: tid,
                lr: 0,
                every,
                _pad: 0,
            };
            let holder = sampling::HolderSample {
                regs: holder_regs,
                fsbase: w.holder_fsbase,
            };
            if sampling::sample_holder(&holder, &head) {
                seq = s;
            }
        }
        if seq != 0 {
            sampling::floor_taken(w.tgid, t, &mut w.floor_seen_ns);
        }
    }
    if w.lock == 0
        && let Some(n) = waiting_slot(tid)
    {
        atomic_add(n, 1);
    }
    w.owner = owner;
    w.owner_start = owner_start;
    w.kind = kind;
    w.sample_seq = seq;
    w.lock = lock;
    w.start_ts = now();
}

#[raw_tracepoint(tracepoint = "contention_end")]
pub fn contention_end(ctx: RawTracePointContext) -> i32 {
    end_of::<false>(&ctx)
}

/// The second copy, where the kernel may skip the first (see `timing`'s doc): the end runs
/// preemptible, after the wait, and a wait whose end is skipped is lost. When the first ran,
/// the second finds the wait over (`end` is idempotent).
#[raw_tracepoint(tracepoint = "contention_end")]
pub fn contention_end_second(ctx: RawTracePointContext) -> i32 {
    end_of::<true>(&ctx)
}

#[inline(always)]
fn end_of<const SECOND: bool>(ctx: &RawTracePointContext) -> i32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(n) = waiting_slot(tid) else {
        return 0;
    };
    // SAFETY: a volatile read of an array element other CPUs change atomically.
    if unsafe { ptr::read_volatile(n) } == 0 {
        return 0;
    }
    // `int ret`: 0, or -EINTR for a killed waiter, which did not get the lock.
    let failed = ctx.arg::<u64>(1) as u32 != 0;
    end::<SECOND>(ctx.arg(0), tid, failed);
    0
}

/// A contended wait ends: with the lock held unless it failed. A few lookups and stores.
#[inline(always)]
fn end<const SECOND: bool>(lock: u64, tid: u32, failed: bool) {
    let now = now();
    let Some(p) = WAITERS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in `waiter`.
    let w = unsafe { &mut *p };
    // Another lock's end (the rwsem's own wait_lock, contended inside this wait), or
    // another thread's slot.
    if w.lock != lock || lock == 0 {
        return;
    }
    if SECOND {
        bump(counter::RESCUED);
    }
    w.lock = 0;
    waiting_done(tid);
    let wait = now.wrapping_sub(w.start_ts);
    let key = StatsKey {
        owner: w.owner,
        tid,
        kind: w.kind,
        _pad: 0,
        owner_start: w.owner_start,
        tid_start: w.tid_start,
    };
    match stats_of(&key) {
        Some(e) => {
            let s = &mut e.stats;
            if failed {
                s.failed = s.failed.wrapping_add(1);
            } else {
                s.count = s.count.wrapping_add(1);
                s.wait_sum = s.wait_sum.wrapping_add(wait);
                if wait > s.wait_max {
                    s.wait_max = wait;
                }
                accum::add_hist(&mut s.wait_hist, wait);
            }
            accum::note_changed(&key, e);
        }
        None => accum::count_map_full(w.kind, (!failed) as u64, failed as u64),
    }
    charge(w, tid, wait, lock, now);
    if !failed && w.kind != cause::READ {
        // A writer got the lock: the waits it is now ahead of learn of it at their end
        // (after its own charge, which may be to the writer before it).
        queued::note_writer(lock, w, tid, now);
    }
    if w.sample_seq != 0 {
        sampling::done(tid, w.sample_seq, wait, 0);
    }
    if w.exiting != 0 {
        threads::notify_freed(w, Task::current());
    }
    note_activity();
}

/// `STATS`'s entry of `key`, as it stands.
#[inline(always)]
fn stats_of(key: &StatsKey) -> Option<&'static mut profiler_common::ThreadStats> {
    // SAFETY: a map value of the right type; only the thread the key names writes it.
    crate::maps::STATS
        .get_ptr_mut(key)
        .map(|p| unsafe { &mut *p })
}

/// Charges the wait to what it waited behind: the writer that held the lock when it began;
/// or, begun behind readers (or with nobody named), to the readers until a writer got the
/// lock in it and to that writer from then on (`queued`: a writer queued ahead of it, as an
/// rwsem queues a writer ahead of the waiters that come after it). A holder first charged is
/// announced, as a waiter is: it may never wait itself, and its role is told while it lives.
#[inline(always)]
fn charge(w: &Waiter, tid: u32, wait: u64, lock: u64, now: u64) {
    if blockers::ours(w.tgid) {
        return;
    }
    let behind_readers = w.holder.kind == cause::READ || w.holder.kind == HOLDER_UNKNOWN;
    if behind_readers && let Some(q) = queued::writer_in(lock, w.start_ts, tid) {
        let after = now.saturating_sub(q.acquired).min(wait);
        if w.holder.kind == cause::READ && wait > after {
            // The part before, the readers' (the wait counted once: with the writer's part).
            charge_to(w, tid, &w.holder, 0, wait - after);
        }
        let holder = HolderId {
            tid_start: q.tid_start,
            tid: q.tid,
            tgid: q.tgid,
            kind: q.kind,
            _pad: 0,
        };
        let who = Identity {
            tid: q.tid,
            tgid: q.tgid,
            tid_start: q.tid_start,
            fsbase: q.fsbase,
            comm: q.comm,
        };
        if charge_to(w, tid, &holder, 1, after) {
            announce::announce_thread(&who, w.owner, w.owner_start, 0);
        }
        return;
    }
    if w.holder.kind == HOLDER_UNKNOWN {
        return;
    }
    if charge_to(w, tid, &w.holder, 1, wait) && w.holder.tid != 0 {
        let who = Identity {
            tid: w.holder.tid,
            tgid: w.holder.tgid,
            tid_start: w.holder.tid_start,
            fsbase: w.holder_fsbase,
            comm: w.holder_comm,
        };
        announce::announce_thread(&who, w.owner, w.owner_start, 0);
    }
}

/// Adds `waits` and `ns` of `w`'s wait to `holder`'s entry; whether it was made now.
#[inline(never)]
fn charge_to(w: &Waiter, tid: u32, holder: &HolderId, waits: u64, ns: u64) -> bool {
    let key = BlockedKey {
        owner: w.owner,
        waiter_tid: tid,
        holder_tid: holder.tid,
        holder_tgid: holder.tgid,
        holder_kind: holder.kind,
        waiter_op: if w.kind == cause::READ {
            READ as u32
        } else {
            WRITE as u32
        },
        owner_start: w.owner_start,
        waiter_start: w.tid_start,
        holder_start: holder.tid_start,
    };
    blockers::add_blocked_n(&key, waits, ns)
}
