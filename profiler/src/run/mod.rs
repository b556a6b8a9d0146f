//! A profiling run: attach, report every interval, stop on duration, signal or the targets'
//! exit, and always finish with a complete summary.
//!
//! Data flows one way: collector (kernel maps) -> aggregation (deltas, windows) ->
//! attribution and report (model) -> output (JSON lines or text).

use std::{io, path::PathBuf, time::Duration};

use tokio::signal::unix::{SignalKind, signal};

use crate::kernel::collector::CollectorError;

pub mod command;
mod copier;
mod heap;
pub mod lost;
mod oneshot;
mod profile;
mod rings;
mod session;
mod sink;
mod targets;
mod writer;

pub use oneshot::{SessionConfig, run};
pub use profile::Profile;
pub use rings::Rings;
pub use session::Session;
pub use sink::Sink;
pub use targets::Targets;

/// What a run does at its few decision points; the loop itself is [`run_loop`], shared by the
/// one-shot profile, the demo and the agent.
pub trait Driver {
    /// Each tick, before the kernel's maps are read (the agent refreshes its selection).
    fn before_poll(&mut self, _profile: &mut Profile) -> Result<(), SessionError> {
        Ok(())
    }
    /// Each tick, after the kernel's maps were read.
    fn after_poll(&mut self, profile: &mut Profile) -> Result<(), SessionError>;
    /// SIGHUP: whether the run ends (the agent reloads its selection instead).
    fn hangup(&mut self, _profile: &mut Profile) -> Result<bool, SessionError> {
        Ok(true)
    }
    /// The targets have exited: whether the run may end now (asked again at each tick until
    /// it says yes; `--children` waits for the descendants).
    fn may_end(&mut self, _profile: &mut Profile) -> bool {
        true
    }
}

/// When the loop reads the kernel and when it ends.
pub struct LoopConfig<'a> {
    pub period: Duration,
    pub duration: Option<Duration>,
    /// The run also ends when these have all exited.
    pub targets: Option<&'a Targets>,
    /// Whether SIGINT, SIGTERM (and SIGHUP, as the driver says) end the run; a COMMAND's run
    /// passes them on instead (`command::Forwarder`) and ends when the command does.
    pub signals_end: bool,
}

/// Reads the kernel every period and drains the rings as records arrive, until the duration,
/// the targets' exit, SIGINT or SIGTERM (or SIGHUP, if the driver says so). A failure while
/// running ends the loop and is returned inside `Ok(Err(..))`, so that the caller still writes
/// what was gathered; `Err` is for failing to set the loop up.
pub async fn run_loop(
    profile: &mut Profile,
    rings: &mut Rings,
    cfg: LoopConfig<'_>,
    advice: lost::Advice,
    driver: &mut dyn Driver,
) -> Result<Result<(), SessionError>, SessionError> {
    let mut sigint = signal(SignalKind::interrupt()).map_err(SessionError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(SessionError::Signals)?;
    let mut sighup = signal(SignalKind::hangup()).map_err(SessionError::Signals)?;
    // What arrived while the programs were loading, before these handlers existed.
    for sig in crate::signals::take_early() {
        if !cfg.signals_end {
            continue;
        }
        if sig != libc::SIGHUP {
            return Ok(Ok(()));
        }
        match driver.hangup(profile) {
            Ok(true) => return Ok(Ok(())),
            Ok(false) => {}
            Err(e) => return Ok(Err(e)),
        }
    }
    let deadline = async {
        match cfg.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let period = cfg.period;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exited = async {
        match cfg.targets {
            Some(t) => t.all_exited().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    let mut targets_gone = false;
    let mut trim = heap::Trim::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                // Sampled stacks first: a process forgotten by the poll must have had them.
                rings.drain(profile);
                let step = driver
                    .before_poll(profile)
                    .and_then(|()| profile.poll(false))
                    .and_then(|()| driver.after_poll(profile));
                if let Err(e) = step {
                    return Ok(Err(e));
                }
                lost::check(&profile.lost_so_far(), advice);
                trim.now_and_then();
                if targets_gone && driver.may_end(profile) {
                    return Ok(Ok(()));
                }
            }
            ready = rings.ready() => {
                if let Err(e) = ready {
                    return Ok(Err(SessionError::Events(e)));
                }
                rings.drain(profile);
            }
            _ = &mut deadline => return Ok(Ok(())),
            _ = &mut exited, if !targets_gone => {
                targets_gone = true;
                if driver.may_end(profile) {
                    return Ok(Ok(()));
                }
            }
            _ = sigint.recv(), if cfg.signals_end => return Ok(Ok(())),
            _ = sigterm.recv(), if cfg.signals_end => return Ok(Ok(())),
            _ = sighup.recv(), if cfg.signals_end => match driver.hangup(profile) {
                Ok(true) => return Ok(Ok(())),
                Ok(false) => {}
                Err(e) => return Ok(Err(e)),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    #[error("pid {0} is not the process it was (started at {1} ticks): not profiled")]
    PidReused(u32, u64),
    #[error("cannot watch pid {0}: {1}")]
    Watch(u32, io::Error),
    #[error("cannot write {0}: {1}")]
    OpenOutput(PathBuf, io::Error),
    #[error("cannot write the report: {0}")]
    Write(io::Error),
    #[error("cannot read events from the kernel: {0}")]
    Events(io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    #[error(transparent)]
    Collector(#[from] CollectorError),
    #[error(transparent)]
    Study(#[from] crate::output::findings::StudyFileError),
    #[error(transparent)]
    Command(#[from] command::CommandError),
}

impl SessionError {
    /// 2 for bad usage, 1 for an environment the tool cannot run in.
    pub fn exit_code(&self) -> u8 {
        match self {
            SessionError::NoSuchPid(_)
            | SessionError::PidReused(..)
            | SessionError::OpenOutput(..)
            | SessionError::Study(_) => 2,
            SessionError::Collector(
                CollectorError::TooManyPids
                | CollectorError::TooManyComms
                | CollectorError::CommTooLong(_),
            ) => 2,
            SessionError::Command(e) => e.exit_code(),
            _ => 1,
        }
    }
}
