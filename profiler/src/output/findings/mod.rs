//! From numbers to a verdict: the patterns recognised in a summary (`findings`), each with
//! its evidence, what it costs the threads involved (severity from their time share), what
//! to change, and, given a study of this host, what that change measured there.
//!
//! A pure function of a summary (the report's own type, as the profiler builds it or as
//! `report` and `compare` read it back from a file of any build, so that they recompute it)
//! and of an optional study. The patterns are data: the table in [`patterns`], each with its
//! sources in docs/findings.md.

mod chain;
mod detect;
mod evidence;
mod holders;
pub mod impact;
pub mod listing;
mod mechanism;
#[cfg(test)]
mod minimums;
mod patterns;
mod ranking;
pub mod study;
#[cfg(test)]
mod tests;
mod view;
mod writers;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

pub use listing::{MATERIAL_SHARE, group_minor};
pub use patterns::PATTERNS;
pub use study::{Effect, StudyEffects, StudyFileError};

use crate::output::{
    Output,
    report::{ProcessReport, Report},
    text::fmt_ns,
};

/// What every finding of a contention-mode run says of its numbers.
pub const CONTENTION_FACT: &str = "measured in contention mode: the counts and waits are the contended waits only (acquisitions that did not wait, spinning and hold times are not seen)";

/// How much a finding costs the threads involved: from its time share (the wait it explains
/// over their wall time alive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Under 0.5% of their time.
    Info,
    /// 0.5% to 2%.
    Low,
    /// 2% to 10%.
    Medium,
    /// 10% and more.
    High,
}

impl Severity {
    pub fn of_share(share: f64) -> Severity {
        if share >= 0.10 {
            Severity::High
        } else if share >= 0.02 {
            Severity::Medium
        } else if share >= 0.005 {
            Severity::Low
        } else {
            Severity::Info
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
        }
    }
}

/// A thread a finding names (the holder of long holds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadRef {
    pub tid: u32,
    pub role: String,
    pub comm: String,
    /// What it held the lock for.
    pub cause: String,
}

/// A role whose threads waited behind a finding's writes, and how long.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VictimRef {
    pub role: String,
    /// Their wait behind those writes (reading and writing), ns.
    pub wait_ns: u64,
    /// The part of it their writes waited.
    pub write_wait_ns: u64,
}

/// Why the pattern was recognised.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Evidence {
    /// Thread roles involved, most involved first.
    pub roles: Vec<String>,
    /// Write causes (or `read`) involved.
    pub causes: Vec<String>,
    /// Code that asked for memory (sampled stacks: a function or a file).
    pub code: Vec<String>,
    /// JavaScript functions on the sampled stacks.
    pub js_functions: Vec<String>,
    /// Threads named (e.g. the holder).
    pub threads: Vec<ThreadRef>,
    /// The roles whose threads waited behind it, most wait first (the evidence chain's
    /// findings: docs/findings.md, "Mechanisms").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub victims: Vec<VictimRef>,
    /// The figures behind it, one sentence each.
    pub facts: Vec<String>,
}

/// One pattern recognised in one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The pattern (docs/findings.md#ID).
    pub id: String,
    pub pid: u32,
    pub comm: String,
    pub severity: Severity,
    /// What was found, in one line.
    pub title: String,
    /// The writes it rests on (the evidence chain's findings: the mechanism's writes,
    /// estimated from its sampled stacks; in contention mode, its contended writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<u64>,
    /// The wait it explains, ns, and as a share of the process's wait (write and read).
    pub wait_ns: u64,
    pub share_of_wait: f64,
    /// The wait it explains over the wall time alive of the threads involved; None when the
    /// report has no time share (an older build): then severity comes from
    /// `time_share_bound`.
    pub time_share: Option<f64>,
    /// Without a time share: the wait over the run's duration times the threads involved (a
    /// lower bound of the share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_share_bound: Option<f64>,
    #[serde(default)]
    pub evidence: Evidence,
    /// Whether removing its wait gives back throughput or only latency, from the process's
    /// CPU use (docs/findings.md, "Throughput or latency").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<impact::Impact>,
    /// What to change, most effective first.
    #[serde(default)]
    pub advice: Vec<String>,
    /// With `--study`: what those changes measured on the study's host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<Effect>,
    /// The study's host, when `measured` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_on: Option<String>,
    /// Where the pattern and its advice come from.
    #[serde(default)]
    pub source: String,
    /// In an agent's capture: the window it was found in, `capture` (the capture's own) or
    /// `crossing` (the agent's window that crossed the threshold: `trigger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
}

/// The findings of a summary: of the processes it lists (`listing`), the one that waited
/// longest first; within each, "not your bottleneck" first, then by severity and wait. In a
/// process that did not wait materially, only what is there (its verdict, an addon, the
/// profiler: the patterns reported `always`), never what to change; and the verdict of at
/// most [`listing::VERDICTS`] such processes.
pub fn find(s: &Report, study: Option<&StudyEffects>) -> Vec<Finding> {
    let mut out = Vec::new();
    let listed = listing::listing(s);
    let mut verdicts = 0;
    for i in listed.order {
        let p: &ProcessReport = &s.processes[i];
        let start = out.len();
        for pattern in PATTERNS {
            let verdict = pattern.id == patterns::NOT_A_BOTTLENECK;
            if (!listed.material[i] && !pattern.always)
                || (verdict && verdicts >= listing::VERDICTS)
            {
                continue;
            }
            if let Some(mut f) = (pattern.detect)(s, p) {
                verdicts += usize::from(verdict);
                f.id = pattern.id.to_string();
                f.advice
                    .extend(pattern.advice.iter().map(|a| a.to_string()));
                f.source = format!("docs/findings.md#{}", pattern.id);
                f.add_measured(study);
                f.add_impact(s, p, pattern.id);
                if s.mode == crate::vocab::Mode::Contention {
                    f.evidence.facts.push(CONTENTION_FACT.to_string());
                }
                out.push(f);
            }
        }
        out[start..].sort_by(|a, b| {
            let nb = |f: &Finding| f.id == patterns::NOT_A_BOTTLENECK;
            (nb(b), b.severity, b.wait_ns).cmp(&(nb(a), a.severity, a.wait_ns))
        });
        if s.mode == crate::vocab::Mode::Contention {
            ranking::note_close_ranks(&mut out[start..]);
        }
    }
    if let Some(t) = &s.trigger {
        with_crossing(&mut out, t);
    }
    out
}

/// An agent's capture: its findings, and those of the window that crossed (`trigger`), each
/// saying its window; the crossing window's first when the contention had passed by the
/// capture.
fn with_crossing(out: &mut Vec<Finding>, t: &crate::output::report::Trigger) {
    use crate::output::report::{CAPTURE, CROSSING};
    for f in out.iter_mut() {
        f.window = Some(CAPTURE.to_string());
    }
    let crossing = t.findings.iter().cloned().map(|mut f| {
        f.window = Some(CROSSING.to_string());
        f
    });
    if t.passed == Some(true) {
        let capture = std::mem::take(out);
        out.extend(crossing);
        out.extend(capture);
    } else {
        out.extend(crossing);
    }
}

/// How a finding's window is said: ", in the window that crossed" (empty outside captures).
pub fn window_text(f: &Finding) -> &'static str {
    match f.window.as_deref() {
        Some(crate::output::report::CROSSING) => ", in the window that crossed",
        Some(crate::output::report::CAPTURE) => ", during the capture",
        _ => "",
    }
}

impl Finding {
    /// Whether removing its wait gives back throughput or only latency (the evidence chain's
    /// findings say it themselves), and the severity that follows: a wait on a process whose
    /// CPUs were saturated is at most `low`.
    fn add_impact(&mut self, s: &Report, p: &ProcessReport, id: &str) {
        let verdicts = [patterns::NOT_A_BOTTLENECK, "profiler-presence"];
        if self.impact.is_some() || verdicts.contains(&id) || self.severity == Severity::Info {
            return;
        }
        if let Some(i) =
            impact::CpuFigures::of(s, p).and_then(|c| c.impact(self.wait_ns as f64, None))
        {
            if i.kind == impact::ImpactKind::Latency {
                self.severity = self.severity.min(Severity::Low);
            }
            self.impact = Some(i);
        }
    }

    /// With a study: what the pattern's advice measured on its host.
    pub fn add_measured(&mut self, study: Option<&StudyEffects>) {
        let (Some(st), Some(pattern)) = (study, PATTERNS.iter().find(|p| p.id == self.id)) else {
            return;
        };
        self.measured = st.of(pattern.study);
        if !self.measured.is_empty() {
            self.measured_on = Some(st.machine.clone());
        }
    }
}

/// Adds its findings to a summary.
pub fn attach(report: &mut Report, study: Option<&StudyEffects>) {
    report.findings = Some(find(report, study));
}

fn pct(x: f64) -> String {
    crate::output::text::fmt_share(x)
}

/// A study's effect in one line: `arena-1 at 64 KiB: 1.24x throughput (1.10-1.31, 3 runs,
/// changed), 0.46x writes`.
pub fn effect_text(e: &Effect) -> String {
    let size = crate::output::text::size_name(e.file_kib);
    let spread = if e.throughput.runs > 1 {
        format!(
            " ({:.2}-{:.2}, {} runs, {})",
            e.throughput.min, e.throughput.max, e.throughput.runs, e.verdict
        )
    } else {
        String::new()
    };
    format!(
        "{} at {size}: {:.2}x throughput{spread}, {:.2}x writes",
        e.scenario, e.throughput.mean, e.writes.mean
    )
}

/// The share line of a finding: `12% of the worker threads' time, 58% of the wait`.
pub fn share_text(f: &Finding) -> String {
    if f.id == patterns::NOT_A_BOTTLENECK {
        return format!(
            "{} of its threads' time ({} of wait)",
            pct(f.time_share.unwrap_or(0.0)),
            fmt_ns(f.wait_ns)
        );
    }
    let time = match (f.time_share, f.time_share_bound) {
        (Some(s), _) => format!("{} of the time of the threads involved, ", pct(s)),
        (None, Some(b)) => format!("at least {} of the threads' time, ", pct(b)),
        _ => String::new(),
    };
    format!(
        "{time}{} of the process's lock wait ({})",
        pct(f.share_of_wait),
        fmt_ns(f.wait_ns)
    )
}

/// A finding's severity as shown: `medium`, and what removing it gives back where the
/// process's CPU use tells (`low, latency only`, `medium, throughput`).
pub fn severity_text(f: &Finding) -> String {
    match &f.impact {
        Some(i) if i.kind == impact::ImpactKind::Latency => {
            format!("{}, latency only", f.severity.as_str())
        }
        Some(_) => format!("{}, throughput", f.severity.as_str()),
        None => f.severity.as_str().to_string(),
    }
}

/// A finding's cost line: its share, and what removing it would give back (throughput or
/// latency only), where the process's CPU use tells.
pub fn cost_text(f: &Finding) -> String {
    match &f.impact {
        Some(i) => format!("{}; {}", share_text(f), i.text()),
        None => share_text(f),
    }
}

/// A finding's content as labelled lines, in its order: what the text view prints under its
/// title and the page lists, the same for both (docs/findings.md, "One finding, one
/// content"): `cost`, each `evidence` fact (the victims among them), `code`, `JavaScript`,
/// each `change`, each `measured here`.
pub fn lines(f: &Finding) -> Vec<(&'static str, String)> {
    let mut out = vec![("cost", cost_text(f))];
    for fact in &f.evidence.facts {
        out.push(("evidence", fact.clone()));
    }
    if !f.evidence.code.is_empty() {
        out.push(("code", f.evidence.code.join("; ")));
    }
    if !f.evidence.js_functions.is_empty() {
        out.push(("JavaScript", f.evidence.js_functions.join("; ")));
    }
    for a in &f.advice {
        out.push(("change", a.clone()));
    }
    for e in &f.measured {
        out.push(("measured here", effect_text(e)));
    }
    out
}

/// `report`'s view for people: the findings alone.
pub struct FindingsText;

impl Output<[Finding]> for FindingsText {
    fn emit(&mut self, findings: &[Finding], out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let t = to_text(findings);
        out.write_all(
            match t.trim_start() {
                "" => "no findings\n",
                t => t,
            }
            .as_bytes(),
        )
    }
}

/// The findings section at the top of the text view.
pub fn to_text(findings: &[Finding]) -> String {
    let mut out = String::new();
    if findings.is_empty() {
        return out;
    }
    out.push_str("\nfindings (docs/findings.md):\n");
    for f in findings {
        let _ = writeln!(
            out,
            "  [{}] {} (pid {}{}): {}",
            severity_text(f),
            f.comm,
            f.pid,
            window_text(f),
            f.title
        );
        for (label, line) in lines(f) {
            let _ = writeln!(out, "      {label}: {line}");
        }
    }
    out
}
