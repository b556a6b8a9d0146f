//! Self-contained HTML reports: a run (any NDJSON of docs/report-format.md), a comparison of
//! two runs, the mitigation study. Pure functions of the reports: the page has its style
//! inline, plain SVG charts and inferno's flame graph; it fetches nothing.

pub mod compare;
mod flame;
mod lines;
mod others;
mod run;
pub mod study;
pub mod svg;
mod tables;
#[cfg(test)]
mod tests;
mod verdict;

pub use lines::RunLines;
pub use run::{RunPage, run_page};

use std::{
    fmt::Write as _,
    io::{self, Write},
};

use crate::output::{Output, report::Report};
use svg::esc;

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

fn kpi(out: &mut String, label: &str, value: &str) {
    let _ = write!(
        out,
        r#"<div class="kpi"><b>{}</b><span>{}</span></div>"#,
        esc(value),
        esc(label)
    );
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
        self.lines.add_report(report);
        Ok(())
    }
}
