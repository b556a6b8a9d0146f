//! The eBPF programs' rare diagnostics (`profiler-ebpf`'s `diag`: the first loss of each
//! reason, a write lock in a syscall of no known cause, an iterator anomaly), written by
//! aya-log into its ring and logged here through `log`, under [`LOG_TARGET`], when the logger
//! lets them through: `--log-level` or `RUST_LOG` (docs/cli.md).
//!
//! Off by default, at no cost: the programs are then told that no level is enabled
//! (aya-log's `AYA_LOG_LEVEL` global, 0), a load-time constant the verifier folds, so that it
//! removes every log call; aya-log's ring shrinks to a page, and nothing here runs.

use std::{
    os::fd::{AsFd, OwnedFd},
    thread::JoinHandle,
};

use aya::Ebpf;
use aya_log::EbpfLogger;
pub use profiler_common::diag::LOG_TARGET;
use rustix::{
    event::{EventfdFlags, PollFd, PollFlags, eventfd, poll},
    io::Errno,
};

/// aya-log's global, read by every log call of the programs before anything else.
pub const LEVEL_GLOBAL: &str = aya_log::LEVEL;
/// aya-log's ring.
pub const RING: &str = "AYA_LOGS";

/// The ring's size for the programs' `level`: when they log, aya-log's own default (records
/// are rare, and drained as they come); when not, the smallest a ring may be.
pub fn ring_bytes(level: u8) -> u32 {
    if level == 0 { 4096 } else { 128 << 10 }
}

/// The value of `AYA_LOG_LEVEL` for the programs: the most verbose level the installed
/// logger takes for [`LOG_TARGET`], 0 for none.
pub fn level() -> u8 {
    level_for(log::logger())
}

/// As [`level`], for `logger` (aya-log numbers levels as `log` does, error 1 to trace 5).
pub fn level_for(logger: &dyn log::Log) -> u8 {
    use log::Level::{Debug, Error, Info, Trace, Warn};
    [Trace, Debug, Info, Warn, Error]
        .into_iter()
        .find(|&level| {
            logger.enabled(
                &log::Metadata::builder()
                    .level(level)
                    .target(LOG_TARGET)
                    .build(),
            )
        })
        .map_or(0, |level| level as u8)
}

/// Drains aya-log's ring on a thread of its own while it lives (the programs write to it
/// rarely, from any context); dropping it drains what is left and ends the thread. Drop it
/// after the programs are detached, so that their last records are read.
pub struct EbpfLog {
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl EbpfLog {
    /// Takes the ring from `ebpf` and starts draining it when the programs log (`level`
    /// above 0). Failing that, the run goes on without their diagnostics, said as a warning.
    pub fn start(ebpf: &mut Ebpf, level: u8) -> Option<EbpfLog> {
        if level == 0 {
            return None;
        }
        match Self::try_start(ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                log::warn!("the eBPF programs' diagnostics cannot be read: {e}");
                None
            }
        }
    }

    fn try_start(ebpf: &mut Ebpf) -> Result<EbpfLog, String> {
        let mut logger = EbpfLogger::init(ebpf).map_err(|e| format!("aya-log: {e}"))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC).map_err(|e| format!("eventfd: {e}"))?;
        let stop = wake.try_clone().map_err(|e| format!("eventfd: {e}"))?;
        let thread = std::thread::Builder::new()
            .name("ebpf-log".into())
            .spawn(move || {
                loop {
                    let mut fds = [
                        PollFd::new(&logger, PollFlags::IN),
                        PollFd::new(&stop, PollFlags::IN),
                    ];
                    match poll(&mut fds, None) {
                        Ok(_) | Err(Errno::INTR) => {}
                        Err(e) => {
                            log::warn!("the eBPF programs' diagnostics: poll: {e}");
                            break;
                        }
                    }
                    let stopping = !fds[1].revents().is_empty();
                    logger.flush();
                    if stopping {
                        break;
                    }
                }
            })
            .map_err(|e| format!("thread: {e}"))?;
        Ok(EbpfLog {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for EbpfLog {
    fn drop(&mut self) {
        // The thread's last flush reads what the programs wrote before this.
        if rustix::io::write(self.wake.as_fd(), &1u64.to_ne_bytes()).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    /// aya-log's levels are numbered as `log`'s, which [`level`] relies on.
    #[test]
    fn aya_log_numbers_levels_as_log_does() {
        use aya_log::Level as A;
        use log::Level as L;
        for (a, l) in [
            (A::Error, L::Error),
            (A::Warn, L::Warn),
            (A::Info, L::Info),
            (A::Debug, L::Debug),
            (A::Trace, L::Trace),
        ] {
            assert_eq!(a as u8, l as u8);
        }
    }
}
