//! Reading a glibc thread's start routine from outside: the calibrated offset of
//! `start_routine` in glibc's `struct pthread` (where a thread's fs base points on x86_64),
//! another process's memory, and which C library a process maps. Thread roles
//! (`attribution`) are decided from what is read here.

use std::path::Path;

use crate::registry::{procmaps::Maps, untrusted};

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
pub fn start_routine_offset() -> Option<u64> {
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

/// The C library mapped into a process, as (device, inode) of its file.
pub fn libc_identity(pid: u32, maps: &Maps) -> Option<(u64, u64)> {
    let path = maps.iter().find_map(|m| {
        let p = m.path.as_ref()?;
        let name = p.file_name()?.to_str()?;
        (name.starts_with("libc.so") || name.starts_with("libc-")).then_some(p)
    })?;
    // Through /proc/PID/root, so that a process in another mount namespace is compared right;
    // no link followed on the way (a target's file: registry::untrusted).
    let root = format!("/proc/{pid}/root{}", path.display());
    let o = untrusted::open(Path::new(&root), &untrusted::Policy::ELF).ok()?;
    Some((o.dev, o.inode))
}
