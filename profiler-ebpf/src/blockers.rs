//! Who made whom wait (`--blockers`). Each profiled lock has hold-time accumulators per
//! holder (`LOCKS`, a slot by a hash of the mm address), added at release with a few stores.
//! A waiter copies them when it starts waiting and when it gets the lock; the difference,
//! charged later outside the lock, is what each holder held the lock for during the wait.
//! The profiler's own threads are never offered as holders: their holds are counted apart.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd},
    ptr,
};

use aya_ebpf::bindings::BPF_NOEXIST;
use profiler_common::{
    BlockedKey, BlockedVal, HOLDER_SLOTS, LOCK_SLOTS, LockAcc, cause, counter, holder_slot,
};

use crate::{
    kread::{self, Task},
    maps::{BLOCKED, KERNEL, LOCKS, SETTINGS, bump, for_each, konst},
    state::{BLOCK_STATE, BlockState, Slot, SlotSnap, ThreadState},
};

/// Is `kind` a write hold's?
#[inline(always)]
pub fn write_kind(kind: u32) -> bool {
    kind != cause::READ && kind != cause::DOWNGRADE
}

/// Is the current thread one of the profiler's own?
#[inline(always)]
pub fn ours(tgid: u32) -> bool {
    tgid == konst(&SETTINGS.self_tgid)
}

/// The accumulator slot of the lock of `mm` (a multiplicative hash of its address).
#[inline(always)]
fn lock_acc(mm: u64) -> Option<&'static mut LockAcc> {
    let idx = (mm.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as u32 & (LOCK_SLOTS - 1);
    // SAFETY: an array element, valid for the map's life; shared by every CPU, so it is
    // written with atomics where writers can race (read holds) and plainly where the lock
    // itself excludes them (write holds).
    LOCKS.get_ptr_mut(idx).map(|p| unsafe { &mut *p })
}

/// The accumulator of `mm`'s lock, if its slot accumulates that lock now.
#[inline(always)]
fn lock_acc_of(mm: u64) -> Option<&'static mut LockAcc> {
    // SAFETY: a volatile read of a field of a live array element.
    lock_acc(mm).filter(|a| unsafe { ptr::read_volatile(&a.mm) } == mm)
}

/// Atomically adds `n` to a shared accumulator word.
#[inline(always)]
fn atomic_add(p: &mut u64, n: u64) {
    // SAFETY: an atomic add to a live map value's field; BPF_ATOMIC.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, n) };
}

/// A write hold of `mm`'s lock begins (with the lock held: a few stores). While writers
/// wait, the time the lock stayed free since the last hold ended goes to that hold's slot,
/// so that every moment of a wait is someone's hold or hand-over.
#[inline(always)]
pub fn note_write_hold(mm: u64, kind: u32, tid: u32, now: u64) {
    let Some(a) = lock_acc_of(mm) else {
        return;
    };
    let last = a.last_rel;
    // SAFETY: a volatile read of a live map value's field.
    if last != 0 && now > last && unsafe { ptr::read_volatile(&a.waiting) } != 0 {
        let slot = a.last_slot as usize & (HOLDER_SLOTS - 1);
        if let Some(h) = a.held.get_mut(slot) {
            // Exclusive: no reader holds, none adds.
            *h = h.wrapping_add(now - last);
        }
    }
    a.last_rel = 0;
    a.cur_slot = holder_slot(tid, kind) as u64;
    a.cur_acq = now;
}

/// A read hold of `mm`'s lock begins while writers wait: the lock's time free since the last
/// hold ended goes to that hold (readers begin at once: whoever takes it first charges it).
#[inline(always)]
pub fn note_read_hold(mm: u64, now: u64) {
    let Some(a) = lock_acc_of(mm) else {
        return;
    };
    // SAFETY: volatile reads of a live map value's fields.
    if unsafe { ptr::read_volatile(&a.waiting) } == 0 {
        return;
    }
    // SAFETY: as above.
    let last = unsafe { ptr::read_volatile(&a.last_rel) };
    if last == 0 || now <= last {
        return;
    }
    let slot = a.last_slot as usize & (HOLDER_SLOTS - 1);
    // SAFETY: an atomic compare-and-swap on a live map value's field.
    let (_, won) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
            &mut a.last_rel,
            last,
            0,
        )
    };
    if won && let Some(h) = a.held.get_mut(slot) {
        atomic_add(h, now - last);
    }
}

/// A hold of `mm`'s lock ends (with the lock held: a few stores): its time goes to its
/// holder's slot. A read hold counts only while a profiled writer waits for the lock: only
/// then can it make anyone wait. The profiler's own holds are not offered.
#[inline(always)]
pub fn add_hold(st: &ThreadState, mm: u64, kind: u32, acq_ts: u64, now: u64, task: Task) {
    let tgid = task.u32_at(konst(&KERNEL.task_tgid));
    if ours(tgid) {
        return;
    }
    let write = write_kind(kind);
    let Some(a) = lock_acc(mm) else {
        return;
    };
    // SAFETY: volatile reads of a live map value's fields.
    let mine = unsafe { ptr::read_volatile(&a.mm) } == mm;
    // SAFETY: as above.
    if !write && (!mine || unsafe { ptr::read_volatile(&a.waiting) } == 0) {
        return;
    }
    if !mine {
        // The slot changes hands (two profiled locks hashing alike: rare); waiters of the
        // other lock notice and charge nothing.
        // SAFETY: a volatile store to a live map value's field.
        unsafe { ptr::write_volatile(&mut a.mm, mm) };
    }
    let tid = task.u32_at(konst(&KERNEL.task_pid));
    let slot = holder_slot(tid, kind);
    if let Some(h) = a.held.get_mut(slot) {
        if write {
            // Write holds are exclusive: nobody else adds now.
            *h = h.wrapping_add(now.wrapping_sub(acq_ts));
        } else {
            atomic_add(h, now.wrapping_sub(acq_ts));
        }
    }
    if let Some(id) = a.ids.get_mut(slot)
        && (id.tid != tid || id.kind != kind)
    {
        id.tid = tid;
        id.tgid = tgid;
        id.kind = kind;
        // Identified at its first flush (never earlier: a vfork child runs on its parent's
        // mm, with its parent's name, until it execs); before that, read it here.
        id.tid_start = if st.identified != 0 {
            st.tid_start
        } else {
            task.u64_at(konst(&KERNEL.task_start_boottime))
        };
    }
    if write {
        a.cur_acq = 0;
    }
    a.last_rel = now;
    a.last_slot = slot as u64;
    // Only a hint that something was added (waiters compare it): readers releasing at once
    // may lose an increment, never all of them.
    a.releases = a.releases.wrapping_add(1);
}

/// Can the lock of `mm` be taken at once (no writer, no waiter; for a write, no reader
/// either)? Then a wait is not worth a snapshot.
#[inline(always)]
fn lock_free(mm: u64, write: bool) -> bool {
    let off = konst(&KERNEL.mm_lock_count);
    if off == 0 {
        return false;
    }
    let count = kread::u64_at(mm + off as u64);
    if write { count == 0 } else { count & 7 == 0 }
}

/// A wait that was snapshotted ends (acquired, failed or stale): a writer no longer waits.
#[inline(always)]
pub fn end_wait(s: &Slot, write: bool) {
    if s.snapped != 0
        && write
        && let Some(a) = lock_acc_of(s.mm)
    {
        atomic_add(&mut a.waiting, u64::MAX);
    }
}

/// The bytes of an array of u64, to copy into.
#[inline(always)]
fn as_bytes(a: &mut [u64; HOLDER_SLOTS]) -> &mut [u8; HOLDER_SLOTS * 8] {
    // SAFETY: same size, u8 has no alignment requirement, and every byte pattern is a u64.
    unsafe { &mut *ptr::from_mut(a).cast() }
}

/// A wait begins, before the lock is held: what the holders had held so far (one wait at a
/// time, and only when the lock is not free). Returns the snapshot when one was taken; its
/// `pre` holds the start of the write hold in progress until [`wait_starts`] says when the
/// wait began (the wait's own timestamp: no clock read of its own).
#[inline(always)]
pub fn begin_wait(
    st: &ThreadState,
    task: Task,
    idx: usize,
    mm: u64,
    write: bool,
) -> Option<&'static mut SlotSnap> {
    if idx != 0 || st.charge_pending != 0 || lock_free(mm, write) {
        return None;
    }
    let a = lock_acc_of(mm)?;
    let bs = BLOCK_STATE.get(task, true)?;
    // SAFETY: a volatile read of a live map value's field.
    let releases0 = unsafe { ptr::read_volatile(&a.releases) };
    if write {
        // Read holds count while we wait (undone when the wait ends).
        atomic_add(&mut a.waiting, 1);
    }
    // SAFETY: as above.
    let cur = unsafe { ptr::read_volatile(&a.cur_acq) };
    let copied = kread::bytes_at(ptr::from_ref(&a.held) as u64, as_bytes(&mut bs.snap));
    let snap = &mut bs.slots[0];
    snap.releases0 = releases0;
    snap.pre_slot = a.cur_slot as u32;
    snap.pre = if copied { cur } else { 0 };
    // Snapshotted even if the copy failed: `waiting` must be undone.
    Some(snap)
}

/// The wait [`begin_wait`] snapshotted began at `start`: the part of the write hold in
/// progress then that lay before it.
#[inline(always)]
pub fn wait_starts(snap: &mut SlotSnap, start: u64) {
    let cur = snap.pre;
    snap.pre = if cur != 0 && start > cur {
        start - cur
    } else {
        0
    };
}

/// At a contended acquisition (with the lock held): if holds were added during the wait,
/// what each holder slot held meanwhile is kept for the charge, made later outside the lock.
#[inline(always)]
pub fn take_charge(st: &mut ThreadState, task: Task, s: Slot, now: u64, write: bool) {
    let Some(a) = lock_acc_of(s.mm) else {
        bump(counter::BLOCKERS_OVERRUN);
        return;
    };
    let Some(bs) = BLOCK_STATE.get(task, false) else {
        return;
    };
    // SAFETY: a volatile read of a live map value's field.
    if unsafe { ptr::read_volatile(&a.releases) } == bs.slots[0].releases0 {
        return;
    }
    if st.charge_pending != 0 {
        bump(counter::BLOCKERS_BUSY);
        return;
    }
    let wait = now.wrapping_sub(s.start_ts);
    // Waiting for the lock to be handed over after the last hold: charged to that hold.
    // SAFETY: as above.
    let last = unsafe { ptr::read_volatile(&a.last_rel) };
    let since = now.wrapping_sub(wait);
    // (A write acquisition added it to `held` already, and cleared `last_rel`.)
    let (handover, handover_slot) = if last > since && last < now {
        (now - last, a.last_slot as u32)
    } else {
        (0, 0)
    };
    let (pre, pre_slot) = (bs.slots[0].pre, bs.slots[0].pre_slot);
    let c = &mut bs.charge;
    if !kread::bytes_at(ptr::from_ref(&a.held) as u64, as_bytes(&mut c.held)) {
        return;
    }
    c.handover = handover;
    c.handover_slot = handover_slot;
    c.mm = s.mm;
    c.wait = wait;
    c.pre = pre;
    c.pre_slot = pre_slot;
    c.owner = s.owner;
    c.owner_start = s.owner_start;
    c.op = write as u32;
    st.charge_pending = 1;
    crate::maps::note_activity();
}

/// Charges the thread's last contended wait to the holders, outside any lock, under the
/// thread's flush claim.
#[inline(never)]
pub fn charge_pending(st: &mut ThreadState, task: Task) {
    st.charge_pending = 0;
    if let Some(bs) = BLOCK_STATE.get(task, false) {
        charge_wait(st, bs);
    }
}

/// Each holder is charged what it held the lock for during the wait (a hold in progress when
/// the wait began, from then on). Read holds overlap one another, so when the parts add up
/// to more than the wait, each is scaled down in proportion. The slots are walked with
/// `for_each`, so the verifier checks one slot, not 64 times two passes.
#[inline(always)]
fn charge_wait(st: &mut ThreadState, bs: &mut BlockState) {
    let (mm, wait) = (bs.charge.mm, bs.charge.wait);
    if wait == 0 || wait >= 1 << 40 {
        return;
    }
    let Some(acc) = lock_acc_of(mm) else {
        bump(counter::BLOCKERS_OVERRUN);
        return;
    };
    // The part of the hold in progress when the wait began that lay before it.
    let pre_slot = bs.charge.pre_slot as usize & (HOLDER_SLOTS - 1);
    if let Some(s) = bs.snap.get_mut(pre_slot) {
        *s = s.wrapping_add(bs.charge.pre);
    }
    // (The zeros apart: LLVM turns adjacent zero stores into a call of a byte-wise memset.)
    let mut ctx = ChargeCtx {
        st: ptr::from_mut(st),
        total: 0,
        bs: ptr::from_mut(bs),
        scale: 0,
        acc: ptr::from_mut(acc),
        pass: 0,
    };
    // Only through this pointer from here on: the callback reads and writes the context.
    let ctx = ptr::from_mut(&mut ctx);
    for_each::<{ HOLDER_SLOTS as u32 }>(HOLDER_SLOTS as u32, charge_slot, ctx.cast());
    // SAFETY: `ctx` points to the context above, alive until the end of this function.
    let total = unsafe { ptr::read_volatile(&(*ctx).total) };
    if total == 0 {
        return;
    }
    // 16-bit fixed point: wait < 2^40 and each part is capped at the wait.
    let scale = if total > wait {
        (wait << 16) / total
    } else {
        1 << 16
    };
    // SAFETY: as above.
    unsafe {
        ptr::write_volatile(&mut (*ctx).scale, scale);
        ptr::write_volatile(&mut (*ctx).pass, 1);
    }
    for_each::<{ HOLDER_SLOTS as u32 }>(HOLDER_SLOTS as u32, charge_slot, ctx.cast());
}

/// The state `charge_slot` works on, on `charge_wait`'s stack.
#[repr(C)]
struct ChargeCtx {
    st: *mut ThreadState,
    /// Pass 0 sums the slots' parts; pass 1 charges them, scaled by `scale / 2^16`.
    total: u64,
    bs: *mut BlockState,
    scale: u64,
    acc: *mut LockAcc,
    pass: u64,
}

/// One holder slot of a charge (a `for_each` callback; returns 0 to go on).
extern "C" fn charge_slot(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `ChargeCtx` on `charge_wait`'s stack; its pointers are to the
    // thread's state and block state (claimed by the caller) and to a live LOCKS element.
    let ctx = unsafe { &mut *ctx.cast::<ChargeCtx>() };
    // SAFETY: as above.
    let (st, bs, acc) = unsafe { (&*ctx.st, &*ctx.bs, &*ctx.acc) };
    let i = i as usize & (HOLDER_SLOTS - 1);
    let (Some(&end), Some(&begin)) = (bs.charge.held.get(i), bs.snap.get(i)) else {
        return 1;
    };
    // A hold begun before the wait can leave the slot below its start: nothing to charge.
    let d = end.wrapping_sub(begin);
    let c = &bs.charge;
    let d = if i == c.handover_slot as usize & (HOLDER_SLOTS - 1) {
        d.wrapping_add(c.handover)
    } else {
        d
    };
    // The wait is read from the map, not passed along: its bounds, known to the verifier
    // where it was checked, would make the running total a precise, ever-growing range that
    // never lets the verifier's walk of this callback converge.
    let wait = c.wait;
    let d = if (d as i64) < 0 {
        0
    } else if d > wait {
        wait
    } else {
        d
    };
    if ctx.pass == 0 {
        ctx.total += d;
        return 0;
    }
    let part = (d * ctx.scale) >> 16;
    if part == 0 {
        return 0;
    }
    let Some(id) = acc.ids.get(i) else {
        return 1;
    };
    if id.tid == st.tid {
        // The slot is shared with one of the waiter's own holds, released since: whose
        // time it was cannot be told, so it stays unattributed.
        return 0;
    }
    let key = BlockedKey {
        owner: c.owner,
        waiter_tid: st.tid,
        holder_tid: id.tid,
        holder_tgid: id.tgid,
        holder_kind: id.kind,
        waiter_op: c.op,
        owner_start: c.owner_start,
        waiter_start: st.tid_start,
        holder_start: id.tid_start,
    };
    add_blocked(&key, part);
    0
}

/// A new entry's value, from read-only data (a local would be zeroed by a call of memset).
static ZERO: BlockedVal = BlockedVal {
    waits: 0,
    wait_ns: 0,
};

/// Adds one wait of `ns` to `key`'s entry; true if the entry was made for it.
#[inline(never)]
pub fn add_blocked(key: &BlockedKey, ns: u64) -> bool {
    add_blocked_n(key, 1, ns)
}

/// [`add_blocked`] of `waits` waits (0: a part of a wait counted with another holder).
#[inline(always)]
pub fn add_blocked_n(key: &BlockedKey, waits: u64, ns: u64) -> bool {
    let mut p = BLOCKED.get_ptr_mut(key);
    let mut made = false;
    if p.is_none() {
        // By reference: a value would be copied to the stack (a call of memset).
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = BLOCKED.insert(key, &ZERO, BPF_NOEXIST as u64);
        p = BLOCKED.get_ptr_mut(key);
        made = p.is_some();
    }
    let Some(v) = p else {
        bump(counter::BLOCKERS_MAP_FULL);
        return false;
    };
    // SAFETY: a live map value; waiters of one holder charge it from several CPUs at once,
    // hence the atomics.
    let v = unsafe { &mut *v };
    if waits != 0 {
        atomic_add(&mut v.waits, waits);
    }
    atomic_add(&mut v.wait_ns, ns);
    made
}
