//! Reading another process's memory: `process_vm_readv`, or where that call is missing
//! (ENOSYS: qemu-user, which runs this project's arm64 build and its tests on an x86_64
//! machine, does not emulate it) the same ranges read from `/proc/PID/mem`, which takes the
//! same lock (the target's `mmap_lock`, for each range) and needs the same right
//! (`PTRACE_MODE_ATTACH`: CAP_SYS_PTRACE for another user's process). A real kernel never
//! takes the second path.

use std::os::unix::fs::FileExt as _;

/// `process_vm_readv(pid, local, remote, 0)` for iovecs paired one to one (`local[i]` as long
/// as `remote[i]`, as every caller here pairs them): the bytes read, stopping at the first
/// range that cannot be read whole; -1 (errno set) when the first cannot be read at all.
///
/// # Safety
/// Each local iovec must cover a buffer valid for writes of its length.
pub unsafe fn process_vm_readv(pid: u32, local: &[libc::iovec], remote: &[libc::iovec]) -> isize {
    // SAFETY: the caller's local iovecs are valid; the kernel checks the remote ranges.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return n;
    }
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return -1;
    };
    let mut total = 0isize;
    for (l, r) in local.iter().zip(remote) {
        // SAFETY: the caller's local iovec covers a buffer valid for writes of its length.
        let buf = unsafe { std::slice::from_raw_parts_mut(l.iov_base.cast::<u8>(), l.iov_len) };
        let want = buf.len().min(r.iov_len);
        match mem.read_at(&mut buf[..want], r.iov_base as u64) {
            Ok(got) => {
                total += got as isize;
                if got < want {
                    break;
                }
            }
            Err(_) if total == 0 => return -1,
            Err(_) => break,
        }
    }
    total
}
