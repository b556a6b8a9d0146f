//! What the agent is given (from `cli::AgentArgs`) and how it fails.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{
    escalate::EscalateConfig,
    push::{PushError, PushSettings},
    selection::{SelectionError, Selectors},
    webconfig,
};
use crate::{kernel::collector::CollectorError, run::SessionError, vocab::Mode};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Selection(#[from] SelectionError),
    #[error(transparent)]
    WebConfig(#[from] webconfig::WebConfigError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("cannot write {0}: {1}")]
    Output(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Push(#[from] PushError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl AgentError {
    /// 2 for bad usage (a bad selector file, an output that cannot be written), 1 for the
    /// environment (no privilege, an address in use).
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Selection(_)
            | AgentError::Output(..)
            | AgentError::WebConfig(_)
            | AgentError::Push(PushError::Ca(..)) => 2,
            AgentError::Push(PushError::Thread(_)) => 1,
            AgentError::Listen(..) => 1,
            AgentError::Session(e) => e.exit_code(),
        }
    }
}

impl From<CollectorError> for AgentError {
    fn from(e: CollectorError) -> Self {
        AgentError::Session(SessionError::Collector(e))
    }
}

/// What the agent needs (from `cli::AgentArgs`).
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub selectors: Selectors,
    pub config_file: Option<PathBuf>,
    /// TLS and basic auth for /metrics (exporter-toolkit's format), re-read on SIGHUP.
    pub web_config: Option<PathBuf>,
    pub pid_label: bool,
    pub output: Option<PathBuf>,
    pub rotate_bytes: u64,
    pub rotate_keep: u32,
    pub interval: Duration,
    pub max_threads: u32,
    pub bpf_stats: bool,
    /// Charge waits to the holds that made them wait (`mmaplock_blocked_seconds_total`).
    pub blockers: bool,
    /// `--mode`; None: contention where the kernel can, else full.
    pub mode: Option<Mode>,
    /// Export up to this many JavaScript functions per process (0: none, no stacks sampled).
    pub js_functions: usize,
    /// Serve `/debug/pprof/mmaplock`, pprof profiles of the last intervals' sampled stacks.
    pub pprof: bool,
    /// One write's stack in this many per thread, when something shows them
    /// ([`AgentConfig::stack_sample`]).
    pub stack_sample: u32,
    /// `--max-stack-rate`: stacks a second per process past which a process is sampled less
    /// often (0: no bound).
    pub max_stack_rate: u32,
    /// `--pyroscope`, `--otlp` and their settings, from the command line (the config file's
    /// are added at start).
    pub push: PushSettings,
    /// `--escalate-dir`: bounded full profiles of processes that cross a threshold.
    pub escalate: Option<EscalateConfig>,
    pub quiet: bool,
}

impl AgentConfig {
    /// The rate stacks are sampled at: 0 unless something shows them (JavaScript functions,
    /// the pprof endpoint, captures, pushes).
    pub(super) fn stack_sample(&self, push: &PushSettings) -> u32 {
        let shown =
            self.js_functions > 0 || self.pprof || self.escalate.is_some() || push.profiles();
        if shown { self.stack_sample } else { 0 }
    }

    /// The push settings: the command line's, with the config file's added.
    pub(super) fn push_settings(&self) -> Result<PushSettings, SelectionError> {
        let mut p = self.push.clone();
        if let Some(f) = &self.config_file {
            let text = super::selection::read_config(f)?;
            p.add_file(f, &text)?;
        }
        Ok(p)
    }

    /// The command line's selectors plus the config file's (read again on SIGHUP).
    pub(super) fn selectors(&self) -> Result<Selectors, SelectionError> {
        let mut s = self.selectors.clone();
        if let Some(f) = &self.config_file {
            s.add_file(f)?;
        }
        Ok(s)
    }
}
