//! What an `acquire_returned` does to a thread's two lock slots (a wait ends, a hold
//! begins, a downgrade, a trylock), and the ring of completed acquisitions that a release or
//! a failed acquire fills (see `timing` for the programs, `accum` for the ring's reader).

use core::ptr;

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32};
use profiler_common::{cause, counter};

use crate::{
    accum, blockers,
    kread::Task,
    maps::{SETTINGS, blockers_on, bump, konst, note_activity},
    state::{Done, RING, Slot, SlotState, ThreadState},
    timing::{kind_of, owner_of},
};

/// Notes, for blockers, that a hold begins.
#[inline(always)]
fn note_hold(mm: u64, kind: u32, write: bool, now: u64) {
    if write {
        blockers::note_write_hold(mm, kind, bpf_get_current_pid_tgid() as u32, now);
    } else {
        blockers::note_read_hold(mm, now);
    }
}

/// The state change of an acquire; returns what it completed, if anything.
#[inline(always)]
pub fn on_acquire(
    st: &mut ThreadState,
    task: Task,
    mm: u64,
    write: bool,
    success: bool,
    now: u64,
) -> Option<Done> {
    // The blocking acquire this ends (a thread waits for one lock at a time).
    let waiting = if st.slots[1].state == SlotState::Waiting && st.slots[1].mm == mm {
        1
    } else if st.slots[0].state == SlotState::Waiting && st.slots[0].mm == mm {
        0
    } else {
        2
    };
    if waiting < 2 {
        let s = &mut st.slots[waiting];
        if blockers_on() {
            blockers::end_wait(s, write);
        }
        if success {
            s.acq_ts = now;
            s.state = SlotState::Held;
            if blockers_on() {
                let s = *s;
                note_hold(mm, s.kind, write, now);
                if s.snapped != 0 {
                    blockers::take_charge(st, task, s, now, write);
                }
            }
            return None;
        }
        s.state = SlotState::Free;
        return Some(Done {
            owner_start: s.owner_start,
            wait: now.wrapping_sub(s.start_ts),
            hold: 0,
            owner: s.owner,
            kind: s.kind as u8,
            sample_seq: s.sample_seq,
            failed: 1,
        });
    }
    // No start_locking: a downgrade of a write lock this thread holds, or a trylock.
    if !write && success {
        let i = if downgradable(&st.slots[1], mm) {
            1
        } else if downgradable(&st.slots[0], mm) {
            0
        } else {
            2
        };
        if i < 2 {
            // mmap_write_downgrade: the write hold ends, a read hold begins that is not a
            // read acquisition.
            if blockers_on() {
                let (kind, acq_ts) = (st.slots[i].kind, st.slots[i].acq_ts);
                blockers::add_hold(st, mm, kind, acq_ts, now, task);
            }
            let s = &mut st.slots[i];
            let d = done_of(s, now);
            s.kind = cause::DOWNGRADE;
            s.start_ts = 0;
            s.sample_seq = 0;
            s.acq_ts = now;
            return Some(d);
        }
    }
    let (owner, owner_start, teardown) = owner_of(st, mm, true)?;
    // A write trylock (rare) finds its cause now.
    let kind = kind_of(task, write, teardown);
    if !success {
        return Some(Done {
            owner_start,
            wait: 0,
            hold: 0,
            owner,
            kind: kind as u8,
            sample_seq: 0,
            failed: 1,
        });
    }
    let idx = if st.slots[0].state == SlotState::Free {
        0
    } else if st.slots[1].state == SlotState::Free {
        1
    } else {
        bump(counter::NESTED);
        return None;
    };
    if blockers_on() {
        note_hold(mm, kind, write, now);
    }
    let s = &mut st.slots[idx];
    s.mm = mm;
    s.owner = owner;
    s.owner_start = owner_start;
    s.kind = kind;
    s.sample_seq = 0;
    s.snapped = 0;
    s.start_ts = 0;
    s.acq_ts = now;
    s.state = SlotState::Held;
    None
}

/// Is `s` a write lock of `mm` that a read acquire without start_locking downgrades?
#[inline(always)]
fn downgradable(s: &Slot, mm: u64) -> bool {
    s.state == SlotState::Held && s.mm == mm && s.kind != cause::READ && s.kind != cause::DOWNGRADE
}

/// The completed record of a held slot, released at `now`.
#[inline(always)]
pub fn done_of(s: &Slot, now: u64) -> Done {
    Done {
        owner_start: s.owner_start,
        wait: if s.start_ts == 0 {
            0
        } else {
            s.acq_ts.wrapping_sub(s.start_ts)
        },
        hold: now.wrapping_sub(s.acq_ts),
        owner: s.owner,
        kind: s.kind as u8,
        sample_seq: s.sample_seq,
        failed: 0,
    }
}

/// Puts a completed acquisition in the thread's ring. Runs with the lock held: stores only,
/// unless the ring is full.
#[inline(always)]
pub fn complete(st: &mut ThreadState, task: Task, d: Done) {
    let head = st.head;
    // SAFETY: `tail` may be written by another CPU holding the claim.
    let tail = unsafe { ptr::read_volatile(&st.tail) };
    // SAFETY: a helper without arguments.
    if konst(&SETTINGS.spill_test) != 0 && unsafe { bpf_get_prandom_u32() } & 1 != 0 {
        // Tests only (`MMAPLOCK_PROF_SPILL_TEST`): half the acquisitions take the spill path,
        // so that its counts are checked against ground truth.
        bump(counter::SPILLED);
        accum::spill(st, task, &d);
        return;
    }
    if head.wrapping_sub(tail) >= RING {
        // Many trylocks and no start_locking in between: accumulate now, under the lock,
        // rather than lose them; counted so the cost is visible. If another context holds
        // the ring, add this one to `STATS` directly instead of waiting.
        if accum::flush(st, task, false) {
            bump(counter::FLUSH_UNDER_LOCK);
        } else {
            bump(counter::SPILLED);
            accum::spill(st, task, &d);
            return;
        }
    }
    if head == tail {
        // The first pending acquisition since the ring was last emptied.
        note_activity();
    }
    st.ring[(head & (RING - 1)) as usize] = d;
    // The record before the index that publishes it (x86-64 keeps stores in order; the
    // claim's compare-and-swap orders it elsewhere).
    // SAFETY: a volatile store to a field of the thread's state.
    unsafe { ptr::write_volatile(&mut st.head, head.wrapping_add(1)) };
}

