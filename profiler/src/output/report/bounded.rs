//! A summary of a thousand short processes, as the profiler writes it (findings, then the
//! processes grouped): its JSON, its text and its page bounded by what matters, and its
//! counts still adding up.

use crate::output::{
    findings::{self, group_minor},
    fixtures::{process, summary},
    html::{RunLines, run_page},
    report::{ProcessReport, Report},
    text::to_text,
};

const MB: usize = 1 << 20;

/// 1,000 processes of `manyling` that waited a few microseconds, and 3 that waited 50 ms.
fn thousand() -> Report {
    let mut procs: Vec<ProcessReport> = (1..=1000)
        .map(|pid| process(pid, "manyling", 1000 + u64::from(pid), true))
        .collect();
    for pid in 2001..=2003 {
        procs.push(process(pid, "node", 50_000_000, true));
    }
    summary(procs)
}

/// Processes, writes, reads and wait of the listed processes plus the grouped ones.
fn totals(r: &Report) -> (u64, u64, u64, u64) {
    let m = r.minor_processes.clone().unwrap_or_default().totals;
    let listed = |f: fn(&ProcessReport) -> u64| r.processes.iter().map(f).sum::<u64>();
    (
        r.processes.len() as u64 + m.processes,
        listed(|p| p.lock.write.count) + m.writes,
        listed(|p| p.lock.read.count) + m.reads,
        listed(|p| p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum) + m.wait_ns,
    )
}

#[test]
fn a_thousand_processes_are_a_bounded_summary_text_and_page() {
    let all = thousand();
    let unbounded = serde_json::to_string(&all).unwrap().len();
    let mut s = all.clone();
    findings::attach(&mut s, None);
    group_minor(&mut s);
    // The JSON: the 3 that waited materially and the 10 others that waited longest; the
    // rest grouped, every count kept.
    assert_eq!(totals(&s), totals(&all));
    assert_eq!(s.processes.len(), 13);
    let m = s.minor_processes.as_ref().unwrap();
    assert_eq!((m.totals.processes, m.by_comm.len()), (990, 1));
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.len() <= 5 * MB, "{} bytes", json.len());
    assert!(
        json.len() * 20 < unbounded,
        "{} of {unbounded} bytes",
        json.len()
    );
    // The text: the 10 that waited longest in full, a line for the 3 others, one for the
    // grouped, and how to see them all.
    let text = to_text(&s);
    let sections = text.lines().filter(|l| l.starts_with("process ")).count();
    assert_eq!(sections, 10, "{text}");
    assert!(
        text.contains("\nprocess 2001 (node)\n"),
        "the material first"
    );
    assert!(
        text.contains("990 processes (manyling) had at most 10 writes each: none waited materially. Together: 9900 writes, "),
        "{text}"
    );
    assert!(
        text.contains("\n3 more processes (manyling) not shown, each waited less: 30 writes"),
        "{text}"
    );
    assert!(text.contains("--all-processes shows every one"), "{text}");
    assert!(text.lines().count() < 600, "{} lines", text.lines().count());
    // Asked for all: every listed process in full.
    s.show_all = true;
    let every = to_text(&s);
    assert_eq!(
        every.lines().filter(|l| l.starts_with("process ")).count(),
        13
    );
    s.show_all = false;
    // The page: 10 processes drawn, the others a row each, the grouped their line.
    let mut run = RunLines::default();
    run.add_report(&s);
    let page = run_page("run.json", &run);
    assert!(page.len() <= 5 * MB, "{} bytes", page.len());
    assert_eq!(
        page.matches("<section class=\"process\" data-pid=").count(),
        10
    );
    assert_eq!(page.matches("data-table=\"other-processes\"").count(), 1);
    assert!(page.contains("none waited materially"));
    assert!(page.contains("data-table=\"minor-processes\""));
}

/// A file of an earlier build lists all thousand: its text and page are bounded all the
/// same, and say how many they leave out.
#[test]
fn a_thousand_processes_of_an_older_file_are_bounded_too() {
    let s = thousand();
    let text = to_text(&s);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("process ")).count(),
        10
    );
    assert!(
        text.contains("\n993 more processes (manyling) not shown, each waited less"),
        "{text}"
    );
    let mut run = RunLines::default();
    run.add_report(&s);
    let page = run_page("run.json", &run);
    assert_eq!(
        page.matches("<section class=\"process\" data-pid=").count(),
        10
    );
    assert!(page.len() <= 5 * MB, "{} bytes", page.len());
}

/// An interval block of a thousand processes: the ten that waited longest, one line more.
#[test]
fn an_interval_of_a_thousand_processes_is_twelve_lines() {
    let s = Report {
        kind: super::Kind::Interval,
        interval_s: Some(1.0),
        duration_s: None,
        ..thousand()
    };
    let text = to_text(&s);
    assert_eq!(text.lines().count(), 12, "{text}");
    assert!(text.lines().nth(1).unwrap().contains("2001 node"), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("  993 more processes (manyling) not shown"),
        "{text}"
    );
}

/// Short processes whose waits are each small but add up: the line says they did together.
#[test]
fn many_small_waits_that_add_up_are_said_to() {
    let ms = 1_000_000;
    let procs = (1..=100)
        .map(|pid| {
            let mut p = process(pid, "sh", 5 * ms - 10, false);
            p.time_share = Some(crate::output::fixtures::time_share(5 * ms, 20 * ms, 2));
            p
        })
        .collect();
    let mut s = summary(procs);
    group_minor(&mut s);
    let m = s.minor_processes.as_ref().unwrap();
    assert_eq!((m.totals.processes, m.totals.alive_ns), (90, 90 * 20 * ms));
    let text = to_text(&s);
    assert!(
        text.contains("90 processes (sh) had at most 10 writes each: none waited materially alone, but together they did. Together: 900 writes, 450.00ms of wait, 25.0% of their threads' time"),
        "{text}"
    );
}
