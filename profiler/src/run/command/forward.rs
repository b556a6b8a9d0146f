//! Signals for the command: what the profiler is sent (SIGINT, SIGTERM, SIGHUP, SIGQUIT, ...)
//! is passed on to the command, and the profiler goes on until the command has exited. The
//! command runs in the profiler's process group, so what reaches the whole group reaches it
//! already and is not sent twice: a terminal's Ctrl-C or Ctrl-\ (sent by the kernel), or a
//! signal from the command itself or its descendants (`kill 0`). Everything else, a `kill`
//! of the profiler's pid by a user, a CI runner or `timeout`, is passed on.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use tokio::io::{Interest, unix::AsyncFd};

use crate::signals::{RELAY_RECORD, relay_to};

/// A signal as the relay noted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Noted {
    pub sig: i32,
    /// Above 0: sent by the kernel.
    pub code: i32,
    /// The sender (0: unknown).
    pub pid: i32,
}

/// Whether a signal the profiler got goes on to the command (`command`, its pid): not when
/// the kernel sent it to the process group (a terminal's keys), nor when it comes from the
/// command or a descendant of it (`descends(pid)`), which can reach the command itself.
pub fn passes_on(n: Noted, command: u32, descends: impl Fn(u32) -> bool) -> bool {
    if n.code > 0 {
        return false;
    }
    let from = n.pid as u32;
    !(n.pid > 0 && (from == command || descends(from)))
}

/// Whether process `pid` descends from `ancestor` (its parents read from /proc, at most 64
/// generations; a process gone is taken for an outsider).
pub fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            return false;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_ascii_whitespace().nth(1))
            .and_then(|f| f.parse::<u32>().ok());
        match ppid {
            Some(pp) if pp == ancestor => return true,
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

/// Passes the profiler's signals on to the command for as long as it lives.
pub struct Forwarder {
    task: tokio::task::JoinHandle<()>,
}

fn send(pid: u32, sig: i32) {
    // SAFETY: kill(2) of our own child, not yet reaped (the forwarder ends before the wait).
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

impl Forwarder {
    /// Takes the relayed signals over (signals.rs) and passes them on to `command` from now
    /// on; those that came before the relay existed are passed on at once.
    pub fn start(command: u32) -> io::Result<Forwarder> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills both descriptors, which we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened; the write end stays open for the life of the process (the
        // handler may write to it at any time).
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let early = relay_to(w.as_raw_fd());
        std::mem::forget(w);
        for sig in early {
            send(command, sig);
        }
        // SAFETY: the OwnedFd stays open, and the same fd, for the AsyncFd's lifetime.
        let fd = unsafe { AsyncFd::register_with_interest(r, Interest::READABLE) }?;
        let task = tokio::spawn(async move {
            let mut buf = [0u8; RELAY_RECORD * 64];
            let mut have = 0usize;
            loop {
                let Ok(mut ready) = fd.readable().await else {
                    return;
                };
                // SAFETY: reads into the free part of a local buffer.
                let n = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        buf[have..].as_mut_ptr().cast(),
                        buf.len() - have,
                    )
                };
                if n <= 0 {
                    ready.clear_ready();
                    continue;
                }
                have += n as usize;
                let whole = have - have % RELAY_RECORD;
                for rec in buf[..whole].chunks_exact(RELAY_RECORD) {
                    let word =
                        |i: usize| i32::from_ne_bytes(rec[i * 4..i * 4 + 4].try_into().unwrap());
                    let n = Noted {
                        sig: word(0),
                        code: word(1),
                        pid: word(2),
                    };
                    if passes_on(n, command, |p| descends_from(p, command)) {
                        send(command, n.sig);
                    }
                }
                buf.copy_within(whole..have, 0);
                have -= whole;
            }
        });
        Ok(Forwarder { task })
    }

    /// No more passing on (the command has exited and is about to be reaped).
    pub fn stop(&self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_reaches_the_group_anyway_is_not_sent_twice() {
        let cmd = 500;
        let user = |sig, pid| Noted { sig, code: 0, pid };
        let none = |_| false;
        // kill PROFILER from a shell, timeout, a CI runner: passed on.
        assert!(passes_on(user(libc::SIGTERM, 42), cmd, none));
        assert!(passes_on(user(libc::SIGQUIT, 0), cmd, none));
        // sigqueue and tgkill are processes too.
        assert!(passes_on(
            Noted {
                sig: 10,
                code: -1,
                pid: 42
            },
            cmd,
            none
        ));
        // The terminal's Ctrl-C: the kernel sent it to the whole foreground group.
        let tty = Noted {
            sig: libc::SIGINT,
            code: 0x80,
            pid: 0,
        };
        assert!(!passes_on(tty, cmd, none));
        // The command or its descendants (kill 0, kill $PPID): they can reach it themselves.
        assert!(!passes_on(user(libc::SIGINT, 500), cmd, none));
        assert!(!passes_on(user(libc::SIGINT, 501), cmd, |p| p == 501));
    }

    #[test]
    fn descent_is_read_from_proc() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!descends_from(child.id(), me), "gone: an outsider");
    }
}
