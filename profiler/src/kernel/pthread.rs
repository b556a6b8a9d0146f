//! Where a glibc thread keeps its start routine: the offset of `start_routine` in this
//! glibc's `struct pthread` (where a thread's fs base points on x86_64), calibrated on a
//! thread of our own. The eBPF side reads a thread's own routine there as the thread is
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
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

extern "C" fn calibration_thread(arg: *mut libc::c_void) -> *mut libc::c_void {
    // On x86_64 glibc, pthread_self() is the thread's `struct pthread`, where the fs base points.
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    let want = [calibration_thread as *const () as u64, arg as u64];
    let Some(mem) = read_memory(std::process::id(), me, 4096) else {
        return std::ptr::null_mut();
    };
    let words: Vec<u64> = mem
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    match words.windows(2).position(|w| w == want) {
        // +1 so that offset 0 is distinguishable from "not found".
        Some(i) => (i * 8 + 1) as *mut libc::c_void,
        None => std::ptr::null_mut(),
    }
}

/// Offset of `start_routine` in this glibc's `struct pthread`, found by starting a thread
/// with a known routine and argument and looking for that pair (it varies between glibc
/// versions, so it is never hard-coded).
/// Calibrated once per run (memoized): the eBPF side and the roles both need it.
pub fn start_routine_offset() -> Option<u64> {
    static OFFSET: OnceLock<Option<u64>> = OnceLock::new();
    *OFFSET.get_or_init(calibrate)
}

fn calibrate() -> Option<u64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
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
        Some(ret as u64 - 1)
    }
}
