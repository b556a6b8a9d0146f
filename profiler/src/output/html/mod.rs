//! Self-contained HTML reports: a run (any NDJSON of docs/report-format.md), a comparison of
//! two runs, the mitigation study. Pure functions of the JSON lines: the page has its style
//! inline, plain SVG charts and inferno's flame graph; it fetches nothing.

pub mod compare;
pub mod study;
pub mod svg;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{self, Write},
};

use serde_json::Value;

use crate::output::{Output, report::Report, text::fmt_ns};
use svg::{Unit, bars, esc, histogram, lines};

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
.grid{display:flex;flex-wrap:wrap;gap:18px 36px}table{border-collapse:collapse;font-size:13px}\
td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #e6e9ef}td:first-child,th:first-child\
{text-align:left}th{color:#5b6578;font-weight:600}svg.chart text{font-size:11px;fill:#33394a}\
svg.chart .axis{stroke:#9aa3b5}svg.chart .tick{font-size:10px}p.note{color:#5b6578}\
.good{color:#2e7d4f}.bad{color:#b8475d}.flame svg{max-width:100%;height:auto}";

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

/// The flame graph of a process's sampled writes, drawn by inferno (None without stacks).
pub fn flame_graph(title: &str, flame: &Value) -> Option<String> {
    let lines: Vec<String> = flame
        .as_array()?
        .iter()
        .filter_map(|f| Some(format!("{} {}", f["stack"].as_str()?, f["count"].as_u64()?)))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "sampled writes".to_string();
    opts.hash = true;
    opts.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg).ok()?;
    let svg = String::from_utf8(svg).ok()?;
    // Inline: drop the XML prologue, which is not valid inside HTML.
    let start = svg.find("<svg")?;
    Some(svg[start..].to_string())
}

/// One process's section of a run page.
fn process_section(p: &Value, intervals: &[Value], t0: Option<f64>) -> String {
    let mut out = String::new();
    let (pid, comm) = (u(&p["pid"]), p["comm"].as_str().unwrap_or("?"));
    let _ = write!(
        out,
        r#"<section class="process" data-pid="{pid}"><h2>{} <small>pid {pid}</small></h2><div class="kpis">"#,
        esc(comm)
    );
    let w = &p["write"];
    kpi(&mut out, "write acquisitions", &u(&w["count"]).to_string());
    kpi(
        &mut out,
        "total write wait",
        &fmt_ns(u(&w["wait_ns"]["sum"])),
    );
    kpi(
        &mut out,
        "mean write wait",
        &fmt_ns(w["wait_ns"]["mean"].as_f64().unwrap_or(0.0) as u64),
    );
    kpi(&mut out, "p99 write wait", &fmt_ns(u(&w["wait_ns"]["p99"])));
    kpi(
        &mut out,
        "read acquisitions",
        &u(&p["read"]["count"]).to_string(),
    );
    kpi(
        &mut out,
        "total read wait",
        &fmt_ns(u(&p["read"]["wait_ns"]["sum"])),
    );
    if let Some(b) = p["blocked_wait_ns"].as_u64() {
        kpi(&mut out, "wait charged to blockers", &fmt_ns(b));
    }
    out.push_str("</div>");
    out.push_str("<h3>Wait per acquisition (log2 buckets)</h3><div class=\"grid\">");
    out.push_str(&histogram(
        "wait-histogram",
        &[
            ("write", &buckets(&w["wait_ns"])),
            ("read", &buckets(&p["read"]["wait_ns"])),
        ],
    ));
    out.push_str("</div><h3>Write wait over time</h3>");
    let mut xs = Vec::new();
    let (mut sum, mut count) = (Vec::new(), Vec::new());
    for l in intervals {
        let Some(q) = l["processes"].as_array().and_then(|ps| {
            ps.iter()
                .find(|q| q["pid"] == p["pid"] && q["start_ticks"] == p["start_ticks"])
        }) else {
            continue;
        };
        let end = l["end"]
            .as_str()
            .and_then(|e| humantime::parse_rfc3339(e).ok());
        let at = end
            .and_then(|e| e.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64());
        let (Some(at), Some(t0)) = (at, t0) else {
            continue;
        };
        xs.push(at - t0);
        sum.push(u(&q["write"]["wait_ns"]["sum"]) as f64);
        count.push(u(&q["write"]["count"]) as f64);
    }
    out.push_str(r#"<div class="grid">"#);
    out.push_str(&lines(
        "write-wait-over-time",
        &xs,
        &[("write wait per interval", sum)],
        Unit::Ns,
    ));
    out.push_str(&lines(
        "writes-over-time",
        &xs,
        &[("writes per interval", count)],
        Unit::Count,
    ));
    out.push_str("</div>");
    // By role and by cause.
    let mut roles: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for t in p["threads"].as_array().into_iter().flatten() {
        let e = roles
            .entry(t["role"].as_str().unwrap_or("other").to_string())
            .or_default();
        e.0 += u(&t["write"]["count"]) as f64;
        e.1 += u(&t["write"]["wait_ns"]["sum"]) as f64;
    }
    let labels: Vec<String> = roles.keys().cloned().collect();
    out.push_str(r#"<h3>Writes and write wait by thread role</h3><div class="grid">"#);
    out.push_str(&bars(
        "writes-by-role",
        &labels,
        &[("writes", roles.values().map(|v| v.0).collect())],
        Unit::Count,
    ));
    out.push_str(&bars(
        "wait-by-role",
        &labels,
        &[("write wait", roles.values().map(|v| v.1).collect())],
        Unit::Ns,
    ));
    out.push_str("</div>");
    let causes: Vec<&Value> = p["causes"].as_array().into_iter().flatten().collect();
    let labels: Vec<String> = causes
        .iter()
        .map(|c| c["cause"].as_str().unwrap_or("?").to_string())
        .collect();
    out.push_str(r#"<h3>Writes and write wait by cause</h3><div class="grid">"#);
    out.push_str(&bars(
        "writes-by-cause",
        &labels,
        &[(
            "writes",
            causes
                .iter()
                .map(|c| u(&c["write"]["count"]) as f64)
                .collect(),
        )],
        Unit::Count,
    ));
    out.push_str(&bars(
        "wait-by-cause",
        &labels,
        &[(
            "write wait",
            causes
                .iter()
                .map(|c| u(&c["write"]["wait_ns"]["sum"]) as f64)
                .collect(),
        )],
        Unit::Ns,
    ));
    out.push_str("</div><h3>Hold per acquisition (log2 buckets)</h3><div class=\"grid\">");
    out.push_str(&histogram(
        "hold-histogram",
        &[
            ("write", &buckets(&w["hold_ns"])),
            ("read", &buckets(&p["read"]["hold_ns"])),
        ],
    ));
    out.push_str("</div>");
    if let Some(roles) = p["blocked_by_role"].as_array().filter(|r| !r.is_empty()) {
        out.push_str("<h3>Who made whom wait</h3><table><tr><th>waiter</th><th>holder</th><th>its hold</th><th>write wait</th><th>all wait</th></tr>");
        for r in roles.iter().take(12) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(r["waiter_role"].as_str().unwrap_or("")),
                esc(r["holder_role"].as_str().unwrap_or("")),
                esc(r["cause"].as_str().unwrap_or("")),
                fmt_ns(u(&r["write_wait_ns"])),
                fmt_ns(u(&r["wait_ns"]))
            );
        }
        out.push_str("</table>");
    }
    code_tables(&mut out, p);
    if let Some(svg) = flame_graph(&format!("Sampled writes of {comm} ({pid})"), &p["flame"]) {
        out.push_str(r#"<h3>Flame graph of the sampled writes</h3><div class="flame">"#);
        out.push_str(&svg);
        out.push_str("</div>");
    }
    out.push_str("</section>");
    out
}

/// Sampled writes by code and by JavaScript function.
fn code_tables(out: &mut String, p: &Value) {
    if let Some(d) = p["dsos"].as_array().filter(|d| !d.is_empty()) {
        out.push_str("<h3>Sampled writes by code</h3><table><tr><th>code</th><th>writes</th><th>wait</th></tr>");
        for x in d.iter().take(10) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(x["dso"].as_str().unwrap_or("")),
                u(&x["write"]["count"]),
                fmt_ns(u(&x["write"]["wait_ns"]["sum"]))
            );
        }
        out.push_str("</table>");
    }
    if let Some(js) = p["js_functions"].as_array().filter(|d| !d.is_empty()) {
        out.push_str("<h3>Sampled writes by JavaScript function</h3><table><tr><th>function</th><th>file</th><th>writes</th><th>wait</th></tr>");
        for f in js.iter().take(10) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(f["function"].as_str().unwrap_or("")),
                esc(f["file"].as_str().unwrap_or("")),
                u(&f["writes"]),
                fmt_ns(u(&f["wait_ns_sum"]))
            );
        }
        out.push_str("</table>");
    }
    if let Some(h) = p["js_hint"].as_str() {
        let _ = write!(out, r#"<p class="note">{}</p>"#, esc(h));
    }
}

fn seconds_of(v: &Value) -> Option<f64> {
    let t = humantime::parse_rfc3339(v.as_str()?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The page of a run: per process (the largest write wait first), from its last summary, and
/// its interval lines for the charts over time.
pub fn run_page(name: &str, run: &RunLines) -> String {
    if let Some(study) = run.study() {
        return study::study_page(study);
    }
    let mut body = String::new();
    let summary = run.summaries.last();
    let t0 = summary
        .and_then(|s| seconds_of(&s["start"]))
        .or_else(|| run.intervals.first().and_then(|l| seconds_of(&l["start"])));
    let source = match summary {
        Some(_) => summary,
        None => {
            body.push_str(r#"<p class="note">No summary line (the run was cut short): the processes below are those of the last interval line.</p>"#);
            run.intervals.last()
        }
    };
    // A demo line holds two runs (Worker threads, then processes): both are shown.
    let sources: Vec<&Value> = if run.other.iter().any(|v| v["type"] == "demo") {
        run.summaries.iter().collect()
    } else {
        source.into_iter().collect()
    };
    let mut procs: Vec<&Value> = sources
        .iter()
        .filter_map(|s| s["processes"].as_array())
        .flatten()
        .collect();
    procs.sort_by_key(|p| std::cmp::Reverse(u(&p["write"]["wait_ns"]["sum"])));
    if procs.is_empty() {
        body.push_str(r#"<p class="note">No mmap_lock activity by the selected processes.</p>"#);
    }
    for p in procs {
        body.push_str(&process_section(p, &run.intervals, t0));
    }
    if let Some(s) = summary {
        let lost = u(&s["lost"]["events"]) + u(&s["lost"]["map_full"]);
        let _ = write!(
            body,
            r#"<p class="note">Lost acquisitions: {lost}. Report format: docs/report-format.md.</p>"#
        );
    }
    let sub = summary.map_or(String::new(), |s| {
        format!(
            "{} to {} ({} s), {} interval lines",
            s["start"].as_str().unwrap_or(""),
            s["end"].as_str().unwrap_or(""),
            s["duration_s"],
            run.intervals.len()
        )
    });
    page(&format!("mmaplock-prof: {name}"), &sub, &body)
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
