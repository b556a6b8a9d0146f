//! Whether a process seen before still lives, asked of a pidfd rather than of /proc. The
//! profiler asks it after every read of a process's memory or files (a new thread's start
//! routine, its name, its executable, a stack's unwinder), to know that the pid was still
//! that process's: a stat read is three system calls and a formatted line (about 10 us), a
//! signal 0 through the process's pidfd one call (under 1 us).
//!
//! A pidfd follows its process, never its pid: once /proc has shown the process alive after
//! the pidfd was opened, the pidfd is that process's, and a signal 0 through it fails with
//! ESRCH exactly when the process has been reaped (a zombie still takes it: the same answer
//! as `ids::is_alive`). Kept for at most [`HELD`] processes (a few of the file descriptors
//! the open-files limit allows); a process found reaped is dropped at once.

use std::{
    collections::HashMap,
    os::fd::{FromRawFd, OwnedFd},
    sync::Mutex,
};

use super::ids::ProcId;

/// Most pidfds held at once; past it, all are closed and opened again as processes are
/// asked about.
const HELD: usize = 256;

static PIDFDS: Mutex<Option<HashMap<ProcId, OwnedFd>>> = Mutex::new(None);

/// Whether `p` lives (a zombie included), from its pidfd: None when none is held for it (or
/// the pidfd cannot say).
pub fn alive(p: ProcId) -> Option<bool> {
    let mut held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    let fd = held.as_ref()?.get(&p)?;
    match signal_zero(fd) {
        Ok(()) => Some(true),
        // Not ours to signal: it exists.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Some(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            held.as_mut()?.remove(&p);
            Some(false)
        }
        Err(_) => None,
    }
}

/// A pidfd for pid `pid`, opened before /proc is asked whether `pid` is the process the
/// caller means: hand it to [`hold`] if it is.
pub fn open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Keeps `fd`, opened (by [`open`]) before /proc showed `p` alive, for later questions.
pub fn hold(p: ProcId, fd: OwnedFd) {
    let mut held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if held.len() >= HELD {
        held.clear();
    }
    held.insert(p, fd);
}

/// Whether a pidfd is held for `p`.
#[cfg(test)]
pub fn held(p: ProcId) -> bool {
    let held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    held.as_ref().is_some_and(|h| h.contains_key(&p))
}

fn signal_zero(fd: &OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a pidfd of ours, signal 0 (nothing sent), no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
