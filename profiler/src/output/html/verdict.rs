//! The verdict on a page: the findings first (what was found, what it costs, what to change,
//! what the study measured), and in each process the lock's share of its threads' time.

use std::fmt::Write as _;

use super::svg::esc;
use crate::output::{
    findings::{self, Finding},
    report::{ProcessReport, TimeShare},
    text::{fmt_ns, fmt_per_cpu, fmt_share},
};

fn list(out: &mut String, class: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let _ = write!(out, r#"<ul class="{class}">"#);
    for i in items {
        let _ = write!(out, "<li>{}</li>", esc(i));
    }
    out.push_str("</ul>");
}

/// An agent's capture: why it was taken, and its verdict, before anything else on its page.
pub fn trigger_section(t: &crate::output::report::Trigger) -> String {
    let mut out = String::from(
        r#"<section class="process trigger" id="trigger"><h2>Why this capture was taken</h2>"#,
    );
    let lines = crate::output::report::trigger_lines(t);
    let passed = match t.passed {
        Some(true) => "passed",
        Some(false) => "went-on",
        None => "unknown",
    };
    for (i, l) in lines.iter().enumerate() {
        let class = match i {
            0 => "why",
            1 if t.verdict.is_some() => "verdict",
            _ => "window",
        };
        let _ = write!(
            out,
            r#"<p class="{class}" data-verdict="{passed}">{}</p>"#,
            esc(l)
        );
    }
    out.push_str("</section>");
    out
}

/// The findings section, at the top of a run's page.
pub fn findings_section(findings: &[Finding]) -> String {
    let mut out =
        String::from(r#"<section class="process findings" id="findings"><h2>Findings</h2>"#);
    if findings.is_empty() {
        out.push_str(
            r#"<p class="note">No pattern recognised (docs/findings.md lists them).</p></section>"#,
        );
        return out;
    }
    for f in findings {
        let _ = write!(
            out,
            r#"<div class="finding sev-{sev}" data-finding="{id}" data-pid="{pid}"{window}><h3><span class="sev">{shown}</span> {comm} (pid {pid}{said}): {title}</h3>"#,
            sev = f.severity.as_str(),
            shown = esc(&findings::severity_text(f)),
            id = esc(&f.id),
            pid = f.pid,
            window = f
                .window
                .as_deref()
                .map_or(String::new(), |w| format!(r#" data-window="{}""#, esc(w))),
            said = findings::window_text(f),
            comm = esc(&f.comm),
            title = esc(&f.title),
        );
        // The same lines as the text view, in its order (findings::lines).
        let (mut evidence, mut advice, mut measured) = (Vec::new(), Vec::new(), Vec::new());
        for (label, line) in findings::lines(f) {
            match label {
                "cost" => {
                    let _ = write!(out, r#"<p class="cost">{}</p>"#, esc(&line));
                }
                "change" => advice.push(line),
                "measured here" => measured.push(line),
                "evidence" => evidence.push(line),
                _ => evidence.push(format!("{label}: {line}")),
            }
        }
        list(&mut out, "evidence", &evidence);
        if !advice.is_empty() {
            out.push_str("<p><b>What to change</b></p>");
            list(&mut out, "advice", &advice);
        }
        if !measured.is_empty() {
            let _ = write!(
                out,
                "<p><b>Measured on this host</b> <small>({})</small></p>",
                esc(f.measured_on.as_deref().unwrap_or("the study"))
            );
            list(&mut out, "measured", &measured);
        }
        let _ = write!(out, r#"<p class="note">{}</p></div>"#, esc(&f.source));
    }
    out.push_str("</section>");
    out
}

/// A process's time share: the whole process, then per role.
pub fn time_share_table(p: &ProcessReport) -> String {
    let Some(roles) = p.time_share_by_role.as_ref().filter(|r| !r.is_empty()) else {
        return String::new();
    };
    let mut out = String::from(
        "<div class=\"panel\"><h3>Share of the threads' time waiting</h3><table data-table=\"time-share\"><tr><th>threads</th><th>count</th><th>wait</th><th>alive</th><th>share of time</th><th title=\"their wait over their CPU time: a ratio, above 1 s when they waited longer than they ran\">wait per CPU-second</th></tr>",
    );
    let row = |out: &mut String, label: &str, s: &TimeShare| {
        let cpu = s.cpu.map_or("-".into(), fmt_per_cpu);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(label),
            s.threads.unwrap_or(0),
            fmt_ns(s.wait_ns),
            fmt_ns(s.alive_ns),
            fmt_share(s.wall),
            cpu
        );
    };
    if let Some(all) = &p.time_share {
        row(&mut out, "all its own", all);
    }
    for r in roles {
        row(&mut out, r.role.as_str(), &r.share);
    }
    out.push_str("</table></div>");
    out
}
