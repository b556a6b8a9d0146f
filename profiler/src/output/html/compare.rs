//! The comparison's page: per group of processes (`--by`), its processes on each side, writes
//! and write wait before and after, by role and by cause, as paired bars, and the table with
//! ratios and noise verdicts.

use std::{fmt::Write as _, io};

use super::{
    page,
    svg::{Unit, bars, esc},
};
use crate::output::{
    Output,
    compare::{Change, Comparison, Row, runs_label, text::members, value},
};

fn cell(c: &Change, ns: bool) -> String {
    let v = |x: f64| value(x, ns);
    let spread = |s: &crate::output::compare::Spread| {
        if s.runs > 1 && s.min != s.max {
            format!(" <small>({}–{})</small>", v(s.min), v(s.max))
        } else {
            String::new()
        }
    };
    let ratio = c.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
    let class = match (c.verdict, c.ratio) {
        ("changed", Some(r)) if r < 1.0 => "good",
        ("changed", Some(_)) => "bad",
        _ => "",
    };
    format!(
        "<td>{}{}</td><td>{}{}</td><td class=\"{class}\">{ratio}</td>",
        v(c.before.mean),
        spread(&c.before),
        v(c.after.mean),
        spread(&c.after)
    )
}

/// The findings before and after, first on the page: did the change remove them?
fn findings_table(c: &Comparison) -> String {
    if c.findings.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<section class=\"process findings\" id=\"findings\"><h2>Findings, before and after</h2><table data-table=\"findings\"><tr><th>group</th><th>finding</th><th>share of the threads' time before</th><th>after</th><th>verdict</th></tr>",
    );
    for f in &c.findings {
        let side = |p: &crate::output::compare_findings::Presence| match p.mean_share() {
            None => "absent".to_string(),
            Some(share) => format!(
                "{share} <small>({} of {} runs{})</small>",
                p.present,
                p.runs,
                p.severity
                    .map_or(String::new(), |s| format!(", {}", s.as_str()))
            ),
        };
        let class = match f.verdict {
            "removed" | "reduced" => "good",
            "worse" | "new" => "bad",
            _ => "",
        };
        let _ = write!(
            out,
            r#"<tr data-finding="{id}"><td>{}</td><td>{id}<br><small>{}</small></td><td>{}</td><td>{}</td><td class="{class}">{}</td></tr>"#,
            esc(&f.process),
            esc(&f.title),
            side(&f.before),
            side(&f.after),
            f.verdict,
            id = esc(&f.id),
        );
    }
    out.push_str("</table></section>");
    out
}

/// `compare --html`: the comparison's page.
pub struct ComparePage;

impl Output<Comparison> for ComparePage {
    fn emit(&mut self, c: &Comparison, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_all(compare_page(c).as_bytes())
    }
}

pub fn compare_page(c: &Comparison) -> String {
    let mut body = String::new();
    if let Some(note) = crate::output::text::mode_note(c.mode) {
        let _ = write!(body, r#"<p class="note mode">{}.</p>"#, esc(note));
    }
    let _ = write!(
        body,
        r#"<p class="note by">Processes grouped by {} (--by {}).</p>"#,
        c.by.what(),
        c.by.name()
    );
    for n in &c.notes {
        let _ = write!(body, r#"<p class="note grouped">{}.</p>"#, esc(n));
    }
    body.push_str(&findings_table(c));
    for set in &c.groups {
        let rows: Vec<_> = c.rows.iter().filter(|r| r.process == set.name).collect();
        let _ = write!(
            body,
            r#"<section class="process"><h2>{}</h2><p class="members">before: {}; after: {}</p>"#,
            esc(&set.name),
            esc(&members(&set.before, c.by, 8)),
            esc(&members(&set.after, c.by, 8))
        );
        for group in ["role", "cause"] {
            let g: Vec<_> = rows.iter().filter(|r| r.group == group).collect();
            if g.is_empty() {
                continue;
            }
            let labels: Vec<String> = g.iter().map(|r| r.key.clone()).collect();
            let pair = |f: &dyn Fn(&Row) -> (f64, f64)| -> Vec<(&str, Vec<f64>)> {
                vec![
                    ("before", g.iter().map(|r| f(r).0).collect()),
                    ("after", g.iter().map(|r| f(r).1).collect()),
                ]
            };
            body.push_str(r#"<div class="grid">"#);
            for (what, chart, values, unit) in [
                (
                    "Writes",
                    "writes",
                    pair(&|r| (r.writes.before.mean, r.writes.after.mean)),
                    Unit::Count,
                ),
                (
                    "Write wait",
                    "wait",
                    pair(&|r| (r.wait_ns.before.mean, r.wait_ns.after.mean)),
                    Unit::Ns,
                ),
                (
                    "Read wait",
                    "read-wait",
                    pair(&|r| {
                        r.reads.as_ref().map_or((0.0, 0.0), |x| {
                            (x.read_wait_ns.before.mean, x.read_wait_ns.after.mean)
                        })
                    }),
                    Unit::Ns,
                ),
            ] {
                // (Causes are the writes': no read wait by cause.)
                if chart == "read-wait" && group == "cause" {
                    continue;
                }
                let _ = write!(
                    body,
                    r#"<div class="panel"><h3>{what} by {group}</h3>{}</div>"#,
                    bars(&format!("{chart}-by-{group}"), &labels, &values, unit)
                );
            }
            body.push_str("</div>");
        }
        body.push_str("<h3>Figures</h3><table><tr><th></th><th>writes</th><th>after</th><th>ratio</th><th>write wait</th><th>after</th><th>ratio</th><th>mean</th><th>after</th><th>ratio</th><th>p99</th><th>after</th><th>ratio</th><th>verdict: writes</th><th>wait</th></tr>");
        for r in &rows {
            let label = if r.group == "all" {
                "all".to_string()
            } else {
                format!("{} {}", r.group, r.key)
            };
            let figures: String = r.figures().map(|(c, ns)| cell(c, ns)).concat();
            let _ = write!(
                body,
                "<tr><td>{}</td>{figures}<td>{}</td><td>{}</td></tr>",
                esc(&label),
                r.writes.verdict,
                r.wait_ns.verdict
            );
        }
        body.push_str("</table>");
        let reads: Vec<_> = rows
            .iter()
            .filter_map(|r| Some((r, r.read_figures()?)))
            .collect();
        if !reads.is_empty() {
            body.push_str("<h3>Reads</h3><table data-table=\"reads\"><tr><th></th><th>reads</th><th>after</th><th>ratio</th><th>read wait</th><th>after</th><th>ratio</th><th>mean</th><th>after</th><th>ratio</th><th>p99</th><th>after</th><th>ratio</th><th>verdict: reads</th><th>wait</th></tr>");
            for (r, figures) in reads {
                let label = if r.group == "all" {
                    "all".to_string()
                } else {
                    format!("{} {}", r.group, r.key)
                };
                let cells: String = figures.map(|(c, ns)| cell(c, ns)).concat();
                let _ = write!(
                    body,
                    "<tr><td>{}</td>{cells}<td>{}</td><td>{}</td></tr>",
                    esc(&label),
                    figures[0].0.verdict,
                    figures[1].0.verdict
                );
            }
            body.push_str("</table>");
        }
        body.push_str("</section>");
    }
    if c.before.runs < 2 || c.after.runs < 2 {
        body.push_str(r#"<p class="note">One run per side: run-to-run noise cannot be judged. Concatenate several runs per side to have it judged.</p>"#);
    }
    page(
        "mmaplock-prof: before and after",
        &format!(
            "{} ({}) → {} ({})",
            c.before.file,
            runs_label(c.before.runs),
            c.after.file,
            runs_label(c.after.runs)
        ),
        &body,
    )
}
