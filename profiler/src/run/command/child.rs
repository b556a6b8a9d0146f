//! The child between fork and exec: it runs only async-signal-safe system calls on memory the
//! parent prepared before the fork (see the module above).

use std::os::fd::RawFd;

/// What the child uses between fork and exec: pointers into the parent's prepared memory
/// (the child has its copy).
pub(super) struct Child<'a> {
    pub(super) gate: RawFd,
    pub(super) gate_w: RawFd,
    pub(super) err: RawFd,
    pub(super) paths: Vec<*const libc::c_char>,
    pub(super) argv: &'a [*const libc::c_char],
    pub(super) sh_argv: &'a mut [*const libc::c_char],
    pub(super) sh: *const libc::c_char,
    pub(super) env: &'a [*const libc::c_char],
    pub(super) ids: Option<(u32, u32)>,
    pub(super) groups: &'a [libc::gid_t],
    pub(super) ignored: &'a [libc::c_int],
}

/// The child's exit status when it cannot run the command (after saying why on the error
/// pipe) or when the gate closed without opening (the profiler gave up).
const CANNOT_EXEC: i32 = 127;

impl Child<'_> {
    /// In the child: default dispositions (but those ignored when the profiler started), no
    /// signal blocked, wait at the gate, become the user, exec. Never returns.
    pub(super) fn run(self) -> ! {
        // SAFETY: only async-signal-safe calls (close, sigaction, sigprocmask, read, setgroups,
        // setgid, setuid, execve, write, _exit) on memory that was prepared before the fork.
        unsafe {
            libc::close(self.gate_w);
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigemptyset(&mut sa.sa_mask);
            for sig in 1..libc::SIGRTMIN() {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                    continue;
                }
                sa.sa_sigaction = if self.ignored.contains(&sig) {
                    libc::SIG_IGN
                } else {
                    libc::SIG_DFL
                };
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            let mut byte = 0u8;
            loop {
                let n = libc::read(self.gate, (&raw mut byte).cast(), 1);
                if n == 1 {
                    break;
                }
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                // The profiler gave up (or died) before letting it run.
                libc::_exit(CANNOT_EXEC);
            }
            libc::close(self.gate);
            if let Some((uid, gid)) = self.ids
                && (libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                self.fail();
            }
            let mut denied = false;
            for &path in &self.paths {
                libc::execve(path, self.argv.as_ptr(), self.env.as_ptr());
                match *libc::__errno_location() {
                    libc::ENOEXEC => {
                        self.sh_argv[1] = path;
                        libc::execve(self.sh, self.sh_argv.as_ptr(), self.env.as_ptr());
                        self.fail();
                    }
                    libc::EACCES => denied = true,
                    libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => {}
                    _ => self.fail(),
                }
            }
            if denied {
                *libc::__errno_location() = libc::EACCES;
            }
            self.fail()
        }
    }

    /// Says errno on the error pipe and exits.
    unsafe fn fail(&self) -> ! {
        // SAFETY: as in `run`.
        unsafe {
            let e = *libc::__errno_location();
            libc::write(self.err, (&raw const e).cast(), size_of::<libc::c_int>());
            libc::_exit(CANNOT_EXEC)
        }
    }
}
