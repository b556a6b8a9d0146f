//! `mmaplock-prof [OPTIONS] -- COMMAND [ARGS...]`: the profiler runs the command, profiled with
//! its descendants from their first instruction. The child is forked before the programs are
//! loaded and waits on a pipe (the gate) until its pid is in the kernel's selection, which
//! follows its forks from then on; only then does it exec. Everything the child does between
//! the fork and the exec was prepared by the parent (paths, argument and environment
//! arrays, ids), so that it calls nothing but async-signal-safe system calls.

mod child;
mod forward;
pub mod user;

use std::{
    ffi::{CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use child::Child;
pub use forward::Forwarder;
use user::{Ids, RunAs};

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exited(u8),
    Signalled(i32),
}

impl Status {
    /// The status a shell gives it: its exit code, or 128 + the signal that killed it.
    pub fn code(self) -> u8 {
        match self {
            Status::Exited(c) => c,
            Status::Signalled(s) => 128u8.saturating_add(s as u8),
        }
    }

    pub fn success(self) -> bool {
        self == Status::Exited(0)
    }

    fn of_wait(status: libc::c_int) -> Status {
        if libc::WIFSIGNALED(status) {
            Status::Signalled(libc::WTERMSIG(status))
        } else {
            Status::Exited(libc::WEXITSTATUS(status) as u8)
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Exited(c) => write!(f, "exited with status {c}"),
            Status::Signalled(s) => {
                // SAFETY: strsignal returns a static or thread-local string for any number.
                let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(*s)) };
                write!(f, "killed by signal {s} ({})", name.to_string_lossy())
            }
        }
    }
}

/// Why a command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("cannot run {0}: {1}")]
    Exec(String, io::Error),
    #[error("cannot start {0}: {1}")]
    Fork(String, io::Error),
    #[error(transparent)]
    User(#[from] user::UserError),
    #[error("{0}: a command's words cannot hold a NUL byte")]
    Nul(String),
}

impl CommandError {
    /// As shells say it: 127 not found, 126 found but not executable; 1 for the profiler's
    /// own failures, 2 for what the user gave.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::NotFound(_) => 127,
            CommandError::Exec(..) => 126,
            CommandError::Fork(..) => 1,
            CommandError::User(_) | CommandError::Nul(_) => 2,
        }
    }
}

/// A command ready to be forked: everything its child needs, built beforehand.
pub struct Prepared {
    /// As the user wrote it, for messages.
    name: String,
    /// The files to try to exec, in PATH's order (execvp's search).
    paths: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    ids: Option<Ids>,
    /// The signals the child starts with ignored.
    ignored: Vec<libc::c_int>,
}

fn cstring(name: &str, s: &OsStr) -> Result<CString, CommandError> {
    CString::new(s.as_bytes()).map_err(|_| CommandError::Nul(name.to_string()))
}

/// The files `name` may be, as execvp searches: itself when it holds a `/`, else each
/// directory of `path` (the current one for an empty entry) holding a file of that name.
pub fn search(name: &OsStr, path: Option<&OsStr>) -> Vec<PathBuf> {
    if name.as_bytes().contains(&b'/') {
        return vec![PathBuf::from(name)];
    }
    let path = path.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    path.as_bytes()
        .split(|&b| b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() {
                Path::new(".")
            } else {
                Path::new(OsStr::from_bytes(dir))
            };
            dir.join(name)
        })
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .collect()
}

impl Prepared {
    /// Resolves `words[0]` on the command's PATH and decides who runs it (`user.rs`).
    pub fn new(words: &[OsString]) -> Result<Prepared, CommandError> {
        let name = words[0].to_string_lossy().into_owned();
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        let run_as: RunAs = user::run_as(euid, |k| std::env::var_os(k), &user::System)?;
        let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        for (k, v) in run_as.env {
            match vars.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = v,
                None => vars.push((k, v)),
            }
        }
        let path = vars
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_os_str());
        let found = search(&words[0], path);
        if found.is_empty() {
            return Err(CommandError::NotFound(name));
        }
        let paths = (found.iter())
            .map(|p| cstring(&name, p.as_os_str()))
            .collect::<Result<_, _>>()?;
        let argv = (words.iter())
            .map(|w| cstring(&name, w))
            .collect::<Result<_, _>>()?;
        let env = (vars.iter())
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push("=");
                kv.push(v);
                cstring(&name, &kv)
            })
            .collect::<Result<_, _>>()?;
        let ignored = (1..libc::SIGRTMIN())
            .filter(|&s| crate::signals::ignored_at_start(s))
            .collect();
        Ok(Prepared {
            name,
            paths,
            argv,
            env,
            ids: run_as.ids,
            ignored,
        })
    }

    /// Forks the child, which waits at the gate. Signals are blocked around the fork, so
    /// that none reaches the child before it has the default dispositions back.
    pub fn fork(self) -> Result<Gated, CommandError> {
        let fail = |e| CommandError::Fork(self.name.clone(), e);
        let (gate_r, gate_w) = pipe().map_err(fail)?;
        let (err_r, err_w) = pipe().map_err(fail)?;
        let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let argv = ptrs(&self.argv);
        let env = ptrs(&self.env);
        // A script without a `#!` line is run by sh, as execvp does: `sh PATH ARGS...`.
        let sh = c"/bin/sh";
        let mut sh_argv: Vec<*const libc::c_char> = vec![c"sh".as_ptr(), std::ptr::null()];
        sh_argv.extend(argv.iter().skip(1));
        let groups: Vec<libc::gid_t> = self.ids.as_ref().map_or(Vec::new(), |i| i.groups.clone());
        let child = Child {
            gate: gate_r.as_raw_fd(),
            gate_w: gate_w.as_raw_fd(),
            err: err_w.as_raw_fd(),
            paths: self.paths.iter().map(|p| p.as_ptr()).collect(),
            argv: &argv,
            sh_argv: &mut sh_argv,
            sh: sh.as_ptr(),
            env: &env,
            ids: self.ids.as_ref().map(|i| (i.uid, i.gid)),
            groups: &groups,
            ignored: &self.ignored,
        };
        // SAFETY: sigset operations on a local set; pthread_sigmask on this thread.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        // SAFETY: the child runs only `Child::run`, which makes async-signal-safe system
        // calls on memory prepared here, and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            child.run();
        }
        let forked = io::Error::last_os_error();
        // SAFETY: the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        drop((gate_r, err_w));
        if pid < 0 {
            return Err(fail(forked));
        }
        Ok(Gated {
            name: self.name,
            pid: pid as u32,
            gate: Some(gate_w),
            err: err_r,
            reaped: None,
        })
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A forked child waiting at the gate.
pub struct Gated {
    name: String,
    pub pid: u32,
    gate: Option<OwnedFd>,
    err: OwnedFd,
    reaped: Option<Status>,
}

impl Gated {
    /// The command as the user wrote it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the gate if still shut: a child never released exits there.
    pub fn abort(&mut self) {
        self.gate.take();
    }

    /// Resolves once the child has exited (it is not reaped: [`wait`](Self::wait) does).
    pub async fn exited(&self) {
        if self.reaped.is_some() {
            return;
        }
        // SAFETY: plain syscall; the returned fd is owned by us from here on. Our child,
        // not yet reaped (only `wait` reaps it), cannot have been replaced under its pid.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid as libc::pid_t, 0) };
        if fd < 0 {
            return;
        }
        // SAFETY: just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the OwnedFd stays open, and the same fd, for the AsyncFd's lifetime.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        if let Ok(fd) = fd {
            // A pidfd becomes readable when its process exits.
            let _ = fd.readable().await;
        }
    }

    /// Lets the child exec (its pid is selected now); returns once it has, or says why it
    /// could not.
    pub fn release(&mut self) -> Result<(), CommandError> {
        let Some(gate) = self.gate.take() else {
            return Ok(());
        };
        let go = [1u8];
        // SAFETY: a write of one byte from a local buffer to a descriptor we own.
        unsafe { libc::write(gate.as_raw_fd(), go.as_ptr().cast(), 1) };
        drop(gate);
        // The error pipe's write end closes at the exec (O_CLOEXEC): EOF means it ran.
        let mut e = [0u8; size_of::<libc::c_int>()];
        let mut got = 0;
        while got < e.len() {
            // SAFETY: reads into the rest of a local buffer.
            let n = unsafe {
                libc::read(
                    self.err.as_raw_fd(),
                    e[got..].as_mut_ptr().cast(),
                    e.len() - got,
                )
            };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        if got == e.len() {
            let errno = libc::c_int::from_ne_bytes(e);
            let err = io::Error::from_raw_os_error(errno);
            self.reaped = Some(self.wait());
            return Err(if errno == libc::ENOENT {
                CommandError::NotFound(self.name.clone())
            } else {
                CommandError::Exec(self.name.clone(), err)
            });
        }
        Ok(())
    }

    /// Waits for the child to end (reaping it) and says how it ended.
    pub fn wait(&mut self) -> Status {
        if let Some(s) = self.reaped {
            return s;
        }
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, 0) };
            if r == self.pid as libc::pid_t {
                break;
            }
            if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                // Reaped already (it cannot be anyone's but ours): no status to give.
                status = 0;
                break;
            }
        }
        let s = Status::of_wait(status);
        self.reaped = Some(s);
        s
    }
}

impl Drop for Gated {
    /// A child never released (the profiler could not start) exits at the closed gate; it
    /// is reaped here.
    fn drop(&mut self) {
        if self.gate.take().is_some() {
            let _ = self.wait();
        }
    }
}

#[cfg(test)]
mod tests;
