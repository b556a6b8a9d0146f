//! Ground truth for write causes: exactly the given numbers of mmap, munmap, mprotect,
//! madvise and brk syscalls, from the main thread, after "ready" and a line on stdin.
//! Each of these takes the process's mmap_lock for write once.
//!
//!   lock-ops MMAP MUNMAP MPROTECT MADVISE BRK      (MUNMAP <= MMAP, MMAP >= 1 if MPROTECT or MADVISE)

fn main() {
    let [mmaps, munmaps, mprotects, madvises, brks] =
        integration_tests::numeric_args::<usize, 5>("lock-ops MMAP MUNMAP MPROTECT MADVISE BRK");
    assert!(munmaps <= mmaps && (mmaps > 0 || mprotects + madvises == 0));
    let mut maps = Vec::with_capacity(mmaps);
    // The current break, found before the measured part (this is a brk call too).
    // SAFETY: brk(0) only queries.
    let base = unsafe { libc::syscall(libc::SYS_brk, 0) } as usize;
    integration_tests::ready_then_wait_for_go();

    // SAFETY: raw syscalls on mappings this function creates and owns; nothing is dereferenced.
    unsafe {
        for _ in 0..mmaps {
            maps.push(integration_tests::map_anon(65536));
        }
        for i in 0..mprotects {
            let prot = if i % 2 == 0 {
                libc::PROT_READ
            } else {
                libc::PROT_READ | libc::PROT_WRITE
            };
            assert_eq!(libc::mprotect(maps[0], 65536, prot), 0);
        }
        for i in 0..madvises {
            // Changing the VMA's access hint edits its flags: a write acquisition.
            let advice = if i % 2 == 0 {
                libc::MADV_RANDOM
            } else {
                libc::MADV_NORMAL
            };
            assert_eq!(libc::madvise(maps[0], 65536, advice), 0);
        }
        // brk(2) directly (glibc's sbrk may add a call of its own to find the break).
        for i in 0..brks {
            let target = if i % 2 == 0 { base + 4096 } else { base };
            libc::syscall(libc::SYS_brk, target);
        }
        for p in maps.iter().take(munmaps) {
            assert_eq!(libc::munmap(*p, 65536), 0);
        }
    }
}
