//! The `--pid` targets, watched through pidfds.

use std::{
    io::{self},
    os::fd::{FromRawFd, OwnedFd},
};

use tokio::io::{Interest, unix::AsyncFd};

use crate::run::SessionError;

/// Waits for processes to exit through pidfds (no polling, no pid-reuse race).
pub struct Targets {
    fds: Vec<AsyncFd<OwnedFd>>,
}

impl Targets {
    /// Opens every pid; a pid that does not exist is a usage error.
    pub fn open(pids: &[u32]) -> Result<Self, SessionError> {
        let mut fds = Vec::new();
        for &pid in pids {
            // SAFETY: plain syscall; the returned fd is owned by us from here on.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(if e.raw_os_error() == Some(libc::ESRCH) {
                    SessionError::NoSuchPid(pid)
                } else {
                    SessionError::Watch(pid, e)
                });
            }
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: the OwnedFd stays open, and the same fd, for the AsyncFd's lifetime.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|e| SessionError::Watch(pid, io::Error::other(e.to_string())))?;
            fds.push(fd);
        }
        Ok(Targets { fds })
    }

    /// Resolves once every target has exited; never if there are none.
    pub async fn all_exited(&self) {
        if self.fds.is_empty() {
            return std::future::pending().await;
        }
        for fd in &self.fds {
            // A pidfd becomes readable when its process exits.
            let _ = fd.readable().await;
        }
    }
}
