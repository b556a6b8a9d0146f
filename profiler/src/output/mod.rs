//! Outputs: the report model (a pure function of a window and its attribution) and its
//! renderings. Every written rendering is an [`Output`]: JSON lines and text here, HTML in
//! `html`; the commands above render their own reports (the demo's, the study's) through the
//! same trait. Where the bytes go is not an output's business: standard output or a file
//! named on the command line, the agent's rotating file ([`rotate`]), the study's folder.
//! Prometheus is not an output: it reads the window, not a report.

pub mod blockers;
pub mod compare;
pub mod compare_findings;
pub mod findings;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod html;
pub mod lines;
pub mod otlp;
pub mod partial;
pub mod pprof;
pub mod prometheus;
pub mod reading;
pub mod report;
pub mod rotate;
pub mod series;
pub mod share;
pub mod stats;
pub mod text;

use std::io::{self, Write};

use serde::Serialize;

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

/// A way of writing a report out: one report in, its bytes out (one record, written whole by
/// the caller). `R` is the report's type: a run's [`Report`] unless said otherwise (the demo
/// and the study have reports of their own, and their own renderings of them).
pub trait Output<R: ?Sized = Report> {
    fn emit(&mut self, report: &R, out: &mut dyn Write) -> io::Result<()>;
}

/// Newline-delimited JSON (the contract of docs/report-format.md): any report, one line.
pub struct JsonLines;

impl<R: Serialize + ?Sized> Output<R> for JsonLines {
    fn emit(&mut self, report: &R, out: &mut dyn Write) -> io::Result<()> {
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
