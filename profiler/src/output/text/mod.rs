//! The text rendering of reports, for people: tables, top threads and log2 histograms side
//! by side.
//!
//! Here a report's text; the pieces every text view is built of (durations, shares, sizes,
//! histograms side by side, cut names) are `format.rs`, what the lock cost a process (time
//! shares, who made whom wait) `waits.rs`.

use std::fmt::Write as _;

use crate::{
    output::{
        report::{Kind, Lost, ProcessReport, Report, Stats},
        series::Series,
    },
    vocab::Mode,
};

mod format;
pub mod listing;
mod over_time;
mod roles;
mod stack_ends;
#[cfg(test)]
mod tests;
mod threads;
mod waits;

use format::{BAR_WIDTH, fmt_f};
use roles::roles_text;

pub use format::{
    count_of, fit, fmt_ns, fmt_per_cpu, fmt_share, histogram_lines, side_by_side, size_name,
};
pub use threads::trimmed_text;
pub use waits::{blockers_text, time_share_text};

/// A file's name alone when its path does not fit a table column.
fn short_path(p: &str) -> String {
    if p.chars().count() <= LABEL {
        return p.to_string();
    }
    std::path::Path::new(p)
        .file_name()
        .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Width of the first column of the tables of STATS.
const LABEL: usize = 10;

/// The figures of a process's or thread's row: writes, their wait (sum, p99), reads, their
/// wait (sum).
fn row_figures(write: &Stats, read: &Stats) -> (u64, String, String, u64, String) {
    (
        write.count,
        fmt_ns(write.wait_ns.sum),
        fmt_ns(write.wait_ns.p99),
        read.count,
        fmt_ns(read.wait_ns.sum),
    )
}

fn stats_row(label: &str, s: &Stats) -> String {
    let label = fit(label, LABEL);
    format!(
        "  {label:<LABEL$} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        s.count,
        s.failed_trylocks,
        fmt_ns(s.wait_ns.sum),
        fmt_f(s.wait_ns.mean),
        fmt_ns(s.wait_ns.p50),
        fmt_ns(s.wait_ns.p99),
        fmt_ns(s.wait_ns.max),
        s.hold_ns.as_ref().map_or("-".into(), |h| fmt_ns(h.p50)),
        s.hold_ns.as_ref().map_or("-".into(), |h| fmt_ns(h.p99)),
    )
}

/// What a report in `mode` counts, said once at its top: contention mode's numbers are not
/// full mode's, and must not be read as if they were.
pub fn mode_note(mode: Mode) -> Option<&'static str> {
    (mode == Mode::Contention).then_some(
        "contention mode: counts and waits are the contended waits only (lock:contention_begin \
         to contention_end); acquisitions that did not wait, optimistic spinning, trylocks \
         and hold times are not seen (--mode full measures every acquisition)",
    )
}

/// How many threads (and roles) a process's text lists.
const TOP_THREADS: usize = 8;

/// A process's figures over time, by (pid, start_ticks), when the text is of a file whose
/// interval lines were read (`report FILE`).
pub type OverTime<'a> = &'a dyn Fn(u32, u64) -> Option<&'a Series>;

/// The text rendering of a report.
pub fn to_text(r: &Report) -> String {
    to_text_with(r, &|_, _| None)
}

/// The text rendering of a report, with its processes' figures over time where known.
pub fn to_text_with(r: &Report, over_time: OverTime<'_>) -> String {
    let mut out = String::new();
    match r.kind {
        Kind::Interval => {
            // One compact block per interval: totals per process.
            let _ = writeln!(
                out,
                "── interval {} ({:.1}s) ──",
                r.end,
                r.interval_s.unwrap_or(0.0)
            );
            if let Some(note) = mode_note(r.mode) {
                let _ = writeln!(out, "  ({note})");
            }
            if r.processes.is_empty() {
                out.push_str("  no mmap_lock activity\n");
            }
            let (shown, rest) = listing::shown(r);
            for p in shown {
                let (writes, wait, p99, reads, read_wait) =
                    row_figures(&p.lock.write, &p.lock.read);
                let _ = writeln!(
                    out,
                    "  {:>7} {:<15} writes {writes:>7} wait {wait:>9} (p99 {p99:>8})   reads {reads:>8} wait {read_wait:>9}",
                    p.pid,
                    fit(&p.comm, 15),
                );
            }
            out.push_str(&listing::rest_line(&rest, "  "));
        }
        Kind::Summary => {
            let _ = writeln!(
                out,
                "═══ mmaplock-prof summary: {} to {} ({:.1}s) ═══",
                r.start,
                r.end,
                r.duration_s.unwrap_or(0.0)
            );
            if let Some(lines) = r.summed_lines {
                out.push_str(&partial_note(lines, r.duration_s.unwrap_or(0.0)));
                out.push('\n');
            }
            // A capture says why it was taken before anything else.
            if let Some(t) = &r.trigger {
                for l in crate::output::report::trigger_lines(t) {
                    let _ = writeln!(out, "{l}");
                }
            }
            if let Some(note) = mode_note(r.mode) {
                let _ = writeln!(out, "{note}");
            }
            if r.processes.is_empty() {
                out.push_str("no mmap_lock activity by the selected processes\n");
            }
            let (shown, rest) = listing::shown(r);
            if let Some(f) = &r.findings {
                out.push_str(&listing::findings(f, &shown, r.show_all));
            }
            if let Some(m) = &r.minor_processes {
                out.push_str(&listing::minor_line(m));
            }
            for p in shown {
                out.push_str(&process_text_with(
                    p,
                    r.mode,
                    over_time(p.pid, p.start_ticks),
                ));
            }
            if !rest.is_empty() {
                out.push('\n');
                out.push_str(&listing::rest_line(&rest, ""));
            }
            if let Some(o) = &r.overhead {
                let _ = writeln!(
                    out,
                    "\nprofiler cost: {} events, {:.1} ns of BPF per event, {:.3}% of one CPU",
                    o.events, o.bpf_ns_per_event, o.bpf_cpu_pct
                );
            }
            out.push_str(&lost_text(&r.lost));
        }
    }
    out
}

/// What a summary summed from a file's interval lines is (the run had not written its
/// summary line: still going, or cut), and what it holds, said before any figure.
pub fn partial_note(lines: usize, seconds: f64) -> String {
    format!(
        "no summary yet: {} over {seconds:.1} s; the run is still going or was cut. The figures \
         below are the interval lines' sums (percentiles at the resolution of their log2 \
         buckets; no sampled stacks, which only a summary carries)",
        count_of(lines as u64, "interval line", "interval lines")
    )
}

/// One line naming every non-zero reason, or nothing when nothing was lost.
fn lost_text(l: &Lost) -> String {
    let reasons = [
        (l.map_full, "map full: raise --max-threads"),
        (l.nested, "more than two mm locks at once"),
        (l.no_state, "no per-thread state"),
        (l.ring_full, "pending ring full"),
        (l.exit_flush, "exited thread unreachable"),
        (l.exit_pending, "threads still exiting at the end"),
        (l.skipped, "program runs the kernel skipped"),
        (l.stacks, "stacks dropped: raise --stack-sample"),
        (l.holder_stacks, "holders' stacks not taken"),
        (
            l.output,
            "interval reports not written: the reader fell behind",
        ),
    ];
    let parts: Vec<String> = reasons
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("lost: {}\n", parts.join(", "))
    }
}

#[cfg(test)]
fn process_text(p: &ProcessReport, mode: Mode) -> String {
    process_text_with(p, mode, None)
}

fn process_text_with(p: &ProcessReport, mode: Mode, series: Option<&Series>) -> String {
    let mut out = String::new();
    let _ = write!(out, "\nprocess {} ({})", p.pid, p.comm);
    if let Some(by) = &p.selected_by {
        let _ = write!(out, ", {}", by.describe());
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "  {:<LABEL$} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "lock",
        match mode {
            Mode::Full => "acquired",
            Mode::Contention => "contended",
        },
        "failed",
        "wait sum",
        "mean",
        "p50",
        "p99",
        "max",
        "hold p50",
        "hold p99"
    );
    out.push_str(&stats_row("write", &p.lock.write));
    out.push_str(&stats_row("read", &p.lock.read));
    if p.lock.downgrade.count > 0 {
        out.push_str(&stats_row("downgrade", &p.lock.downgrade));
    }
    if let Some(own) = &p.profiler {
        let _ = writeln!(
            out,
            "  (not counted above: mmaplock-prof's own {} reads and {} writes of this lock, {:.2}% of its acquisitions)",
            own.read.count,
            own.write.count,
            own.share * 100.0
        );
    }
    out.push_str(&threads::trimmed_text(p));
    out.push_str(&time_share_text(p));
    if let Some(series) = series {
        out.push_str(&over_time::over_time_text(series));
    }
    if !p.lock.causes.is_empty() {
        let _ = writeln!(out, "\n  writes by cause:");
        for c in &p.lock.causes {
            out.push_str(&stats_row(&c.cause, &c.write));
        }
    }
    out.push_str(&roles_text(p));
    if let Some(dsos) = p.dsos.as_ref().filter(|d| !d.is_empty()) {
        let _ = writeln!(out, "\n  sampled writes by code:");
        for d in dsos.iter().take(TOP_THREADS) {
            out.push_str(&stats_row(&short_path(&d.dso), &d.write));
        }
    }
    if let Some(js) = p.js_functions.as_ref().filter(|j| !j.is_empty()) {
        // Shares of all sampled writes (the writes charged to any code).
        let sampled: u64 = p.dsos.iter().flatten().map(|d| d.write.count).sum();
        let _ = writeln!(
            out,
            "\n  sampled writes by JS function:\n  {:<32} {:>9} {:>6} {:>10}  definition",
            "function", "writes", "share", "wait sum"
        );
        for f in js.iter().take(TOP_THREADS) {
            let share = 100.0 * f.writes as f64 / sampled.max(1) as f64;
            let _ = writeln!(
                out,
                "  {:<32} {:>9} {:>5.1}% {:>10}  {}",
                fit(&f.function, 32),
                f.writes,
                share,
                fmt_ns(f.wait_ns_sum),
                f.file
            );
        }
    }
    if let Some(note) = &p.v8_note {
        let _ = writeln!(out, "\n  JavaScript frames unnamed from the heap: {note}");
    }
    if let Some(ends) = &p.stack_ends {
        out.push_str(&stack_ends::stack_ends_text(
            ends,
            p.stack_cuts.as_deref().unwrap_or_default(),
        ));
    }
    if let Some(hint) = &p.js_hint {
        let _ = writeln!(out, "\n  {hint}");
    }
    if let Some(stacks) = p.stacks.as_ref().filter(|s| !s.is_empty()) {
        let _ = writeln!(out, "\n  sampled write stacks that waited longest:");
        for s in stacks.iter().take(3) {
            let _ = writeln!(
                out,
                "    {} writes, {} waited:",
                s.count,
                fmt_ns(s.wait_ns_sum)
            );
            for f in s.frames.iter().take(8) {
                let _ = writeln!(out, "      {f}");
            }
        }
    }
    out.push_str(&blockers_text(p));
    out.push_str(&waits::holders_text(p));
    let _ = writeln!(
        out,
        "\n  top threads by write wait:\n  {:>8} {:<9} {:<15} {:>8} {:>10} {:>9} {:>9} {:>10}",
        "tid", "role", "comm", "writes", "wait sum", "wait p99", "reads", "wait sum"
    );
    for t in p.threads.iter().take(TOP_THREADS) {
        let (writes, wait, p99, reads, read_wait) = row_figures(&t.lock.write, &t.lock.read);
        let _ = writeln!(
            out,
            "  {:>8} {:<9} {:<15} {writes:>8} {wait:>10} {p99:>9} {reads:>9} {read_wait:>10}",
            t.tid,
            t.role.as_str(),
            fit(&t.comm, 15),
        );
    }
    if p.threads.len() > TOP_THREADS {
        let _ = writeln!(
            out,
            "  ... and {} listed",
            count_of(
                (p.threads.len() - TOP_THREADS) as u64,
                "more thread",
                "more threads"
            )
        );
    }
    out.push_str(&threads::groups_text(p));
    let hists = histogram_lines(&[&p.lock.write.wait_ns, &p.lock.read.wait_ns]);
    if hists.iter().any(|h| !h.is_empty()) {
        let width = 8 + 1 + BAR_WIDTH + 1 + 8;
        let mut cols = vec![
            vec![format!("{:<width$}", "write wait (log2 buckets)")],
            vec!["read wait (log2 buckets)".to_string()],
        ];
        for (c, h) in cols.iter_mut().zip(hists) {
            c.extend(h);
        }
        out.push('\n');
        out.push_str(&side_by_side(&cols, width));
    }
    let holds = [&p.lock.write.hold_ns, &p.lock.read.hold_ns];
    let hists = match holds {
        [Some(w), Some(r)] => histogram_lines(&[w, r]),
        _ => Vec::new(),
    };
    if hists.iter().any(|h| !h.is_empty()) {
        let width = 8 + 1 + BAR_WIDTH + 1 + 8;
        let mut cols = vec![
            vec!["write hold (log2 buckets)".to_string()],
            vec!["read hold (log2 buckets)".to_string()],
        ];
        for (c, h) in cols.iter_mut().zip(hists) {
            c.extend(h);
        }
        out.push('\n');
        out.push_str(&side_by_side(&cols, width));
    }
    out
}
