//! Signals from the first instruction on. The run loop's handlers (tokio's) exist only once
//! the programs are attached, after a few hundred milliseconds of loading; a SIGINT, SIGTERM
//! or SIGHUP before that would kill the process by default, with nothing written and an
//! empty output file. So `main` first installs a handler that only notes the signal
//! ([`catch_early`]); the run loop, once its own handlers are in place, takes what was noted
//! ([`take_early`]) and acts on it as if it had just arrived: the run ends at once, after
//! attaching, with a complete summary, and every BPF object goes with the process.
//!
//! Commands that do not end cleanly on a signal by themselves (files only, the demo, the
//! study) get the default dispositions back ([`restore_default`]), a signal noted meanwhile
//! included.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// The signals caught early.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Signals noted (bit `1 << signo`) while [`ARMED`].
static NOTED: AtomicU64 = AtomicU64::new(0);
/// Whether the early handler still notes signals: once the run loop's own handlers are in,
/// they see every signal (ours stays chained behind them, and stays silent).
static ARMED: AtomicBool = AtomicBool::new(false);

extern "C" fn note(sig: libc::c_int) {
    // Async-signal-safe: two atomic operations.
    if ARMED.load(Ordering::Relaxed) {
        NOTED.fetch_or(1 << sig, Ordering::Relaxed);
    }
}

/// Installs `handler` for `sig` (`flags` besides SA_RESTART); says whether the disposition it
/// replaced was "ignore".
fn set_with(sig: libc::c_int, handler: libc::sighandler_t, flags: libc::c_int) -> bool {
    // SAFETY: a zeroed sigaction with an empty mask is valid; `handler` is SIG_DFL, SIG_IGN,
    // `note` or `relay`, which are async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let mut old: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = libc::SA_RESTART | flags;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

fn set(sig: libc::c_int, handler: libc::sighandler_t) -> bool {
    set_with(sig, handler, 0)
}

/// Signals that were ignored when the profiler started (bit `1 << signo`): `nohup`, a
/// script's `cmd &`. A COMMAND inherits them ignored, as it would from a shell.
static IGNORED_AT_START: AtomicU64 = AtomicU64::new(0);

fn note_ignored(sig: libc::c_int, was_ignored: bool) {
    if was_ignored {
        IGNORED_AT_START.fetch_or(1 << sig, Ordering::Relaxed);
    }
}

/// Whether `sig` was ignored when the profiler started.
pub fn ignored_at_start(sig: libc::c_int) -> bool {
    IGNORED_AT_START.load(Ordering::Relaxed) & (1 << sig) != 0
}

/// Notes SIGINT, SIGTERM and SIGHUP instead of dying of them. First thing in `main`.
pub fn catch_early() {
    ARMED.store(true, Ordering::SeqCst);
    for sig in SIGNALS {
        note_ignored(sig, set(sig, note as *const () as libc::sighandler_t));
    }
}

/// The signals a COMMAND is sent when the profiler is: those that end or signal a program,
/// and none of job control's (a terminal's Ctrl-Z stops the whole process group).
pub const RELAYED: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
];

/// Where [`relay`] writes: a non-blocking pipe's write end (-1: none).
static RELAY_FD: AtomicI32 = AtomicI32::new(-1);

/// A signal as [`relay`] writes it: its number, `si_code` (above 0: sent by the kernel, a
/// terminal's Ctrl-C say; 0 or below: by a process) and the sender's pid.
pub const RELAY_RECORD: usize = 12;

extern "C" fn relay(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let fd = RELAY_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    // SAFETY: the kernel's siginfo for this signal; si_pid is meaningful for the codes read
    // it for (and 0 otherwise). write(2) is async-signal-safe; errno is kept for the code
    // the signal interrupted.
    unsafe {
        let (code, pid) = match info.as_ref() {
            Some(i) if i.si_code <= 0 => (i.si_code, i.si_pid()),
            Some(i) => (i.si_code, 0),
            None => (0, 0),
        };
        let rec = [sig, code, pid];
        let errno = *libc::__errno_location();
        libc::write(fd, rec.as_ptr().cast(), RELAY_RECORD);
        *libc::__errno_location() = errno;
    }
}

/// A COMMAND's run: every signal of [`RELAYED`] is written to `fd` as it arrives (a
/// non-blocking pipe), for the run to pass on, instead of ending the profiler; returns those
/// noted before (by [`catch_early`]: their senders are unknown).
pub fn relay_to(fd: std::os::fd::RawFd) -> Vec<libc::c_int> {
    RELAY_FD.store(fd, Ordering::SeqCst);
    for sig in RELAYED {
        let was = set_with(
            sig,
            relay as *const () as libc::sighandler_t,
            libc::SA_SIGINFO,
        );
        // (Those catch_early took over were noted then.)
        if !SIGNALS.contains(&sig) {
            note_ignored(sig, was);
        }
    }
    take_early()
}

/// The default dispositions again; a signal noted meanwhile is raised now, so it acts as it
/// would have.
pub fn restore_default() {
    for sig in SIGNALS {
        let _ = set(sig, libc::SIG_DFL);
    }
    ARMED.store(false, Ordering::SeqCst);
    for sig in noted(NOTED.swap(0, Ordering::SeqCst)) {
        // SAFETY: raising a signal at ourselves.
        unsafe { libc::raise(sig) };
    }
}

/// The signals that arrived before the caller's own handlers were installed (call it after
/// installing them), and no more noting.
pub fn take_early() -> Vec<libc::c_int> {
    ARMED.store(false, Ordering::SeqCst);
    noted(NOTED.swap(0, Ordering::SeqCst))
}

fn noted(bits: u64) -> Vec<libc::c_int> {
    SIGNALS
        .into_iter()
        .filter(|&s| bits & (1 << s) != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_before_the_loop_is_noted_not_fatal() {
        catch_early();
        // SAFETY: signalling ourselves; the handler only notes it.
        unsafe { libc::raise(libc::SIGHUP) };
        assert_eq!(take_early(), vec![libc::SIGHUP]);
        assert!(take_early().is_empty(), "taken once");
        // Disarmed: noted no more (the run loop's handlers see them now).
        note(libc::SIGTERM);
        assert!(take_early().is_empty());
        for sig in SIGNALS {
            let _ = set(sig, libc::SIG_DFL);
        }
    }
}
