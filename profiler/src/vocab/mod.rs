//! The words every layer shares, at the bottom of the import order (docs/architecture.md):
//! process and thread ids with their clocks and whether they live, the duration histogram, and the output format
//! and profiling mode a user picks. Nothing here imports another module of the crate.

pub mod hist;
pub mod ids;
mod pidfds;
#[cfg(test)]
pub mod scratch;

use std::{io::IsTerminal, path::PathBuf};

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Newline-delimited JSON, one report per line.
    Json,
    /// Tables and histograms for people.
    Text,
}

impl Format {
    /// `text` on a terminal, `json` otherwise (a pipe or a file).
    pub fn resolve(choice: Option<Format>, output: Option<&PathBuf>) -> Format {
        choice.unwrap_or(if output.is_none() && std::io::stdout().is_terminal() {
            Format::Text
        } else {
            Format::Json
        })
    }
}

/// What a run measures (`--mode`): every acquisition, or only the waits that contended.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every acquisition (the three mmap_lock tracepoints): counts, wait and hold of each,
    /// contended or not.
    #[default]
    Full,
    /// Only the waits that went to the lock's slow path (`lock:contention_begin/end`, Linux
    /// 5.19+): an acquisition that does not wait costs nothing; uncontended acquisitions,
    /// optimistic spinning, trylocks and hold times are not seen.
    Contention,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Contention => "contention",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
