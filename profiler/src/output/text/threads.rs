//! The threads a process's text does not list one by one: its groups (short-lived threads,
//! and those past the listed), each a line with its count and totals.

use std::fmt::Write as _;

use super::{count_of, fit, fmt_ns};
use crate::output::report::{ProcessReport, thread_groups::SHORT_LIVED};

/// How many groups the text shows (the longest wait first), and a line for the rest.
const GROUPS: usize = 5;

/// A file's name alone.
fn file_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// The groups of a process's threads, or nothing when none is grouped.
pub fn groups_text(p: &ProcessReport) -> String {
    let Some(groups) = p.thread_groups.as_ref().filter(|g| !g.is_empty()) else {
        return String::new();
    };
    let mut out = format!(
        "  {} grouped (JSON `thread_groups`, their totals exact):\n",
        count_of(p.grouped_threads(), "more thread", "more threads")
    );
    for g in groups.iter().take(GROUPS) {
        let t = &g.row;
        let mut what = count_of(
            g.threads,
            &format!("{} thread", t.role.as_str()),
            &format!("{} threads", t.role.as_str()),
        );
        let mut from: Vec<String> = Vec::new();
        if let Some(s) = &g.start_routine {
            from.push(fit(s, 40));
        }
        if let Some(a) = &t.role_addon {
            from.push(file_name(a).to_string());
        }
        if !from.is_empty() {
            let _ = write!(what, " started in {}", from.join(" of "));
        }
        let why = if g.grouped == SHORT_LIVED {
            "each lived under a second"
        } else {
            "past the listed"
        };
        let _ = writeln!(
            out,
            "    {what} ({why}): {} ({} wait), {} ({} wait)",
            count_of(t.lock.write.count, "write", "writes"),
            fmt_ns(t.lock.write.wait_ns.sum),
            count_of(t.lock.read.count, "read", "reads"),
            fmt_ns(t.lock.read.wait_ns.sum),
        );
    }
    if groups.len() > GROUPS {
        let rest = &groups[GROUPS..];
        let _ = writeln!(
            out,
            "    and {} more: {}",
            count_of(rest.len() as u64, "group", "groups"),
            count_of(rest.iter().map(|g| g.threads).sum(), "thread", "threads")
        );
    }
    out
}

/// What a process's entry lost to the bound of a summary line, said where its tables begin.
pub fn trimmed_text(p: &ProcessReport) -> String {
    let Some(t) = &p.trimmed else {
        return String::new();
    };
    let mut cut = Vec::new();
    if let Some(n) = t.samples {
        cut.push(format!(
            "{} that waited least (in samples.cut)",
            count_of(n, "sampled stack", "sampled stacks")
        ));
    }
    if let Some(n) = t.threads {
        cut.push(format!(
            "{} that waited least grouped",
            count_of(n, "thread", "threads")
        ));
    }
    for (what, c) in [
        ("JavaScript function", t.js_functions),
        ("holder function", t.holder_functions),
    ] {
        if let Some(c) = c {
            cut.push(format!(
                "{} ({} samples, {})",
                count_of(c.rows, what, &format!("{what}s")),
                c.count,
                fmt_ns(c.wait_ns_sum)
            ));
        }
    }
    format!(
        "  (its entry, {:.1} MB, was cut to the summary's bound of {} MB a process: {}; its totals are whole)\n",
        t.bytes as f64 / 1e6,
        crate::output::report::budget::MAX_PROCESS_BYTES >> 20,
        cut.join(", ")
    )
}
