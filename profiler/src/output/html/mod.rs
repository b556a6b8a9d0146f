//! Self-contained HTML reports: a run (any NDJSON of docs/report-format.md), a comparison of
//! two runs, the mitigation study. Pure functions of the JSON lines: the page has its style
//! inline, plain SVG charts and inferno's flame graph; it fetches nothing.

pub mod compare;
mod partial;
mod run;
pub mod study;
pub mod svg;
#[cfg(test)]
mod tests;
mod verdict;

pub use run::run_page;

use std::{
    fmt::Write as _,
    io::{self, Write},
};

use serde_json::Value;

use crate::output::{Output, report::Report};
use svg::esc;

/// A file that is not what `report` or `compare` reads.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {0}: {1}")]
    Read(String, #[source] io::Error),
    #[error("{0}, line {1}: not a JSON report line ({2})")]
    NotJson(String, usize, #[source] serde_json::Error),
    #[error("{0}: no mmaplock-prof report lines (interval, summary, demo or study)")]
    Empty(String),
}

/// The lines of a run, in file order. A file may hold several runs one after the other
/// (each ends with its summary): `summaries` then has one per run.
#[derive(Clone, Debug, Default)]
pub struct RunLines {
    pub intervals: Vec<Value>,
    pub summaries: Vec<Value>,
    /// `demo` or `study` lines, rendered as such.
    pub other: Vec<Value>,
}

impl RunLines {
    /// Parses newline-delimited JSON; `name` names the file in errors.
    pub fn parse(name: &str, text: &str) -> Result<RunLines, InputError> {
        let mut r = RunLines::default();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .map_err(|e| InputError::NotJson(name.to_string(), i + 1, e))?;
            match v["type"].as_str() {
                Some("interval") => r.intervals.push(v),
                Some("summary") => r.summaries.push(v),
                // A demo line carries a summary per run.
                Some("demo") => {
                    for run in v["runs"].as_array().into_iter().flatten() {
                        r.summaries.push(run["report"].clone());
                    }
                    r.other.push(v);
                }
                Some("study") => r.other.push(v),
                _ => {}
            }
        }
        if r.intervals.is_empty() && r.summaries.is_empty() && r.other.is_empty() {
            return Err(InputError::Empty(name.to_string()));
        }
        Ok(r)
    }

    /// Reads and parses a file.
    pub fn read(path: &std::path::Path) -> Result<RunLines, InputError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| InputError::Read(name.clone(), e))?;
        RunLines::parse(&name, &text)
    }

    /// One summary per run; a file without any (a run killed hard) is one run, its interval
    /// lines summed.
    pub fn run_summaries(&self) -> Vec<Value> {
        if self.summaries.is_empty() && !self.intervals.is_empty() {
            vec![partial::summed(&self.intervals)]
        } else {
            self.summaries.clone()
        }
    }

    /// The study line, if this is a study's results.
    pub fn study(&self) -> Option<&Value> {
        self.other.iter().find(|v| v["type"] == "study")
    }
}

const STYLE: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d2330;\
margin:0;background:#f5f6f8}header{background:#1f2a44;color:#fff;padding:18px 32px}\
header h1{margin:0;font-size:22px}header p{margin:4px 0 0;color:#c9d2e6}\
main{padding:8px 32px 40px;max-width:1400px}section.process{background:#fff;border-radius:8px;\
box-shadow:0 1px 3px rgba(0,0,0,.08);padding:16px 22px;margin:18px 0}h2{margin:4px 0 10px;font-size:18px}\
h3{margin:18px 0 6px;font-size:14px;color:#44506a;text-transform:uppercase;letter-spacing:.04em}\
.kpis{display:flex;flex-wrap:wrap;gap:10px}.kpi{background:#f0f3f9;border-radius:6px;padding:8px 12px;\
min-width:120px}.kpi b{display:block;font-size:18px}.kpi span{color:#5b6578;font-size:12px}\
.grid{display:flex;flex-wrap:wrap;gap:6px 32px}.panel{flex:0 0 auto}table{border-collapse:collapse;font-size:13px}\
td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #e6e9ef}td:first-child,th:first-child\
{text-align:left}th{color:#5b6578;font-weight:600}svg.chart text{font-size:11px;fill:#33394a}\
svg.chart .axis{stroke:#9aa3b5}svg.chart .tick{font-size:10px}p.note{color:#5b6578}\
.good{color:#2e7d4f}.bad{color:#b8475d}.flame{width:100%;border:0;display:block}\
.finding{border-left:5px solid #9aa3b5;background:#f8f9fb;padding:6px 14px;margin:10px 0;border-radius:4px}\
.finding h3{text-transform:none;letter-spacing:0;color:#1d2330;font-size:15px;margin:6px 0}\
.finding .sev{display:inline-block;border-radius:3px;padding:0 6px;margin-right:6px;color:#fff;background:#9aa3b5;\
font-size:12px;text-transform:uppercase}.sev-high{border-color:#b8475d}.sev-high .sev{background:#b8475d}\
.sev-medium{border-color:#d08a2e}.sev-medium .sev{background:#d08a2e}.sev-low{border-color:#4f7fb8}\
.sev-low .sev{background:#4f7fb8}.finding ul{margin:4px 0 8px;padding-left:20px}p.cost{margin:2px 0;font-weight:600}\
td.within,span.within{color:#8a6d1d}";

/// A whole page around `body`.
pub fn page(title: &str, subtitle: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>\
         <body><header><h1>{t}</h1><p>{s}</p></header><main>{body}</main></body></html>\n",
        t = esc(title),
        s = esc(subtitle),
    )
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn kpi(out: &mut String, label: &str, value: &str) {
    let _ = write!(
        out,
        r#"<div class="kpi"><b>{}</b><span>{}</span></div>"#,
        esc(value),
        esc(label)
    );
}

/// `[upper, count]` pairs of a STATS distribution.
fn buckets(d: &Value) -> Vec<(u64, u64)> {
    d["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| Some((b[0].as_u64()?, b[1].as_u64()?)))
        .collect()
}

/// `--html FILE` of a profiling run: keeps the run's reports and writes the page when the run
/// ends (after a signal too), from the same JSON the other outputs write.
pub struct HtmlRecorder {
    pub path: std::path::PathBuf,
    lines: RunLines,
}

impl HtmlRecorder {
    pub fn new(path: std::path::PathBuf) -> Self {
        HtmlRecorder {
            path,
            lines: RunLines::default(),
        }
    }

    /// Renders what was kept into the file.
    pub fn finish(&self) -> io::Result<()> {
        let name = self
            .path
            .file_stem()
            .map_or("run".into(), |s| s.to_string_lossy().into_owned());
        std::fs::write(&self.path, run_page(&name, &self.lines))
    }
}

impl Output for HtmlRecorder {
    fn emit(&mut self, report: &Report, _out: &mut dyn Write) -> io::Result<()> {
        let v = serde_json::to_value(report).map_err(io::Error::from)?;
        match v["type"].as_str() {
            Some("summary") => self.lines.summaries.push(v),
            _ => self.lines.intervals.push(v),
        }
        Ok(())
    }
}
