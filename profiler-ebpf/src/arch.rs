//! What the programs read differently on each architecture they are built for
//! (`bpf_target_arch`, which aya-build sets from the userspace target): only how wide the
//! syscall number saved at kernel entry is. Where it is, and where every other register and
//! field is, comes from the running kernel's BTF (`KERNEL`); which syscall is which is
//! `cause::of_syscall`'s table for the same architecture.

use crate::kread::{self, Regs};

/// The syscall number in saved user registers `regs` (BTF-typed) at offset `off`, as a u64
/// (-1 at an exception's entry): x86_64's `orig_ax` is a u64; arm64's `syscallno` an s32,
/// whose neighbour (`unused2`, or `pmr_save`'s padding) is not part of it.
#[inline(always)]
pub fn syscall_nr(regs: Regs, off: u32) -> u64 {
    #[cfg(bpf_target_arch = "aarch64")]
    return regs.u32_at(off) as i32 as i64 as u64;
    #[cfg(not(bpf_target_arch = "aarch64"))]
    return regs.u64_at(off);
}

/// [`syscall_nr`] of registers at a kernel address `regs` (another task's, read with
/// `bpf_probe_read_kernel`).
#[inline(always)]
pub fn syscall_nr_at(regs: u64, off: u32) -> u64 {
    #[cfg(bpf_target_arch = "aarch64")]
    return kread::u32_at(regs + off as u64) as i32 as i64 as u64;
    #[cfg(not(bpf_target_arch = "aarch64"))]
    return kread::u64_at(regs + off as u64);
}
