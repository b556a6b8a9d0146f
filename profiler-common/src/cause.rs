//! What an acquisition was for: [`cause::READ`](READ) for every read acquisition, otherwise the
//! syscall or kernel path that took the lock for write. Part of [`StatsKey`](crate::StatsKey).

pub const READ: u32 = 0;
pub const MMAP: u32 = 1;
pub const MUNMAP: u32 = 2;
pub const MPROTECT: u32 = 3;
pub const BRK: u32 = 4;
pub const MADVISE: u32 = 5;
pub const MREMAP: u32 = 6;
/// A user page fault that needed the write lock (stack growth).
pub const PAGE_FAULT: u32 = 7;
/// The address space being torn down (exit_mmap), or any write by an exiting thread.
pub const EXIT: u32 = 8;
/// fork/clone copying the address space (dup_mmap write-locks the parent's mm).
pub const FORK: u32 = 9;
/// Anything else: mlock, prctl, execve, shmat, kernel threads (khugepaged)...
pub const OTHER: u32 = 10;
/// Not an acquisition: a write lock downgraded to a read lock (`mmap_write_downgrade`, by
/// munmap, brk, mremap and stack growth). Its entry counts downgrades, and its hold is the
/// read hold that follows; it never counts as a read acquisition.
pub const DOWNGRADE: u32 = 11;
pub const COUNT: u32 = 12;
/// Set on a `STATS` key's kind for a thread's *spill* entry: acquisitions of that kind the
/// thread added to `STATS` itself because its pending ring was full while another context
/// held it (the flush iterator). They belong to the kind: userspace adds the two entries.
pub const SPILLED: u32 = 0x100;

/// The kind an entry's acquisitions count under (a spill entry's, without [`SPILLED`]).
pub const fn base(kind: u32) -> u32 {
    kind & !SPILLED
}

/// Report name of a write cause.
pub fn name(c: u32) -> &'static str {
    match c {
        MMAP => "mmap",
        MUNMAP => "munmap",
        MPROTECT => "mprotect",
        BRK => "brk",
        MADVISE => "madvise",
        MREMAP => "mremap",
        PAGE_FAULT => "page_fault",
        EXIT => "exit",
        FORK => "fork",
        READ => "read",
        DOWNGRADE => "downgrade",
        _ => "other",
    }
}

/// `pt_regs.orig_ax` outside a syscall: x86 exception entry stores -1 there ("no syscall
/// to restart"; the hardware error code goes to the handler as an argument).
pub const NOT_A_SYSCALL: u64 = u64::MAX;
/// x32 syscalls carry this bit in their number.
const X32_SYSCALL_BIT: u64 = 0x4000_0000;

/// The write cause of a user thread taking the lock for write, from x86_64
/// `pt_regs.orig_ax` at its kernel entry: the syscall it is in, or, outside any syscall
/// (`NOT_A_SYSCALL`), a user page fault: the only exception that takes mmap_lock for write
/// (stack growth upgrading `lock_mm_and_find_vma`'s read lock).
#[inline(always)]
pub fn of_orig_ax(orig_ax: u64) -> u32 {
    if orig_ax == NOT_A_SYSCALL {
        return PAGE_FAULT;
    }
    match orig_ax & !X32_SYSCALL_BIT {
        9 => MMAP,
        11 => MUNMAP,
        10 | 329 => MPROTECT, // mprotect, pkey_mprotect
        12 => BRK,
        28 | 440 => MADVISE, // madvise, process_madvise
        25 => MREMAP,
        60 | 231 => EXIT,           // exit, exit_group
        56 | 57 | 58 | 435 => FORK, // clone, fork, vfork, clone3
        _ => OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How the kernel fills `pt_regs.orig_ax` on x86_64: the syscall entry stores the
    /// syscall number (rax) there; every exception entry, the page fault included, stores -1
    /// (arch/x86/entry: "no syscall to restart"), and passes the hardware error code as an
    /// argument, never in orig_ax.
    #[test]
    fn write_causes_follow_how_the_kernel_sets_orig_ax() {
        // Syscall entry: orig_ax = the syscall number.
        assert_eq!(of_orig_ax(9), MMAP);
        assert_eq!(of_orig_ax(11), MUNMAP);
        assert_eq!(of_orig_ax(10), MPROTECT);
        assert_eq!(of_orig_ax(329), MPROTECT);
        assert_eq!(of_orig_ax(12), BRK);
        assert_eq!(of_orig_ax(28), MADVISE);
        assert_eq!(of_orig_ax(25), MREMAP);
        assert_eq!(of_orig_ax(231), EXIT);
        assert_eq!(of_orig_ax(56), FORK);
        assert_eq!(of_orig_ax(435), FORK);
        // x32 syscalls carry bit 30.
        assert_eq!(of_orig_ax(0x4000_0000 | 9), MMAP);
        // Small syscall numbers are syscalls, not fault error codes: shmat (30) with a
        // mapping to create, stat (4), poll (7), writev (20) stay as they are.
        assert_eq!(of_orig_ax(30), OTHER);
        assert_eq!(of_orig_ax(4), OTHER);
        assert_eq!(of_orig_ax(6), OTHER);
        assert_eq!(of_orig_ax(149), OTHER); // mlock
        // Exception entry (a user page fault growing the stack): orig_ax = -1.
        assert_eq!(of_orig_ax(NOT_A_SYSCALL), PAGE_FAULT);
        assert_eq!(of_orig_ax(-1i64 as u64), PAGE_FAULT);
        assert_eq!(name(MPROTECT), "mprotect");
        assert_eq!(name(DOWNGRADE), "downgrade");
        assert_eq!(name(COUNT + 5), "other");
    }
}
