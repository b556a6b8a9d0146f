//! Telling userspace about a thread while it runs (`NEW_THREADS`): who it is, and the start
//! routine only the thread itself can read, so that its role is known even if its process is
//! gone by the time userspace looks. Both modes announce a thread at its first profiled lock;
//! contention mode also a holder first charged with a wait.

use profiler_common::NewThread;

use crate::{kread, maps::NEW_THREADS};

/// Who a thread is, as its entries and announcements carry it.
#[derive(Clone, Copy)]
pub struct Identity {
    pub tid: u32,
    pub tgid: u32,
    pub tid_start: u64,
    pub fsbase: u64,
    pub comm: kread::Comm,
}

/// Sends a thread's announcement on NEW_THREADS (lost quietly if the ring is full: the
/// thread is then classified at the next reading, from its entries).
#[inline(always)]
pub fn announce_thread(who: &Identity, owner: u32, owner_start: u64, start_routine: u64) {
    let Some(mut entry) = NEW_THREADS.reserve::<NewThread>(0) else {
        return;
    };
    let n = entry.as_mut_ptr();
    // SAFETY: a reserved record of NewThread's size, ours until submitted, written field by
    // field.
    unsafe {
        (*n).owner = owner;
        (*n).tid = who.tid;
        (*n).tgid = who.tgid;
        (*n)._pad = 0;
        (*n).owner_start = owner_start;
        (*n).tid_start = who.tid_start;
        (*n).fsbase = who.fsbase;
        (*n).start_routine = start_routine;
        kread::set_comm(kread::as_comm_mut(&mut (*n).comm), &who.comm);
    }
    entry.submit(0);
}

