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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

fn set(sig: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: a zeroed sigaction with an empty mask is valid; `handler` is SIG_DFL or `note`,
    // which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Notes SIGINT, SIGTERM and SIGHUP instead of dying of them. First thing in `main`.
pub fn catch_early() {
    ARMED.store(true, Ordering::SeqCst);
    for sig in SIGNALS {
        set(sig, note as *const () as libc::sighandler_t);
    }
}

/// The default dispositions again; a signal noted meanwhile is raised now, so it acts as it
/// would have.
pub fn restore_default() {
    for sig in SIGNALS {
        set(sig, libc::SIG_DFL);
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
            set(sig, libc::SIG_DFL);
        }
    }
}
