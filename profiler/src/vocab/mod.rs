//! The words every layer shares, at the bottom of the import order (docs/architecture.md):
//! process and thread ids with their clocks, the duration histogram, and the output format
//! a user picks. Nothing here imports another module of the crate.

pub mod hist;
pub mod ids;
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
