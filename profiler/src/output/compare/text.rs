//! `compare`'s view for people: how the processes were grouped and how many each group has
//! on each side, then the table of figures and the findings.

use super::{By, Change, Comparison, Members, Spread};
use crate::output::{
    Output, compare_findings,
    text::{fit, fmt_ns},
};

/// `1 run`, `2 runs`.
pub fn runs_label(n: usize) -> String {
    format!("{n} run{}", if n == 1 { "" } else { "s" })
}

/// A figure as the table shows it: a duration, or a count.
pub fn value(x: f64, ns: bool) -> String {
    if ns {
        fmt_ns(x.round() as u64)
    } else {
        format!("{}", x.round() as u64)
    }
}

/// A count over runs: itself, or its mean and range when the runs differ.
pub fn count(s: &Spread) -> String {
    if s.min == s.max {
        format!("{}", s.mean)
    } else {
        format!("{:.1} ({}-{})", s.mean, s.min, s.max)
    }
}

/// How many processes a group has on one side, and their names (at most `names` of them).
pub fn members(m: &Members, by: By, names: usize) -> String {
    let n = count(&m.processes);
    let noun = if n == "1" { "process" } else { "processes" };
    // Grouped by name, the group's name is theirs.
    if by == By::Comm || m.comms.is_empty() {
        return format!("{n} {noun}");
    }
    let mut shown: Vec<&str> = m.comms.iter().take(names).map(String::as_str).collect();
    let more = m.comms.len().saturating_sub(names);
    let more = format!("{more} more names");
    if m.comms.len() > names {
        shown.push(&more);
    }
    format!("{n} {noun} ({})", shown.join(", "))
}

/// A group's name in at most `width` characters: a path (an executable, a cgroup) cut at its
/// start, since its end tells paths apart (`…/v22.11.0/bin/node`), any other name at its end.
fn fit_group(name: &str, width: usize) -> String {
    let n = name.chars().count();
    if !name.starts_with('/') || n <= width {
        return fit(name, width);
    }
    let tail: String = name.chars().skip(n + 1 - width).collect();
    format!("…{tail}")
}

fn show(c: &Change, ns: bool) -> String {
    let v = |x: f64| value(x, ns);
    let ratio = c.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
    format!(
        "{:>9} {:>9} {:>7}",
        v(c.before.mean),
        v(c.after.mean),
        ratio
    )
}

/// `compare`'s view for people.
pub struct CompareText;

impl Output<Comparison> for CompareText {
    fn emit(&mut self, c: &Comparison, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        out.write_all(to_text(c).as_bytes())
    }
}

/// The comparison as a table for people.
pub fn to_text(c: &Comparison) -> String {
    let mut out = format!(
        "mmaplock-prof compare: {} ({}) -> {} ({})\n",
        c.before.file,
        runs_label(c.before.runs),
        c.after.file,
        runs_label(c.after.runs),
    );
    if let Some(note) = crate::output::text::mode_note(c.mode) {
        out.push_str(&format!("  ({note})\n"));
    }
    out.push_str(&format!(
        "  grouped by {} (--by {}), processes before -> after:\n",
        c.by.what(),
        c.by.name()
    ));
    for g in &c.groups {
        out.push_str(&format!(
            "    {:<28} {} -> {}\n",
            fit_group(&g.name, 28),
            members(&g.before, c.by, 4),
            members(&g.after, c.by, 4)
        ));
    }
    for n in &c.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out.push_str(&format!(
        "\n  {:<28} {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {}\n",
        format!("{} / role / cause", c.by.name()),
        "writes", "after", "ratio",
        "wait", "after", "ratio",
        "mean", "after", "ratio",
        "p99", "after", "ratio",
        "verdict: writes / wait"
    ));
    let label = |r: &super::Row| match r.group {
        "all" => fit_group(&r.process, 28),
        g => fit(&format!("  {g} {}", r.key), 28),
    };
    for r in &c.rows {
        let figures = r.figures().map(|(c, ns)| show(c, ns)).join("  ");
        out.push_str(&format!(
            "  {:<28} {figures}  {} / {}\n",
            label(r),
            r.writes.verdict,
            r.wait_ns.verdict
        ));
    }
    // The reads beside: a process may wait most on them (page faults behind writers).
    let reads: Vec<_> = c
        .rows
        .iter()
        .filter_map(|r| Some((r, r.read_figures()?)))
        .collect();
    if !reads.is_empty() {
        out.push_str(&format!(
            "\n  {:<28} {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}  {}\n",
            format!("{} / role", c.by.name()),
            "reads", "after", "ratio",
            "wait", "after", "ratio",
            "mean", "after", "ratio",
            "p99", "after", "ratio",
            "verdict: reads / wait"
        ));
        for (r, figures) in reads {
            let f = figures.map(|(c, ns)| show(c, ns)).join("  ");
            out.push_str(&format!(
                "  {:<28} {f}  {} / {}\n",
                label(r),
                figures[0].0.verdict,
                figures[1].0.verdict
            ));
        }
    }
    out.push_str(&compare_findings::to_text(&c.findings));
    if c.before.runs < 2 || c.after.runs < 2 {
        out.push_str(
            "\n  One run per side: run-to-run noise cannot be judged. Concatenate the NDJSON of\n  several runs per side (each ends with its summary) to have it judged.\n",
        );
    }
    out
}
