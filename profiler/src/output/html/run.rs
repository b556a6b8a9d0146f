//! The page of one run: per process, its numbers, wait and hold histograms, wait over time
//! (from the interval lines), writes and wait by role and by cause, who made whom wait, the
//! code that asked for memory and the flame graph of the sampled writes.

use std::fmt::Write as _;

use super::{
    RunLines,
    flame::flame_graph,
    kpi,
    lines::{Series, seconds_of},
    others::{PAGE_PROCESSES, minor_section, others_section},
    page,
    svg::{Unit, bars, esc, histogram, lines},
    tables::{blockers_table, code_tables, groups_table, table},
};
use crate::output::{Output, findings::Finding, report::ProcessReport, text::fmt_ns};

/// Stacks a flame graph draws at most (the most sampled).
const FLAME_STACKS: usize = 2000;

/// A titled chart, laid out two to a row.
fn panel(out: &mut String, title: &str, chart: &str) {
    let _ = write!(
        out,
        r#"<div class="panel"><h3>{}</h3>{chart}</div>"#,
        esc(title)
    );
}

/// Per point of the process's series (an interval line, or past a thousand a run of them):
/// seconds from the start, then per line write wait and read wait, mean write wait and mean
/// read wait, writes.
fn over_time(series: Option<&Series>, t0: Option<f64>) -> [Vec<f64>; 6] {
    let mut v: [Vec<f64>; 6] = Default::default();
    let (Some(series), Some(t0)) = (series, t0) else {
        return v;
    };
    let mean = |wait: u64, n: u64| if n == 0 { 0.0 } else { wait as f64 / n as f64 };
    for p in series.points() {
        let lines = f64::from(p.lines);
        v[0].push(p.end_s - t0);
        v[1].push(p.wait_ns as f64 / lines);
        v[2].push(p.read_wait_ns as f64 / lines);
        v[3].push(mean(p.wait_ns, p.writes));
        v[4].push(mean(p.read_wait_ns, p.reads));
        v[5].push(p.writes as f64 / lines);
    }
    v
}

/// One process's section of a run page.
fn process_section(p: &ProcessReport, series: Option<&Series>, t0: Option<f64>) -> String {
    let mut out = String::new();
    let (pid, comm) = (p.pid, p.comm.as_str());
    let _ = write!(
        out,
        r#"<section class="process" data-pid="{pid}"><h2>{} <small>pid {pid}</small></h2><div class="kpis">"#,
        esc(comm)
    );
    let (w, r) = (&p.lock.write, &p.lock.read);
    kpi(&mut out, "write acquisitions", &w.count.to_string());
    kpi(&mut out, "total write wait", &fmt_ns(w.wait_ns.sum));
    kpi(&mut out, "mean write wait", &fmt_ns(w.wait_ns.mean as u64));
    kpi(&mut out, "p99 write wait", &fmt_ns(w.wait_ns.p99));
    kpi(&mut out, "read acquisitions", &r.count.to_string());
    kpi(&mut out, "total read wait", &fmt_ns(r.wait_ns.sum));
    if let Some(b) = p.blocked_wait_ns {
        kpi(&mut out, "wait charged to blockers", &fmt_ns(b));
    }
    if let Some(share) = &p.time_share {
        kpi(
            &mut out,
            "of its threads' time waiting",
            &crate::output::text::fmt_share(share.wall),
        );
    }
    out.push_str("</div>");
    let trimmed = crate::output::text::trimmed_text(p);
    if !trimmed.is_empty() {
        let _ = write!(
            out,
            r#"<p class="note trimmed">{}</p>"#,
            esc(trimmed.trim().trim_start_matches('(').trim_end_matches(')'))
        );
    }
    out.push_str(r#"<div class="grid">"#);
    panel(
        &mut out,
        "Wait per acquisition (log2 buckets)",
        &histogram(
            "wait-histogram",
            &[("write", &w.wait_ns.buckets), ("read", &r.wait_ns.buckets)],
        ),
    );
    // (Contention mode measures no hold: the page says so at its top.)
    if let (Some(wh), Some(rh)) = (&w.hold_ns, &r.hold_ns) {
        panel(
            &mut out,
            "Hold per acquisition (log2 buckets)",
            &histogram(
                "hold-histogram",
                &[("write", &wh.buckets), ("read", &rh.buckets)],
            ),
        );
    }
    // The three over time in a row of their own: reads beside writes, as they wait too.
    out.push_str(r#"</div><div class="grid">"#);
    let [xs, wait, read_wait, mean, read_mean, count] = over_time(series, t0);
    for (title, name, drawn, unit) in [
        (
            "Wait over time",
            "wait-over-time",
            vec![
                ("write wait per interval", wait),
                ("read wait per interval", read_wait),
            ],
            Unit::Ns,
        ),
        (
            "Mean wait over time",
            "mean-wait-over-time",
            vec![
                ("mean write wait per interval", mean),
                ("mean read wait per interval", read_mean),
            ],
            Unit::Ns,
        ),
        (
            "Writes over time",
            "writes-over-time",
            vec![("writes per interval", count)],
            Unit::Count,
        ),
    ] {
        panel(&mut out, title, &lines(name, &xs, &drawn, unit));
    }
    out.push_str("</div>");
    // By role (threads pooled) and by cause: writes and their wait.
    // By role, the reads' wait beside the writes': a role's threads may wait most on reads.
    let roles = crate::output::report::role_totals(p);
    let labels: Vec<String> = roles.iter().map(|r| r.role.as_str().to_string()).collect();
    out.push_str(r#"<div class="grid">"#);
    panel(
        &mut out,
        "Writes by thread role",
        &bars(
            "writes-by-role",
            &labels,
            &[("writes", roles.iter().map(|r| r.writes as f64).collect())],
            Unit::Count,
        ),
    );
    panel(
        &mut out,
        "Wait by thread role",
        &bars(
            "wait-by-role",
            &labels,
            &[
                (
                    "write wait",
                    roles.iter().map(|r| r.write_wait_ns as f64).collect(),
                ),
                (
                    "read wait",
                    roles.iter().map(|r| r.read_wait_ns as f64).collect(),
                ),
            ],
            Unit::Ns,
        ),
    );
    let causes = &p.lock.causes;
    let labels: Vec<String> = causes.iter().map(|c| c.cause.to_string()).collect();
    for (name, heading, series, values, unit) in [
        (
            "writes-by-cause",
            "Writes by cause",
            "writes",
            causes.iter().map(|c| c.write.count as f64).collect(),
            Unit::Count,
        ),
        (
            "wait-by-cause",
            "Write wait by cause",
            "write wait",
            causes.iter().map(|c| c.write.wait_ns.sum as f64).collect(),
            Unit::Ns,
        ),
    ] {
        panel(
            &mut out,
            heading,
            &bars(name, &labels, &[(series, values)], unit),
        );
    }
    out.push_str("</div>");
    // Who made whom wait, by role and by holder, side by side.
    out.push_str(r#"<div class="grid">"#);
    if let Some(roles) = p.blocked_by_role.as_ref().filter(|r| !r.is_empty()) {
        out.push_str("<div class=\"panel\">");
        table(
            &mut out,
            "Who made whom wait",
            &[
                "waiter",
                "holder",
                "its hold",
                "wait",
                "write wait",
                "read wait",
            ],
            crate::output::blockers::shown_rows(roles, 12)
                .into_iter()
                .map(|r| {
                    [
                        r.waiter_role.as_str().to_string(),
                        r.holder_role.as_str().to_string(),
                        esc(&r.cause),
                        fmt_ns(r.wait_ns),
                        fmt_ns(r.write_wait_ns),
                        fmt_ns(r.wait_ns - r.write_wait_ns),
                    ]
                }),
        );
        out.push_str("<p class=\"note\">Largest wait (write and read) first; every waiting role has its largest row here.</p></div>");
    }
    blockers_table(&mut out, p);
    out.push_str(&super::verdict::time_share_table(p));
    groups_table(&mut out, p);
    out.push_str("</div>");
    code_tables(&mut out, p);
    let flame = p.flame.as_deref().unwrap_or_default();
    // The most sampled stacks (the flame is sorted so): a graph of thousands more adds
    // megabytes to the page and frames too narrow to see.
    let (drawn, rest) = flame.split_at(flame.len().min(FLAME_STACKS));
    if let Some(frame) = flame_graph(&format!("Sampled writes of {comm} ({pid})"), drawn) {
        out.push_str("<h3>Flame graph of the sampled writes</h3>");
        out.push_str(&frame);
        if !rest.is_empty() {
            let _ = write!(
                out,
                r#"<p class="note">{} less sampled stacks ({} sampled writes) not drawn.</p>"#,
                rest.len(),
                rest.iter().map(|f| f.count).sum::<u64>()
            );
        }
    }
    out.push_str("</section>");
    out
}

/// `report --html`: the page of a run read from its file, with these findings first.
pub struct RunPage<'a> {
    pub name: &'a str,
    pub findings: &'a [Finding],
    /// Every process drawn in full (`--all-processes`).
    pub all: bool,
}

impl Output<RunLines> for RunPage<'_> {
    fn emit(&mut self, run: &RunLines, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        out.write_all(run_page_with_findings(self.name, run, self.findings, self.all).as_bytes())
    }
}

/// The page of a run: per process (the longest wait first), from its last summary, and
/// its interval lines for the charts over time; first, the findings of what it draws (as
/// the summaries carry them, else recomputed).
pub fn run_page(name: &str, run: &RunLines) -> String {
    run_page_with_findings(name, run, &run.findings(None), false)
}

/// The page of a run, with these findings first (`report` recomputes them, with a study):
/// the processes that waited longest in full, the others in a row each (all in full with
/// `all`, or when the summary says so), and the processes the summary grouped.
fn run_page_with_findings(name: &str, run: &RunLines, findings: &[Finding], all: bool) -> String {
    if let Some(study) = &run.study {
        return super::study::study_page(study);
    }
    let mut body = String::new();
    // A demo's file has its runs' summaries only.
    let summary = run.summary.as_ref().or(run.demo.last());
    let t0 = summary
        .and_then(|s| seconds_of(&s.start))
        .or_else(|| run.first_start.as_deref().and_then(seconds_of));
    // A demo line holds two runs (Worker threads, then processes): both are shown.
    let sources = run.shown();
    if let Some(s) = sources.iter().find(|s| s.summed_lines.is_some()) {
        let note = crate::output::text::partial_note(
            s.summed_lines.unwrap_or(0),
            s.duration_s.unwrap_or(0.0),
        );
        let _ = write!(body, r#"<p class="note partial">{}.</p>"#, esc(&note));
    }
    // What the numbers are, before any of them: contention mode's are not full mode's.
    if let Some(note) = sources
        .iter()
        .map(|s| s.mode)
        .find_map(crate::output::text::mode_note)
    {
        let _ = write!(body, r#"<p class="note mode">{}.</p>"#, esc(note));
    }
    let mut procs: Vec<&ProcessReport> = sources.iter().flat_map(|s| &s.processes).collect();
    // The longest wait (write and read) first, as the text and the findings.
    procs.sort_by_key(|p| std::cmp::Reverse(p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum));
    let all = all || sources.iter().any(|s| s.show_all);
    let rest = procs.split_off(if all {
        procs.len()
    } else {
        PAGE_PROCESSES.min(procs.len())
    });
    // The verdict first: what was found and what to change, and what was grouped.
    if let Some(t) = summary.and_then(|s| s.trigger.as_deref()) {
        body.push_str(&super::verdict::trigger_section(t));
    }
    body.push_str(&super::verdict::findings_section(findings));
    for m in sources.iter().filter_map(|s| s.minor_processes.as_ref()) {
        body.push_str(&minor_section(m));
    }
    if procs.is_empty() {
        body.push_str(r#"<p class="note">No mmap_lock activity by the selected processes.</p>"#);
    }
    for p in procs {
        body.push_str(&process_section(p, run.series(p.pid, p.start_ticks), t0));
    }
    body.push_str(&others_section(&rest));
    if let Some(s) = summary {
        let lost = s.lost.events.saturating_add(s.lost.map_full);
        let _ = write!(
            body,
            r#"<p class="note">Lost acquisitions: {lost}. Report format: docs/report-format.md.</p>"#
        );
    }
    let sub = match (summary, &run.first_start, &run.last_end) {
        (Some(s), _, _) => format!(
            "{} to {} ({} s), {} interval lines",
            s.start,
            s.end,
            s.duration_s.map_or("?".into(), |d| format!("{d:?}")),
            run.intervals
        ),
        (None, Some(a), Some(b)) => {
            format!("{a} to {b}, {} interval lines, no summary", run.intervals)
        }
        _ => String::new(),
    };
    page(&format!("mmaplock-prof: {name}"), &sub, &body)
}
