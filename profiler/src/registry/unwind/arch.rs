//! The CPU's part of unwinding: framehop's unwinder and registers for the architecture this
//! build runs on (x86_64, or arm64), and how a frame pointer chain is climbed there. Both
//! keep a frame record of two words where the frame pointer points: the caller's frame
//! pointer, then the return address (x86_64 `push rbp; mov rbp, rsp`, arm64 `stp x29, x30,
//! [sp, #-N]!; mov x29, sp`; V8 makes its frames the same way on both). What differs:
//! arm64 returns through the link register, so the first frame (a syscall wrapper, a leaf)
//! needs it; and its return addresses may be signed (pointer authentication, for code built
//! with `-mbranch-protection` on a CPU that has it), the signature in the bits above the
//! address space's, which are stripped.

use super::UserRegs;

#[cfg(target_arch = "aarch64")]
mod imp {
    use framehop::aarch64::PtrAuthMask;
    pub use framehop::aarch64::{
        CacheAarch64 as Cache, UnwindRegsAarch64 as Regs, UnwinderAarch64 as Unwinder,
    };

    /// User addresses fit in 48 bits unless a process asks for more (52-bit VA kernels map
    /// above 2^48 only on request): the bits above the highest address known are a
    /// signature's.
    pub fn regs(r: super::UserRegs, highest: u64) -> Regs {
        let mask = PtrAuthMask::from_max_known_address(highest.max((1 << 48) - 1));
        Regs::new_with_ptr_auth_mask(mask, r.lr, r.sp, r.fp)
    }

    pub fn fp(r: &Regs) -> u64 {
        r.fp()
    }

    pub fn sp(r: &Regs) -> u64 {
        r.sp()
    }

    pub fn strip(r: &Regs, addr: u64) -> u64 {
        r.lr_mask().strip_ptr_auth(addr)
    }

    /// After a frame pointer step: the caller's frame pointer and stack pointer, and its
    /// return address as the link register (what framehop reads for a frame with no saved
    /// one).
    pub fn step(r: &mut Regs, sp: u64, fp: u64, ra: u64) {
        r.set_sp(sp);
        r.set_fp(fp);
        r.set_lr(ra);
    }
}

#[cfg(not(target_arch = "aarch64"))]
mod imp {
    pub use framehop::x86_64::{
        CacheX86_64 as Cache, UnwindRegsX86_64 as Regs, UnwinderX86_64 as Unwinder,
    };

    pub fn regs(r: super::UserRegs, _highest: u64) -> Regs {
        Regs::new(r.ip, r.sp, r.fp)
    }

    pub fn fp(r: &Regs) -> u64 {
        r.bp()
    }

    pub fn sp(r: &Regs) -> u64 {
        r.sp()
    }

    pub fn strip(_: &Regs, addr: u64) -> u64 {
        addr
    }

    pub fn step(r: &mut Regs, sp: u64, fp: u64, _ra: u64) {
        r.set_sp(sp);
        r.set_bp(fp);
    }
}

pub use imp::{Cache, Regs, Unwinder};

/// framehop's registers for a stack sampled with `r`; `highest`: the end of the process's
/// highest mapping known (where arm64's signed return addresses keep their signature).
pub fn regs(r: UserRegs, highest: u64) -> Regs {
    imp::regs(r, highest)
}

/// The frame pointer in `r`.
pub fn fp(r: &Regs) -> u64 {
    imp::fp(r)
}

/// One step up a frame pointer chain: `[fp]` is the caller's frame pointer, `[fp + 8]` the
/// return address, and the caller's stack pointer is `fp + 16`. None when the frame pointer
/// is not inside the current frame's stack, the caller's does not lie above it (garbage, or
/// the end of the chain), or a read leaves the copied stack.
pub fn frame_pointer_step(
    regs: &mut Regs,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<u64> {
    let fp = imp::fp(regs);
    if fp < imp::sp(regs) || !fp.is_multiple_of(8) {
        return None;
    }
    let caller_fp = read_stack(fp).ok()?;
    let ra = imp::strip(regs, read_stack(fp.checked_add(8)?).ok()?);
    if ra == 0 || (caller_fp != 0 && caller_fp <= fp) {
        return None;
    }
    imp::step(regs, fp + 16, caller_fp, ra);
    Some(ra)
}
