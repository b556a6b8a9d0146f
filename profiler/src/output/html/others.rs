//! The processes a run's page does not draw in full: past the [`PAGE_PROCESSES`] that waited
//! longest, one row each in a table; those the summary grouped (`minor_processes`), its line
//! and a row per command. A run of a thousand processes is then a page of ten.

use std::fmt::Write as _;

use super::svg::esc;
use crate::output::{
    report::{MinorProcesses, ProcessReport},
    text::{fmt_ns, fmt_share, listing},
};

/// Processes a page draws in full (sections with charts).
pub const PAGE_PROCESSES: usize = 10;

/// A table (`attrs` on its tag): the column names, then a row of cells (HTML already).
pub(super) fn table(
    out: &mut String,
    attrs: &str,
    columns: &[&str],
    rows: impl Iterator<Item = Vec<String>>,
) {
    let space = if attrs.is_empty() { "" } else { " " };
    let _ = write!(out, "<table{space}{attrs}><tr>");
    for c in columns {
        let _ = write!(out, "<th>{c}</th>");
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The listed processes not drawn in full, one row each, the longest wait first.
pub fn others_section(rest: &[&ProcessReport]) -> String {
    if rest.is_empty() {
        return String::new();
    }
    let mut out = format!(
        r#"<section class="process others"><h2>{}</h2><p class="note">Each waited less than those above; {}.</p>"#,
        listing::more_processes(rest.len() as u64),
        esc(listing::SEE_ALL)
    );
    table(
        &mut out,
        r#"data-table="other-processes""#,
        &[
            "process",
            "pid",
            "writes",
            "write wait",
            "reads",
            "read wait",
            "share of time",
        ],
        rest.iter().map(|p| {
            vec![
                esc(&p.comm),
                p.pid.to_string(),
                p.lock.write.count.to_string(),
                fmt_ns(p.lock.write.wait_ns.sum),
                p.lock.read.count.to_string(),
                fmt_ns(p.lock.read.wait_ns.sum),
                p.time_share
                    .as_ref()
                    .map_or("-".into(), |s| fmt_share(s.wall)),
            ]
        }),
    );
    out.push_str("</section>");
    out
}

/// The processes a summary grouped: its line, and their totals by command.
pub fn minor_section(m: &MinorProcesses) -> String {
    if m.totals.processes == 0 {
        return String::new();
    }
    let mut out = format!(
        r#"<section class="process minor" id="minor-processes"><h2>Grouped: {}</h2><p class="note">{}</p>"#,
        listing::processes(m.totals.processes),
        esc(listing::minor_line(m).trim())
    );
    table(
        &mut out,
        r#"data-table="minor-processes""#,
        &["command", "processes", "writes", "reads", "wait"],
        m.by_comm.iter().map(|c| {
            vec![
                esc(&c.comm),
                c.totals.processes.to_string(),
                c.totals.writes.to_string(),
                c.totals.reads.to_string(),
                fmt_ns(c.totals.wait_ns),
            ]
        }),
    );
    out.push_str("</section>");
    out
}
