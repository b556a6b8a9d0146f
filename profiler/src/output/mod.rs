//! Outputs: the report model (a pure function of a window and its attribution) and its
//! renderings. Every rendering is an [`Output`]: JSON lines and text here, more to come.

pub mod blockers;
pub mod compare;
pub mod compare_findings;
pub mod findings;
#[cfg(test)]
mod fixtures;
pub mod html;
pub mod lines;
pub mod partial;
pub mod prometheus;
pub mod reading;
pub mod report;
pub mod rotate;
pub mod share;
pub mod stats;
pub mod text;

use std::io::{self, Write};

use report::{Lost, Report};

/// Every reason of `lost` with its count, by its name in the report (`events`, their sum,
/// left out): read from the report's own serialization, so that a reason added there is
/// carried everywhere (the agent's `mmaplock_lost_total`, the notices on standard error).
pub fn lost_reasons(l: &Lost) -> Vec<(String, u64)> {
    match serde_json::to_value(l) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter(|(k, _)| k != "events")
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A way of writing reports out.
pub trait Output {
    fn emit(&mut self, report: &Report, out: &mut dyn Write) -> io::Result<()>;
}

/// Newline-delimited JSON (the contract of docs/report-format.md).
pub struct JsonLines;

impl Output for JsonLines {
    fn emit(&mut self, report: &Report, out: &mut dyn Write) -> io::Result<()> {
        // Straight to the writer: a report of ten thousand threads is megabytes.
        serde_json::to_writer(&mut *out, report).map_err(io::Error::from)?;
        out.write_all(b"\n")
    }
}

/// Tables and histograms for people.
pub struct Text;

impl Output for Text {
    fn emit(&mut self, report: &Report, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(text::to_text(report).as_bytes())
    }
}
