//! Reading kernel memory, behind a small safe interface.
//!
//! Two kinds of read: plain loads through a BTF-typed pointer (the current task, its saved user
//! registers, a task handed to an iterator), which the verifier checks against the kernel's own
//! type information at load time and which cost one instruction; and `bpf_probe_read_kernel`
//! for addresses the verifier knows nothing of (an `mm_struct` from a tracepoint argument, a
//! pointer read out of a task), which returns 0 where the memory cannot be read. Field offsets
//! come from the load-time `KERNEL` global, found in the running kernel's BTF.

use core::{ffi::c_void, ptr};

use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_get_current_task_btf, bpf_probe_read_kernel,
    bpf_probe_read_kernel_buf, bpf_probe_read_user, generated::bpf_task_pt_regs,
};

/// A task, through its BTF-typed pointer (`struct task_struct *` as the verifier sees it).
#[derive(Clone, Copy)]
pub struct Task(*mut c_void);

impl Task {
    /// The thread running this program.
    #[inline(always)]
    pub fn current() -> Task {
        // SAFETY: no preconditions; the kernel returns the running task, never null.
        Task(unsafe { bpf_get_current_task_btf() }.cast())
    }

    /// A task pointer the kernel handed over typed (an iterator's, a tracepoint's), non-null.
    #[inline(always)]
    pub fn from_btf(p: *mut c_void) -> Option<Task> {
        (!p.is_null()).then_some(Task(p))
    }

    /// The pointer, for helpers that take a task (task storage).
    #[inline(always)]
    pub fn as_ptr(self) -> *mut c_void {
        self.0
    }

    /// The task's address as a plain number, for `bpf_probe_read_kernel` reads.
    #[inline(always)]
    pub fn addr(self) -> u64 {
        self.0 as u64
    }

    /// A scalar `u32` field at a load-time offset.
    #[inline(always)]
    pub fn u32_at(self, off: u32) -> u32 {
        // SAFETY: a plain load through a BTF-typed task pointer: the verifier checks at load
        // time that `off` (a known constant from the frozen `KERNEL` global) lands on a u32
        // member of `struct task_struct` and rejects the program otherwise; such loads
        // cannot fault.
        unsafe { ptr::read_volatile(self.0.cast::<u8>().add(off as usize).cast::<u32>()) }
    }

    /// A scalar `u64` field at a load-time offset.
    #[inline(always)]
    pub fn u64_at(self, off: u32) -> u64 {
        // SAFETY: as for `u32_at`, on a u64 member.
        unsafe { ptr::read_volatile(self.0.cast::<u8>().add(off as usize).cast::<u64>()) }
    }

    /// The user registers saved at the task's kernel entry (`struct pt_regs`).
    #[inline(always)]
    pub fn user_regs(self) -> Option<Regs> {
        // SAFETY: `self.0` is a BTF task pointer, which the helper requires.
        let p = unsafe { bpf_task_pt_regs(self.0.cast()) } as u64;
        (p != 0).then_some(Regs(p as *mut c_void))
    }
}

/// A task's saved user registers, through their BTF-typed pointer.
#[derive(Clone, Copy)]
pub struct Regs(*mut c_void);

impl Regs {
    /// The pointer, as the verifier types it.
    #[inline(always)]
    pub fn as_ptr(self) -> *mut c_void {
        self.0
    }

    /// A `u32` member of `struct pt_regs` (arm64's `syscallno`) at a load-time offset.
    #[cfg_attr(not(bpf_target_arch = "aarch64"), allow(dead_code))]
    #[inline(always)]
    pub fn u32_at(self, off: u32) -> u32 {
        // SAFETY: as for `u64_at`, on a 4-byte member.
        unsafe { ptr::read_volatile(self.0.cast::<u8>().add(off as usize).cast::<u32>()) }
    }

    /// A register (`u64` member of `struct pt_regs`) at a load-time offset.
    #[inline(always)]
    pub fn u64_at(self, off: u32) -> u64 {
        // SAFETY: a plain load through the BTF-typed pt_regs pointer bpf_task_pt_regs
        // returned: the verifier checks the constant offset against `struct pt_regs`.
        unsafe { ptr::read_volatile(self.0.cast::<u8>().add(off as usize).cast::<u64>()) }
    }
}

/// The current task's address as a plain number (for `bpf_probe_read_kernel` chains).
#[inline(always)]
pub fn current_addr() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_get_current_task() }
}

/// A kernel `u64` at `addr`; 0 if it cannot be read.
#[inline(always)]
pub fn u64_at(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_kernel checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// A `u64` of the current task's user memory at `addr`; 0 if it cannot be read (unmapped, or
/// not resident: a tracepoint cannot fault a page in).
#[inline(always)]
pub fn user_u64(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(0)
}

/// A kernel `u32` at `addr`; 0 if it cannot be read.
#[inline(always)]
pub fn u32_at(addr: u64) -> u32 {
    // SAFETY: as for `u64_at`.
    unsafe { bpf_probe_read_kernel(addr as *const u32) }.unwrap_or(0)
}

/// A command name (`TASK_COMM_LEN` bytes) as two words: copied and compared with two loads
/// and stores. (A `[u8; 16]` has byte alignment, and LLVM turns its copies and zeroing into
/// calls of a byte-by-byte memcpy or memset, which the verifier walks byte by byte.)
pub type Comm = [u64; 2];

/// A comm field of a shared struct seen as words, to write: the fields are all at 8-byte
/// aligned offsets (checked below), in 8-byte aligned map values.
#[inline(always)]
pub fn as_comm_mut(c: &mut [u8; 16]) -> &mut Comm {
    // SAFETY: same size; the field is 8-byte aligned (see the assertions below).
    unsafe { &mut *ptr::from_mut(c).cast::<Comm>() }
}

const _: () = {
    use core::mem::offset_of;
    use profiler_common::{Filter, NewThread, ThreadStats};
    assert!(size_of::<[u8; profiler_common::COMM_LEN]>() == size_of::<Comm>());
    assert!(offset_of!(ThreadStats, comm) % 8 == 0);
    assert!(offset_of!(NewThread, comm) % 8 == 0);
    assert!(align_of::<Filter>() >= 4);
};

/// A comm read from kernel memory at `addr` (zero if it cannot be read).
#[inline(always)]
pub fn comm_at(addr: u64) -> Comm {
    [u64_at(addr), u64_at(addr + 8)]
}

/// Stores a comm with two word stores (volatile, so that they stay two stores and do not
/// become a call of memcpy).
#[inline(always)]
pub fn set_comm(dst: &mut Comm, src: &Comm) {
    // SAFETY: volatile stores to the two words of a valid, aligned array.
    unsafe {
        ptr::write_volatile(&mut dst[0], src[0]);
        ptr::write_volatile(&mut dst[1], src[1]);
    }
}

/// A plain-data value copied from `src` to `dst` with one helper call rather than an
/// inlined loop (large structs: LLVM calls a byte-wise memcpy for them otherwise).
#[inline(always)]
pub fn copy<T: Copy>(dst: &mut T, src: &T) {
    // SAFETY: both are valid references to `T`, which is plain data; the helper copies
    // size_of::<T>() bytes from kernel memory we own (a map value) and cannot fault there.
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            ptr::from_mut(dst).cast(),
            size_of::<T>() as u32,
            ptr::from_ref(src).cast(),
        )
    };
}

/// Kernel bytes at `addr` into `dst`; false if they cannot be read.
#[inline(always)]
pub fn bytes_at(addr: u64, dst: &mut [u8]) -> bool {
    // SAFETY: as for `u64_at`; `dst` is a valid buffer of its length.
    unsafe { bpf_probe_read_kernel_buf(addr as *const u8, dst) }.is_ok()
}
