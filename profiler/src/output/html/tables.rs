//! The tables of a process's section of a run page: its blockers, its threads grouped, the
//! code and JavaScript functions that asked for memory, and what holders ran.

use std::fmt::Write as _;

use super::{others, svg::esc};
use crate::output::{report::ProcessReport, text::fmt_ns};

/// The threads whose holds made this process's threads wait (`--blockers`).
pub(super) fn blockers_table(out: &mut String, p: &ProcessReport) {
    let Some(b) = p.blockers.as_ref().filter(|b| !b.is_empty()) else {
        return;
    };
    out.push_str("<div class=\"panel\">");
    table(
        out,
        "Blockers: the holds that made them wait",
        &["holder", "tid", "role", "its hold", "waits", "wait charged"],
        b.iter().take(12).map(|x| {
            [
                esc(&x.comm),
                x.tid.to_string(),
                x.role.as_str().to_string(),
                esc(&x.cause),
                x.waits.to_string(),
                fmt_ns(x.wait_ns),
            ]
        }),
    );
    out.push_str("</div>");
}

/// The threads not listed one by one (short-lived, or past the listed), a row per group.
pub(super) fn groups_table(out: &mut String, p: &ProcessReport) {
    let Some(g) = p.thread_groups.as_ref().filter(|g| !g.is_empty()) else {
        return;
    };
    out.push_str("<div class=\"panel\">");
    table(
        out,
        "Threads grouped",
        &[
            "threads",
            "role",
            "started in",
            "why",
            "writes",
            "write wait",
            "reads",
            "read wait",
        ],
        g.iter().take(12).map(|x| {
            let started = [x.start_routine.as_deref(), x.row.role_addon.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" of ");
            [
                x.threads.to_string(),
                x.row.role.as_str().to_string(),
                esc(&started),
                esc(&x.grouped),
                x.row.lock.write.count.to_string(),
                fmt_ns(x.row.lock.write.wait_ns.sum),
                x.row.lock.read.count.to_string(),
                fmt_ns(x.row.lock.read.wait_ns.sum),
            ]
        }),
    );
    out.push_str("</div>");
}

/// A table under its heading: the columns' names, then a row per item (its cells HTML
/// already, escaped where they are text).
pub(super) fn table<const N: usize>(
    out: &mut String,
    heading: &str,
    columns: &[&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) {
    let _ = write!(out, "<h3>{heading}</h3>");
    others::table(out, "", columns, rows.into_iter().map(Vec::from));
}

/// Sampled writes by code and by JavaScript function.
pub(super) fn code_tables(out: &mut String, p: &ProcessReport) {
    if let Some(d) = p.dsos.as_ref().filter(|d| !d.is_empty()) {
        table(
            out,
            "Sampled writes by code",
            &["code", "writes", "wait"],
            d.iter().take(10).map(|x| {
                [
                    esc(&x.dso),
                    x.write.count.to_string(),
                    fmt_ns(x.write.wait_ns.sum),
                ]
            }),
        );
    }
    if let Some(js) = p.js_functions.as_ref().filter(|d| !d.is_empty()) {
        table(
            out,
            "Sampled writes by JavaScript function",
            &["function", "file", "writes", "wait"],
            js.iter().take(10).map(|f| {
                [
                    esc(&f.function),
                    esc(&f.file),
                    f.writes.to_string(),
                    fmt_ns(f.wait_ns_sum),
                ]
            }),
        );
    }
    if let Some(h) = &p.js_hint {
        let _ = write!(out, r#"<p class="note">{}</p>"#, esc(h));
    }
    holder_tables(out, p);
}

/// Contention mode: what the writers that sampled waits began behind were running.
fn holder_tables(out: &mut String, p: &ProcessReport) {
    if let Some(f) = p.holder_functions.as_ref().filter(|f| !f.is_empty()) {
        table(
            out,
            "Held by: the JavaScript the writers ran that sampled waits began behind",
            &["function", "file", "held for", "waits behind it", "wait"],
            f.iter().take(10).map(|h| {
                [
                    esc(&h.function),
                    esc(&h.file),
                    esc(&h.cause),
                    h.waits.to_string(),
                    fmt_ns(h.wait_ns_sum),
                ]
            }),
        );
    }
    if let Some(s) = p.holder_stacks.as_ref().filter(|s| !s.is_empty()) {
        table(
            out,
            "Held by: the holders' stacks (innermost first)",
            &["stack", "waits behind it", "wait"],
            s.iter().take(5).map(|h| {
                let frames: Vec<String> = h.frames.iter().take(8).map(|f| esc(f)).collect();
                [
                    frames.join("<br>"),
                    h.count.to_string(),
                    fmt_ns(h.wait_ns_sum),
                ]
            }),
        );
    }
}
