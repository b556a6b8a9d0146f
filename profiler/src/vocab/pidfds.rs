//! Whether a process seen before is still running, asked of a pidfd rather than of /proc.
//! The profiler asks after every read of a process's memory or files (a new thread's start
//! routine, its name, its executable, a stack's unwinder) whether the pid was still that
//! process's: a stat read is three system calls and a formatted line (about 10 us), a poll
//! of the process's pidfd one call (under 1 us).
//!
//! A pidfd follows its process, never its pid: once /proc has shown the process alive after
//! the pidfd was opened, the pidfd is that process's, and it becomes readable once the
//! process has exited (every thread of it; Linux 5.3+). Until then the process is running;
//! after, it is a zombie or reaped, which /proc tells (`ids::is_alive`). A poll needs no
//! permission over the process (a signal 0 would, and a seccomp filter's EPERM would read as
//! "exists"). Kept for at most [`HELD`] processes (a few of the file descriptors the
//! open-files limit allows); the caller drops one once /proc shows its process gone.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Mutex,
};

use super::ids::ProcId;

/// Most pidfds held at once; past it, all are closed and opened again as processes are
/// asked about.
const HELD: usize = 256;

static PIDFDS: Mutex<Option<HashMap<ProcId, OwnedFd>>> = Mutex::new(None);

/// Whether `p`'s pidfd is held and says it has not exited yet. False when none is held, when
/// it has exited (a zombie, or reaped: /proc says which), or when the poll fails.
pub fn running(p: ProcId) -> bool {
    let held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(fd) = held.as_ref().and_then(|h| h.get(&p)) else {
        return false;
    };
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours, no wait.
    unsafe { libc::poll(&mut poll, 1, 0) == 0 }
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

/// Closes `p`'s pidfd, if held: /proc shows it gone.
pub fn forget(p: ProcId) {
    let mut held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = held.as_mut() {
        h.remove(&p);
    }
}

/// Whether a pidfd is held for `p`.
pub fn held(p: ProcId) -> bool {
    let held = PIDFDS.lock().unwrap_or_else(|e| e.into_inner());
    held.as_ref().is_some_and(|h| h.contains_key(&p))
}
