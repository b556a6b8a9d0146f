//! Accumulation, in two steps, both outside any locked window.
//!
//! 1. **Flush**: a thread's completed acquisitions (its ring, filled at release) are added to
//!    its accumulators in task storage: a few stores each, no shared map, no atomics. Done by
//!    the thread at its next `start_locking` when it holds no mm lock, and by the iterator or
//!    the exit path for threads that stay idle.
//! 2. **Copy**: the accumulators that changed are copied into `STATS`, where userspace reads
//!    them, and noted on `DIRTY`: one hash update per (thread, kind) per reading, instead of
//!    one per acquisition. Done by the iterator userspace runs before each reading, and when
//!    the thread exits.
//!
//! Acquisitions the accumulators do not cover (another process's lock, a thread's ninth kind)
//! go to `STATS` directly, as they complete.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr,
};

use aya_ebpf::bindings::BPF_NOEXIST;
use profiler_common::{
    HIST_BUCKETS, LockStats, StatsKey, ThreadStats, bucket_index, cause,
    counter,
};

use crate::{
    blockers,
    kread::{self, Task},
    maps::{
        DIRTY, EPOCH, KERNEL, SCRATCH, SETTINGS, STATS, blockers_on, bump,
        bump_by, for_each, konst,
    },
    state::{ACCS, Done, RING, ThreadState, claim, unclaim},
};

#[inline(always)]
pub fn add_hist(hist: &mut [u32; HIST_BUCKETS], ns: u64) {
    if let Some(b) = hist.get_mut(bucket_index(ns)) {
        *b = b.wrapping_add(1);
    }
}

/// Adds one completed acquisition to `s` (only its accumulating context writes `s`).
#[inline(always)]
fn add(s: &mut LockStats, d: &Done) {
    if d.failed != 0 {
        s.failed = s.failed.wrapping_add(1);
        return;
    }
    s.count = s.count.wrapping_add(1);
    s.wait_sum = s.wait_sum.wrapping_add(d.wait);
    if d.wait > s.wait_max {
        s.wait_max = d.wait;
    }
    s.hold_sum = s.hold_sum.wrapping_add(d.hold);
    if d.hold > s.hold_max {
        s.hold_max = d.hold;
    }
    add_hist(&mut s.wait_hist, d.wait);
    add_hist(&mut s.hold_hist, d.hold);
}

/// Records who the thread is, from its task, once (outside any lock: a vfork child's name is
/// its parent's until it execs, and it never takes a lock of its own before that).
#[inline(always)]
fn identify(st: &mut ThreadState, task: Task) {
    if st.identified != 0 {
        return;
    }
    st.tid = task.u32_at(konst(&KERNEL.task_pid));
    st.tgid = task.u32_at(konst(&KERNEL.task_tgid));
    st.tid_start = task.u64_at(konst(&KERNEL.task_start_boottime));
    let fsbase = konst(&KERNEL.task_fsbase);
    st.fsbase = if fsbase == 0 {
        0
    } else {
        kread::u64_at(task.addr() + fsbase as u64)
    };
    st.comm = kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64);
    // Its start routine, from its own memory: only the thread itself can read it here (the
    // iterator runs in the profiler's address space). Userspace reads it on its own otherwise.
    let off = konst(&SETTINGS.start_routine_off);
    st.start_routine = if off != 0 && st.fsbase != 0 && task.addr() == kread::current_addr() {
        kread::user_u64(st.fsbase.wrapping_add(off as i64 as u64))
    } else {
        0
    };
    st.identified = 1;
}

/// Tells userspace about a thread at its first lock (holding none): who it is, and the
/// start routine only it can read.
#[inline(never)]
pub fn announce_first(st: &mut ThreadState, task: Task, owner: u32, owner_start: u64) {
    identify(st, task);
    announce(st, owner, owner_start);
}

/// Tells userspace about a thread (at its first lock, or the first time its acquisitions are
/// flushed, if the iterator or its exit got there first).
#[inline(always)]
fn announce(st: &mut ThreadState, owner: u32, owner_start: u64) {
    st.announced = 1;
    let who = crate::announce::Identity {
        tid: st.tid,
        tgid: st.tgid,
        tid_start: st.tid_start,
        fsbase: st.fsbase,
        comm: st.comm,
    };
    crate::announce::announce_thread(&who, owner, owner_start, st.start_routine);
}

/// The accumulator for `kind`, taking a free one on first use; None when all are taken.
#[inline(always)]
fn acc_for(st: &mut ThreadState, kind: u32) -> Option<usize> {
    let k = kind as usize & 15;
    // (`acc_of_kind` is bytes: one load, no bounds check beyond the mask.)
    let i = st.acc_of_kind[k];
    if i != 0 {
        return Some((i - 1) as usize & (ACCS as usize - 1));
    }
    let used = st.accs_used;
    if used >= ACCS {
        return None;
    }
    let i = used as usize & (ACCS as usize - 1);
    st.accs[i].kind = kind as u8;
    st.acc_of_kind[k] = (i + 1) as u8;
    st.accs_used = used + 1;
    Some(i)
}

/// Notes `entry` (of `key`) as changed in this reading epoch, once, after a full barrier
/// that orders its update before the epoch is loaded.
#[inline(always)]
pub fn note_changed(key: &StatsKey, entry: &mut ThreadStats) {
    // SAFETY: an atomic add of 0 to the entry's count: a full barrier (BPF has no fence
    // instruction) between the update above and the epoch's load below.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(&mut entry.stats.count, 0) };
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    if entry.epoch != epoch {
        entry.epoch = epoch;
        if DIRTY.output::<StatsKey>(key, 0).is_err() {
            bump(counter::DIRTY_LOST);
        }
    }
}

/// The `STATS` entry of `key`, created on first use.
#[inline(always)]
fn stats_entry(key: &StatsKey, st: &ThreadState) -> Option<&'static mut ThreadStats> {
    stats_entry_of(key, st.tgid, &st.comm, st.fsbase)
}

/// The `STATS` entry of `key`, created on first use for a thread of process `tgid`, named
/// `comm`, with fs base `fsbase`. Only the thread named by the key writes its entries.
#[inline(always)]
pub fn stats_entry_of(
    key: &StatsKey,
    tgid: u32,
    comm: &kread::Comm,
    fsbase: u64,
) -> Option<&'static mut ThreadStats> {
    if let Some(p) = STATS.get_ptr_mut(key) {
        // SAFETY: a map value of the right type; only the holder of this thread's claim
        // writes this thread's entries.
        return Some(unsafe { &mut *p });
    }
    let init = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch element; programs do not migrate while they run.
    let init = unsafe { &mut *init };
    // Only these fields are ever written: the rest stays as the kernel zeroed it.
    init.tgid = tgid;
    kread::set_comm(kread::as_comm_mut(&mut init.comm), comm);
    init.fsbase = fsbase;
    // epoch 0 is never current (userspace starts at 1): a new entry is always noted.
    init.epoch = 0;
    // NOEXIST: only the holder of this thread's claim inserts its keys.
    // By reference: a value would be copied to the 512-byte stack first.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = STATS.insert(key, &*init, BPF_NOEXIST as u64);
    // SAFETY: as above.
    STATS.get_ptr_mut(key).map(|p| unsafe { &mut *p })
}

/// Counts acquisitions the profile does not contain because `STATS` was full: acquisitions
/// as lost, downgrades and failed trylocks apart (they are not acquisitions).
#[inline(always)]
pub fn count_map_full(kind: u32, acquired: u64, not_acquired: u64) {
    if kind == cause::DOWNGRADE {
        bump_by(counter::NOT_ACQUIRED_MAP_FULL, acquired + not_acquired);
    } else {
        bump_by(counter::MAP_FULL, acquired);
        bump_by(counter::NOT_ACQUIRED_MAP_FULL, not_acquired);
    }
}

/// Adds one completed acquisition straight to its `STATS` entry (the rare ones the
/// accumulators do not cover).
#[inline(never)]
fn record_direct(st: &ThreadState, d: &Done) {
    add_to_entry(st, d, d.kind as u32);
}

/// Adds `d` to the thread's `STATS` entry of `kind` (its own kind, or that kind spilled).
#[inline(always)]
fn add_to_entry(st: &ThreadState, d: &Done, kind: u32) {
    let key = StatsKey {
        owner: d.owner,
        tid: st.tid,
        kind,
        _pad: 0,
        owner_start: d.owner_start,
        tid_start: st.tid_start,
    };
    let Some(entry) = stats_entry(&key, st) else {
        let failed = d.failed as u64;
        count_map_full(d.kind as u32, 1 - failed, failed);
        return;
    };
    add(&mut entry.stats, d);
    note_changed(&key, entry);
}

/// Adds one completed acquisition to the thread's spill entry in `STATS` (its kind with
/// `cause::SPILLED`), for a release that found its ring full while another context holds
/// the claim: the iterator, which runs preemptibly and may hold it for a scheduler slice.
/// Waiting for it could take that long with the lock held, or for ever where the iterator is
/// pinned to this CPU. The spill entry needs a key of its own, since the accumulators'
/// copies overwrite theirs; only the thread itself writes it, so no claim is needed, and
/// userspace adds it to the kind. Runs with the lock held: a hash update, rare.
#[inline(never)]
pub fn spill(st: &mut ThreadState, task: Task, d: &Done) {
    identify(st, task);
    add_to_entry(st, d, d.kind as u32 | cause::SPILLED);
    if d.sample_seq != 0 {
        crate::sampling::done(st.tid, d.sample_seq as u32, d.wait, d.hold);
    }
}

/// Accumulates one completed acquisition, and sends the outcome of a sampled one.
#[inline(always)]
fn record(st: &mut ThreadState, d: &Done) {
    if st.acc_owner_set == 0 {
        st.acc_owner = d.owner;
        st.acc_owner_start = d.owner_start;
        st.acc_owner_set = 1;
    }
    let ours = d.owner == st.acc_owner && d.owner_start == st.acc_owner_start;
    match if ours {
        acc_for(st, d.kind as u32)
    } else {
        None
    } {
        Some(i) => {
            let a = &mut st.accs[i];
            add(&mut a.stats, d);
            a.dirty = 1;
            st.dirty = 1;
        }
        None => record_direct(st, d),
    }
    if d.sample_seq != 0 {
        crate::sampling::done(st.tid, d.sample_seq as u32, d.wait, d.hold);
    }
}

/// What the flush callbacks work on (on the caller's stack).
#[repr(C)]
struct FlushCtx {
    st: *mut ThreadState,
}

/// One pending acquisition (a `for_each` callback; returns 0 to go on).
extern "C" fn flush_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `FlushCtx` that `flush` passed, on its stack, pointing to the
    // thread's state, which the caller holds the claim of.
    let st = unsafe { &mut *(*ctx.cast::<FlushCtx>()).st };
    let idx = (st.tail.wrapping_add(i as u32) & (RING - 1)) as usize;
    let Some(d) = st.ring.get(idx) else {
        return 1;
    };
    // SAFETY: read in place rather than copied (a copy per record costs as much as half its
    // accumulation): `record` writes the accumulators and flags, never the ring.
    let d: &Done = unsafe { &*ptr::from_ref(d) };
    record(st, d);
    0
}

/// Accumulates the thread's pending acquisitions (and, with `--blockers`, charges its last
/// contended wait when `with_charge`: no lock is held). The caller holds the claim.
#[inline(always)]
pub fn flush_claimed(st: &mut ThreadState, task: Task, with_charge: bool) {
    identify(st, task);
    if with_charge && blockers_on() && st.charge_pending != 0 {
        blockers::charge_pending(st, task);
    }
    // SAFETY: `head` is written by the thread at release, possibly on another CPU.
    let head = unsafe { ptr::read_volatile(&st.head) };
    let tail = st.tail;
    if head == tail {
        return;
    }
    if st.announced == 0 {
        let first = st.ring[(tail & (RING - 1)) as usize];
        announce(st, first.owner, first.owner_start);
    }
    st.profiled = 1;
    let mut ctx = FlushCtx {
        st: ptr::from_mut(st),
    };
    for_each::<RING>(
        head.wrapping_sub(tail),
        flush_one,
        ptr::from_mut(&mut ctx).cast(),
    );
    // SAFETY: the callbacks are done with the state; `tail` is read by the releasing thread.
    unsafe { ptr::write_volatile(&mut (*ctx.st).tail, head) };
}

/// Claims and flushes; false if another context is flushing.
#[inline(always)]
pub fn flush(st: &mut ThreadState, task: Task, with_charge: bool) -> bool {
    if !claim(st) {
        return false;
    }
    flush_claimed(st, task, with_charge);
    unclaim(st);
    true
}

/// One accumulator into `STATS` (a `for_each` callback).
extern "C" fn copy_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: as in `flush_one`.
    let st = unsafe { &mut *(*ctx.cast::<FlushCtx>()).st };
    let i = i as usize & (ACCS as usize - 1);
    let (kind, dirty, lost) = match st.accs.get(i) {
        Some(a) => (a.kind as u32, a.dirty, a.lost),
        None => return 1,
    };
    if dirty == 0 {
        return 0;
    }
    let key = StatsKey {
        owner: st.acc_owner,
        tid: st.tid,
        kind,
        _pad: 0,
        owner_start: st.acc_owner_start,
        tid_start: st.tid_start,
    };
    let entry = if lost != 0 {
        None
    } else {
        stats_entry(&key, st)
    };
    let a = &mut st.accs[i];
    a.dirty = 0;
    match entry {
        Some(entry) => {
            kread::copy(&mut entry.stats, &a.stats);
            note_changed(&key, entry);
        }
        None => {
            // Not in the profile: counted as lost once each, and never copied later (what
            // it holds would then count twice).
            a.lost = 1;
            count_map_full(
                kind,
                (a.stats.count as u32).wrapping_sub(a.lost_acquired) as u64,
                (a.stats.failed as u32).wrapping_sub(a.lost_failed) as u64,
            );
            a.lost_acquired = a.stats.count as u32;
            a.lost_failed = a.stats.failed as u32;
        }
    }
    0
}

/// Copies the accumulators that changed into `STATS`. The caller holds the claim.
#[inline(always)]
pub fn copy_claimed(st: &mut ThreadState) {
    if st.dirty == 0 {
        return;
    }
    st.dirty = 0;
    let n = st.accs_used;
    let mut ctx = FlushCtx {
        st: ptr::from_mut(st),
    };
    for_each::<ACCS>(n, copy_one, ptr::from_mut(&mut ctx).cast());
}
