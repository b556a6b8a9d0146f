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

/// The syscall number the kernel saves at an exception's entry, where there is no syscall:
/// -1 on both architectures (x86_64 `pt_regs.orig_ax`: "no syscall to restart", the hardware
/// error code going to the handler as an argument; arm64 `pt_regs.syscallno`: `NO_SYSCALL`,
/// stored by every entry from user mode before a syscall's own number replaces it).
pub const NOT_A_SYSCALL: u64 = u64::MAX;

/// The write cause of a user thread taking the lock for write, from the syscall number saved
/// at its kernel entry, as this build's architecture numbers syscalls: the syscall it is in,
/// or, outside any syscall ([`NOT_A_SYSCALL`]), a user page fault: the only exception that
/// takes mmap_lock for write (stack growth upgrading `lock_mm_and_find_vma`'s read lock).
/// Both tables are compiled (and tested) everywhere; the eBPF programs, built for `bpfel`,
/// take the one of the architecture they are built for (`bpf_target_arch`, which aya-build
/// sets from the userspace target).
#[inline(always)]
pub fn of_syscall(nr: u64) -> u32 {
    #[cfg(any(
        bpf_target_arch = "aarch64",
        all(not(target_arch = "bpf"), target_arch = "aarch64")
    ))]
    return syscalls::aarch64(nr);
    #[cfg(not(any(
        bpf_target_arch = "aarch64",
        all(not(target_arch = "bpf"), target_arch = "aarch64")
    )))]
    return syscalls::x86_64(nr);
}

/// Each architecture's syscall numbers of the calls that take mmap_lock for write.
pub mod syscalls {
    use super::*;

    /// x32 syscalls carry this bit in their number.
    const X32_SYSCALL_BIT: u64 = 0x4000_0000;

    /// x86_64 (`arch/x86/entry/syscalls/syscall_64.tbl`), `pt_regs.orig_ax`.
    #[inline(always)]
    pub fn x86_64(nr: u64) -> u32 {
        if nr == NOT_A_SYSCALL {
            return PAGE_FAULT;
        }
        match nr & !X32_SYSCALL_BIT {
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

    /// arm64, whose numbers are the generic table's (`include/uapi/asm-generic/unistd.h`:
    /// no fork or vfork, glibc forks with clone), `pt_regs.syscallno` (an s32, sign-extended
    /// by the reader). 32-bit (compat) tasks number their syscalls as arm does: Node and
    /// glibc on arm64 hosts are 64-bit; a compat task's writes may be misnamed here.
    #[inline(always)]
    pub fn aarch64(nr: u64) -> u32 {
        if nr == NOT_A_SYSCALL {
            return PAGE_FAULT;
        }
        match nr {
            222 => MMAP,
            215 => MUNMAP,
            226 | 288 => MPROTECT, // mprotect, pkey_mprotect
            214 => BRK,
            233 | 440 => MADVISE, // madvise, process_madvise
            216 => MREMAP,
            93 | 94 => EXIT,   // exit, exit_group
            220 | 435 => FORK, // clone, clone3
            _ => OTHER,
        }
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
        let of = syscalls::x86_64;
        // Syscall entry: orig_ax = the syscall number.
        assert_eq!(of(9), MMAP);
        assert_eq!(of(11), MUNMAP);
        assert_eq!(of(10), MPROTECT);
        assert_eq!(of(329), MPROTECT);
        assert_eq!(of(12), BRK);
        assert_eq!(of(28), MADVISE);
        assert_eq!(of(25), MREMAP);
        assert_eq!(of(231), EXIT);
        assert_eq!(of(56), FORK);
        assert_eq!(of(435), FORK);
        // x32 syscalls carry bit 30.
        assert_eq!(of(0x4000_0000 | 9), MMAP);
        // Small syscall numbers are syscalls, not fault error codes: shmat (30) with a
        // mapping to create, stat (4), poll (7), writev (20) stay as they are.
        assert_eq!(of(30), OTHER);
        assert_eq!(of(4), OTHER);
        assert_eq!(of(6), OTHER);
        assert_eq!(of(149), OTHER); // mlock
        // Exception entry (a user page fault growing the stack): orig_ax = -1.
        assert_eq!(of(NOT_A_SYSCALL), PAGE_FAULT);
        assert_eq!(of(-1i64 as u64), PAGE_FAULT);
        assert_eq!(name(MPROTECT), "mprotect");
        assert_eq!(name(DOWNGRADE), "downgrade");
        assert_eq!(name(COUNT + 5), "other");
    }

    /// arm64's entry from user mode stores `NO_SYSCALL` (-1) in `pt_regs.syscallno` for
    /// every exception (arch/arm64/kernel/entry.S, `kernel_entry`), and the SVC handler then
    /// its number (`el0_svc_common`). The numbers are asm-generic's.
    #[test]
    fn arm64_write_causes_follow_the_generic_syscall_table() {
        let of = syscalls::aarch64;
        assert_eq!(of(222), MMAP);
        assert_eq!(of(215), MUNMAP);
        assert_eq!(of(226), MPROTECT);
        assert_eq!(of(288), MPROTECT);
        assert_eq!(of(214), BRK);
        assert_eq!(of(233), MADVISE);
        assert_eq!(of(440), MADVISE);
        assert_eq!(of(216), MREMAP);
        assert_eq!(of(93), EXIT);
        assert_eq!(of(94), EXIT);
        assert_eq!(of(220), FORK);
        assert_eq!(of(435), FORK);
        // x86_64's numbers mean other calls here: 9 is lsetxattr, 12 getcwd, 231 munlockall,
        // 56 openat.
        for nr in [
            9, 11, 10, 12, 28, 25, 231, 56, 228, /* mlock */
            221, /* execve */
        ] {
            assert_eq!(of(nr), OTHER, "{nr}");
        }
        // A page fault: syscallno is an s32 -1, read sign-extended.
        assert_eq!(of(-1i32 as i64 as u64), PAGE_FAULT);
        assert_eq!(of(NOT_A_SYSCALL), PAGE_FAULT);
        // The build's own table is the one its architecture numbers with.
        if cfg!(target_arch = "aarch64") {
            assert_eq!(of_syscall(222), MMAP);
        } else {
            assert_eq!(of_syscall(9), MMAP);
        }
    }
}
