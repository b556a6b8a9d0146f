//! `--blockers`: each lock's hold times per holder (`LOCKS`), and the waits charged to
//! each holder (`BLOCKED`).

use bytemuck::{Pod, Zeroable};

/// Holder slots per lock: a holder (thread and kind of hold) adds its hold times to slot
/// `holder_slot(tid, kind)`; two holders sharing a slot are charged as its latest one.
pub const HOLDER_SLOTS: usize = 64;
/// Locks whose holds are accumulated at once: a slot each, by a hash of the mm address.
pub const LOCK_SLOTS: u32 = 1024;

/// The slot of a holder (a thread, and what it held the lock for) in [`LockAcc::held`].
#[inline(always)]
pub fn holder_slot(tid: u32, kind: u32) -> usize {
    let h = (tid as u64 ^ ((kind as u64) << 24)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 58) as usize & (HOLDER_SLOTS - 1)
}

/// Who last added to a holder slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HolderId {
    pub tid_start: u64,
    pub tid: u32,
    pub tgid: u32,
    /// [`cause::READ`](crate::cause::READ), a write cause, or
    /// [`cause::DOWNGRADE`](crate::cause::DOWNGRADE).
    pub kind: u32,
    pub _pad: u32,
}

/// One lock's hold times, cumulative per holder slot (an element of the `LOCKS` array). A
/// waiter copies `held` when it starts waiting and when it gets the lock: the difference is
/// what each holder held the lock for while it waited, however many holds that was.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct LockAcc {
    /// The lock (`mm_struct` address) this slot accumulates now.
    pub mm: u64,
    /// Holds added so far (a waiter that saw none released during its wait has nothing to
    /// charge).
    pub releases: u64,
    /// The write hold in progress: its start (0: none) and its holder slot.
    pub cur_acq: u64,
    pub cur_slot: u64,
    /// The last hold added: when it ended and its slot (a waiter that got the lock later
    /// waited that long for it to be handed over).
    pub last_rel: u64,
    pub last_slot: u64,
    /// Profiled writers waiting for the lock now: while there are any, read holds are added
    /// too (only then can a read hold make anyone wait).
    pub waiting: u64,
    pub _pad: u64,
    pub held: [u64; HOLDER_SLOTS],
    pub ids: [HolderId; HOLDER_SLOTS],
}

/// Key of the `BLOCKED` map: who waited for which lock (the waiter's side), and whose hold
/// made it wait (the holder's side).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct BlockedKey {
    pub owner: u32,
    pub waiter_tid: u32,
    pub holder_tid: u32,
    pub holder_tgid: u32,
    /// The holder's hold: [`cause::READ`](crate::cause::READ), a write cause, or
    /// [`cause::DOWNGRADE`](crate::cause::DOWNGRADE).
    pub holder_kind: u32,
    /// [`READ`](crate::READ) or [`WRITE`](crate::WRITE): what the waiter waited for.
    pub waiter_op: u32,
    pub owner_start: u64,
    pub waiter_start: u64,
    pub holder_start: u64,
}

/// Value of the `BLOCKED` map, cumulative (updated with atomic adds by any waiter).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockedVal {
    /// Waits that this holder's hold overlapped.
    pub waits: u64,
    /// The part of those waits charged to it, ns.
    pub wait_ns: u64,
}
