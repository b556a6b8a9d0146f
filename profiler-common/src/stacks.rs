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
/// record as long as the stack is deep keeps eight times more shallow samples in the ring),
/// then to the record's end the [`V8Copy`]s of its V8 frames' objects.
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
    /// The link register (arm64 `x30`: the return address of a leaf function such as a
    /// syscall wrapper, which does not save it); 0 on x86_64.
    pub lr: u64,
    /// The one-in-N this sample was drawn at: `Settings::stack_sample`, or more in a process
    /// sampled past `Settings::max_stack_rate` (0: `stack_sample`).
    pub every: u32,
    pub _pad: u32,
}

/// A process's sampling rate under `Settings::max_stack_rate`, by tgid in `SAMPLE_RATE`;
/// read by userspace to say what a process was sampled at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SampleRate {
    /// The one-in-N its threads draw their next gap at (`stack_sample` times a power of 2).
    pub every: u32,
    /// Gaps drawn (samples to come) since `since`.
    pub drawn: u32,
    /// When the current window began (ns, the programs' clock).
    pub since: u64,
}

/// A sample as the eBPF side assembles it (in a per-CPU buffer) before sending the header,
/// the `stack_len` bytes of `stack` that were read, and right after them the [`V8Copy`]s
/// taken. The copies are made past `STACK_BYTES` ([`V8_COPY_SLOTS`] of room, a power of two:
/// the verifier is shown their offsets' bounds by a mask), then moved to follow the stack.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct StackSample {
    pub head: StackHeader,
    pub stack: [u8; STACK_BYTES + V8_COPY_SLOTS * size_of::<V8Copy>()],
}

/// A SharedFunctionInfo of process `tgid` (tagged address) whose name userspace has: set in
/// `V8_NAMED`, the eBPF side copies its frames' objects but not its name's (userspace names it
/// from its cache, checking the copied fields). A GC may put another function at the address:
/// then the name is read from the process, as without the copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct V8Named {
    pub tgid: u32,
    pub _pad: u32,
    pub sfi: u64,
}

/// Most entries of `V8_NAMED` (least recently used ones go first).
pub const V8_NAMED_ENTRIES: u32 = 32768;

/// Where a process's V8 frames keep their slots, and its JSFunctions their fields (offsets
/// from node's own `v8dbg_*` symbols), set by userspace in `V8_FRAMES` for each process whose
/// V8 it has read: with it, the eBPF side copies the objects of a sample's V8 frames at the
/// sample ([`V8Copy`]), from the thread's own memory and without the lock that a later read
/// by userspace takes (`process_vm_readv` takes the target's `mmap_lock`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct V8Frames {
    /// The context (or a frame type's marker) slot, from the frame pointer.
    pub fp_context: i32,
    pub fp_function: i32,
    pub fp_bytecode_array: i32,
    pub fp_bytecode_offset: i32,
    /// A JSFunction's SharedFunctionInfo and code fields, from its start (8-byte words
    /// below 64).
    pub function_shared: u32,
    pub function_code: u32,
    /// What naming a frame reads past those objects (WIP prototype): a SharedFunctionInfo's
    /// name-or-scope-info and script fields and a Script's name and source fields (8-byte
    /// words below 64), `Map::instance_type` within a map, the ScopeInfo type, a ScopeInfo's context
    /// local count and first variable slot indexes, and a String's length and one-byte
    /// characters offsets.
    pub sfi_name_or_scope_info: u32,
    pub sfi_script: u32,
    pub script_name: u32,
    pub map_instance_type: u32,
    pub scope_info_type: u32,
    pub scope_context_local_count: u32,
    pub scope_first_vars: u32,
    pub string_length: u32,
    pub string_chars: u32,
    /// A Script's source field (an 8-byte word below 64).
    pub script_source: u32,
}

/// Bytes of an object's start copied: the headers userspace checks and names from.
pub const V8_COPY_BYTES: usize = 72;
/// Most objects copied per sample for the frames themselves (up to five per frame: its
/// function, the function's map, SharedFunctionInfo, code and bytecode).
pub const MAX_FRAME_COPIES: usize = 64;
/// Most copies per sample in all: the frames' objects, then what naming their functions
/// reads (ScopeInfo, its name slots, name strings, Script, its name), up to this.
pub const MAX_V8_COPIES: usize = 127;
/// Room for copies in a [`StackSample`] (more than [`MAX_V8_COPIES`]: the count is masked
/// by `V8_COPY_SLOTS - 1`). 16 KiB of stack and 128 copies of 80 bytes stay under the 32 KiB
/// a per-CPU array's value may hold.
pub const V8_COPY_SLOTS: usize = 128;

/// An object's first [`V8_COPY_BYTES`] as the sampled thread's memory held them at the
/// sample (`addr`: the untagged address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct V8Copy {
    pub addr: u64,
    pub bytes: [u8; V8_COPY_BYTES],
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
