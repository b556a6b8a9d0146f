//! Sampled writes' user stacks, on the `STACKS` ring buffer.

use bytemuck::{Pod, Zeroable};

/// Bytes of user stack copied per sampled write (from the stack pointer up).
pub const STACK_BYTES: usize = 16384;
/// The stack is read in chunks, so that a stack shallower than `STACK_BYTES` (the top of the
/// mapping is near) still yields what is there.
pub const STACK_CHUNK: usize = 2048;

/// Set on the sequence number of a sampled contended read (contention mode): only the stack
/// of the writer it waits behind is taken ([`stack_record::HOLDER`]), none of its own. The
/// writes' numbers stay below it.
pub const READ_WAIT_SEQ: u32 = 1 << 16;

/// Records on the `STACKS` ring buffer start with one of these tags.
pub mod stack_record {
    /// A [`super::StackSample`], sent at `start_locking` (before the lock is held).
    pub const SAMPLE: u32 = 1;
    /// A [`super::SampleDone`], sent when that acquisition is released.
    pub const DONE: u32 = 2;
    /// A [`super::StackHeader`] and stack of the thread holding the lock for write when a
    /// sampled wait began (contention mode): `tid`, `tgid` and `kind` are the holder's,
    /// `seq` and `waiter` the waiter's sample, whose [`DONE`] gives the wait charged to it.
    pub const HOLDER: u32 = 3;
}

/// What a sampled write's record says before its stack: a [`stack_record::SAMPLE`] record on
/// the ring is this header followed by `stack_len` bytes of stack (not `STACK_BYTES`: a
/// record as long as the stack is deep keeps eight times more shallow samples in the ring).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct StackHeader {
    pub tag: u32,
    pub owner: u32,
    pub tid: u32,
    pub tgid: u32,
    /// The write cause.
    pub kind: u32,
    /// Per-thread sequence number, matched by the [`SampleDone`] of the same acquisition.
    pub seq: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Start time of the owner (see [`StatsKey::owner_start`](crate::StatsKey::owner_start)).
    pub owner_start: u64,
    /// Bytes of stack that follow (from `sp` up; a multiple of `STACK_CHUNK`).
    pub stack_len: u32,
    /// A [`stack_record::HOLDER`]'s waiting thread (whose sample `seq` is); 0 otherwise.
    pub waiter: u32,
}

/// A sample as the eBPF side assembles it (in a per-CPU buffer) before sending the header and
/// the `stack_len` bytes of `stack` that were read.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct StackSample {
    pub head: StackHeader,
    pub stack: [u8; STACK_BYTES],
}

/// The outcome of a sampled acquisition: its wait and hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SampleDone {
    pub tag: u32,
    pub tid: u32,
    pub seq: u32,
    pub _pad: u32,
    pub wait_ns: u64,
    pub hold_ns: u64,
}
