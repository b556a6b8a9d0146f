//! The writer that got a lock last after waiting for it, per lock: a wait that began behind
//! readers (the rwsem's owner word says readers, and names no writer) waits, from the moment
//! a writer queued ahead of it gets the lock, for that writer. The rwsem queues waiters in
//! order and hands the lock to a queued writer before the readers who came after it, so a
//! wait that ends after a writer's contended acquisition that happened during it spent that
//! last part behind that writer's hold.
//!
//! One slot per lock, by a hash of its address, written at a writer's `contention_end` with
//! the lock held for write: the lock itself serializes the writes of one lock's slot. Two
//! locks hashing alike take the slot from each other (the address is checked: a slot of
//! another lock is not used). Only the last writer is kept: a wait behind several writers
//! in turn is charged, from the last one's acquisition, to the last one, and before it to
//! the readers.

use aya_ebpf::{macros::map, maps::Array};

use super::waiter::Waiter;
use crate::kread::Comm;

/// Slots (a power of two).
const SLOTS: u32 = 1024;

/// A writer that got a lock after waiting for it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Queued {
    pub lock: u64,
    /// When it got the lock.
    pub acquired: u64,
    pub tid_start: u64,
    pub fsbase: u64,
    pub tid: u32,
    pub tgid: u32,
    /// What it took the lock for (a write cause).
    pub kind: u32,
    pub _pad: u32,
    pub comm: Comm,
}

#[map]
static QUEUED: Array<Queued> = Array::with_max_entries(SLOTS, 0);

#[inline(always)]
fn slot(lock: u64) -> u32 {
    // Locks are inside mm_structs, a kilobyte and more apart.
    ((lock >> 10) ^ (lock >> 20)) as u32 & (SLOTS - 1)
}

/// Writer `w` (thread `tid`) got `lock` at `now`, after waiting for it.
#[inline(always)]
pub fn note_writer(lock: u64, w: &Waiter, tid: u32, now: u64) {
    let Some(q) = QUEUED.get_ptr_mut(slot(lock)) else {
        return;
    };
    // SAFETY: an array element, valid for the map's life; written with the lock held for
    // write (see the module's doc), read by its later waiters.
    let q = unsafe { &mut *q };
    q.lock = lock;
    q.acquired = now;
    q.tid_start = w.tid_start;
    q.fsbase = w.fsbase;
    q.tid = tid;
    q.tgid = w.tgid;
    q.kind = w.kind;
    q.comm = w.comm;
}

/// The writer that got `lock` after `since` (a wait's start), other than thread `tid`
/// itself, if any.
#[inline(always)]
pub fn writer_in(lock: u64, since: u64, tid: u32) -> Option<Queued> {
    let q = QUEUED.get(slot(lock))?;
    (q.lock == lock && q.acquired > since && q.tid != tid).then_some(*q)
}
