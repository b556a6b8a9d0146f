//! How many processes a text report shows: the [`TEXT_PROCESSES`] that waited longest in
//! full, then one line for the rest of those listed, and one for those the summary grouped
//! (`minor_processes`), each saying how to see them all; every process with `--all-processes`
//! (`Report::show_all`). A run of a thousand processes then reads like a run of ten.

use std::fmt::Write as _;

use super::{fmt_ns, fmt_share};
use crate::output::{
    findings::{Finding, listing::MATERIAL_WAIT_NS},
    report::{MinorProcesses, ProcessReport, Report},
};

/// Processes a text report shows in full (and an interval block lists).
pub const TEXT_PROCESSES: usize = 10;

/// How to see every process, said wherever some are left out.
pub const SEE_ALL: &str =
    "--all-processes shows every one, on the run or on mmaplock-prof report FILE";

/// A process's wait for its lock, write and read.
fn wait(p: &ProcessReport) -> u64 {
    p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum
}

/// The processes of a report, the longest wait first: those shown, and those left out.
pub fn shown(r: &Report) -> (Vec<&ProcessReport>, Vec<&ProcessReport>) {
    let mut all: Vec<&ProcessReport> = r.processes.iter().collect();
    all.sort_by_key(|p| std::cmp::Reverse(wait(p)));
    let rest = if r.show_all {
        Vec::new()
    } else {
        all.split_off(TEXT_PROCESSES.min(all.len()))
    };
    (all, rest)
}

/// `1 process`, `3 processes`.
pub fn processes(n: u64) -> String {
    format!("{n} process{}", if n == 1 { "" } else { "es" })
}

/// `1 more process`, `3 more processes`.
pub fn more_processes(n: u64) -> String {
    format!("{n} more process{}", if n == 1 { "" } else { "es" })
}

/// Command names, most processes first: `node, sh` (the first five, then how many more).
fn comms(ps: &[&ProcessReport]) -> String {
    let mut by: Vec<(&str, usize)> = Vec::new();
    for p in ps {
        match by.iter_mut().find(|c| c.0 == p.comm) {
            Some(c) => c.1 += 1,
            None => by.push((&p.comm, 1)),
        }
    }
    by.sort_by_key(|c| std::cmp::Reverse(c.1));
    let mut names: Vec<String> = by.iter().take(5).map(|c| c.0.to_string()).collect();
    if by.len() > 5 {
        names.push(format!("{} more", by.len() - 5));
    }
    names.join(", ")
}

/// The line of the listed processes not shown: how many, whose, their writes and wait.
pub fn rest_line(rest: &[&ProcessReport], indent: &str) -> String {
    if rest.is_empty() {
        return String::new();
    }
    let writes: u64 = rest.iter().map(|p| p.lock.write.count).sum();
    let waited: u64 = rest.iter().map(|p| wait(p)).sum();
    format!(
        "{indent}{} ({}) not shown, each waited less: {writes} writes, {} of wait in all; {SEE_ALL}\n",
        more_processes(rest.len() as u64),
        comms(rest),
        fmt_ns(waited)
    )
}

/// The run's line on the processes it grouped: `703 processes (sh, esbuild, node) had at
/// most 41 writes each: none waited materially. ...`, with their totals, and what they cost
/// together when that is material (many short waits add up).
pub fn minor_line(m: &MinorProcesses) -> String {
    let t = &m.totals;
    if t.processes == 0 {
        return String::new();
    }
    let share = t.share();
    let together = t.wait_ns >= MATERIAL_WAIT_NS
        && share.is_some_and(|s| s >= crate::output::findings::MATERIAL_SHARE);
    format!(
        "\n{} ({}) had at most {} writes each: none waited materially{}. Together: {} writes, {} of wait{}; the JSON's minor_processes has them by command, {SEE_ALL}\n",
        processes(t.processes),
        m.comms_text(5),
        m.max_writes,
        if together {
            " alone, but together they did"
        } else {
            ""
        },
        t.writes,
        fmt_ns(t.wait_ns),
        share.map_or(String::new(), |s| format!(
            ", {} of their threads' time",
            fmt_share(s)
        ))
    )
}

/// The findings of the processes shown, and a line for the others'.
pub fn findings(all: &[Finding], shown: &[&ProcessReport], show_all: bool) -> String {
    let (kept, rest): (Vec<Finding>, Vec<Finding>) = all
        .iter()
        .cloned()
        .partition(|f| show_all || shown.iter().any(|p| p.pid == f.pid));
    let mut out = crate::output::findings::to_text(&kept);
    if !rest.is_empty() {
        let mut pids: Vec<u32> = rest.iter().map(|f| f.pid).collect();
        pids.dedup();
        let _ = writeln!(
            out,
            "  ... and {} more about {} not shown ({SEE_ALL}; -f json has them all)",
            rest.len(),
            processes(pids.len() as u64)
        );
    }
    out
}
