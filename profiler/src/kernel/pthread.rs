//! Where a glibc thread keeps its start routine: the offset of `start_routine` in this
//! glibc's `struct pthread` from the thread pointer the kernel keeps (x86_64's fs base, which
//! points at the `struct pthread`; arm64's TPIDR_EL0, which points just past it), calibrated
//! on a thread of our own. The eBPF side reads a thread's own routine there as the thread is
//! announced (`Settings::start_routine_off`), and the registry reads other processes'
//! threads' from outside.

use std::sync::OnceLock;

/// Reads `len` bytes of process `pid` at `addr`; short or None where unmapped.
pub fn read_memory(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the local iovec covers `buf`, which outlives the call; the kernel checks the
    // remote range and fails (EFAULT) or stops short instead of faulting.
    let n = unsafe { super::vmread::process_vm_readv(pid, &[local], &[remote]) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// The thread pointer the kernel keeps for the calling thread (`KernelLayout::task_fsbase`):
/// x86_64's fs base (glibc's `struct pthread` itself, whose first word points to itself),
/// arm64's TPIDR_EL0 (glibc's TCB, which follows its `struct pthread`).
pub(crate) fn thread_pointer() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: u64;
        // SAFETY: reads the first word of the thread's TCB (`tcbhead_t.tcb`, its own
        // address), which glibc sets up before any Rust code runs.
        unsafe {
            std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
        };
        Some(tp)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: u64;
        // SAFETY: reads a system register user mode may read; no memory is touched.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags))
        };
        Some(tp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// How far `struct pthread` is searched on each side of `pthread_self()` for the pair: it is
/// about 2 KiB (glibc 2.36: 0x700 on arm64 with its padding, 0x900 on x86_64).
const SEARCH: u64 = 4096;

extern "C" fn calibration_thread(arg: *mut libc::c_void) -> *mut libc::c_void {
    // glibc's pthread_self() is the thread's `struct pthread`, which holds the routine and
    // its argument side by side; where the kernel's thread pointer is relative to it is the
    // architecture's business.
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    let Some(tp) = thread_pointer() else {
        return std::ptr::null_mut();
    };
    let want = [calibration_thread as *const () as u64, arg as u64];
    let Some(mem) = read_memory(std::process::id(), me, SEARCH as usize) else {
        return std::ptr::null_mut();
    };
    let words: Vec<u64> = mem
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    match words.windows(2).position(|w| w == want) {
        Some(i) => {
            let at = me + i as u64 * 8;
            let off = at.wrapping_sub(tp) as i64;
            // Sent back biased by one word so that 0 stays "not found" (0 itself is never
            // the offset: the thread pointer's own word is glibc's, not the routine).
            match i32::try_from(off) {
                Ok(o) if o != 0 => (i64::from(o) + BIAS) as usize as *mut libc::c_void,
                _ => std::ptr::null_mut(),
            }
        }
        None => std::ptr::null_mut(),
    }
}

/// What the calibration thread adds to the offset it returns (a null return is a failure).
const BIAS: i64 = 1 << 32;

/// Where `start_routine` is in this glibc's `struct pthread`, relative to the thread pointer
/// the kernel keeps (positive on x86_64, negative on arm64), found by starting a thread with
/// a known routine and argument and looking for that pair (it varies between glibc versions,
/// so it is never hard-coded). Calibrated once per run (memoized): the eBPF side and the
/// roles both need it.
pub fn start_routine_offset() -> Option<i32> {
    static OFFSET: OnceLock<Option<i32>> = OnceLock::new();
    *OFFSET.get_or_init(calibrate)
}

fn calibrate() -> Option<i32> {
    thread_pointer()?;
    let mut t: libc::pthread_t = 0;
    let arg = 0x6d6c_7066_u64 as *mut libc::c_void; // any recognisable value
    // SAFETY: a joinable thread running a function that only reads memory through
    // process_vm_readv; joined right away.
    unsafe {
        if libc::pthread_create(&mut t, std::ptr::null(), calibration_thread, arg) != 0 {
            return None;
        }
        let mut ret: *mut libc::c_void = std::ptr::null_mut();
        if libc::pthread_join(t, &mut ret) != 0 || ret.is_null() {
            return None;
        }
        i32::try_from(ret as usize as i64 - BIAS).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn known_routine(arg: *mut libc::c_void) -> *mut libc::c_void {
        // What the kernel side reads of a thread: its routine, at the offset from the
        // thread pointer.
        let tp = thread_pointer().expect("a thread pointer");
        let off = start_routine_offset().expect("calibrated");
        let at = tp.wrapping_add_signed(i64::from(off));
        let words = read_memory(std::process::id(), at, 16).expect("readable");
        let routine = u64::from_ne_bytes(words[..8].try_into().unwrap());
        let argument = u64::from_ne_bytes(words[8..].try_into().unwrap());
        assert_eq!(routine, known_routine as *const () as u64);
        assert_eq!(argument, arg as u64);
        std::ptr::null_mut()
    }

    /// The offset found on one thread finds another thread's routine from its thread
    /// pointer, on the side of it the architecture puts `struct pthread`.
    #[test]
    fn the_offset_finds_another_threads_routine() {
        let off = start_routine_offset().expect("glibc's struct pthread calibrated");
        if cfg!(target_arch = "aarch64") {
            assert!(off < 0, "{off}: struct pthread precedes TPIDR_EL0's TCB");
        } else {
            assert!(off > 0, "{off}: the fs base is the struct pthread");
        }
        let mut t: libc::pthread_t = 0;
        // SAFETY: a joinable thread, joined at once; it only reads our own memory.
        unsafe {
            assert_eq!(
                libc::pthread_create(&mut t, std::ptr::null(), known_routine, 0x1234 as *mut _),
                0
            );
            assert_eq!(libc::pthread_join(t, std::ptr::null_mut()), 0);
        }
    }
}
