//! The pages from synthetic runs: what is parsed, what is drawn, and that it is drawn the same
//! way every time.

use serde_json::{Value, json};

use super::{InputError, RunLines, run_page, study::study_page};

fn stats(count: u64, wait: u64, buckets: &[(u64, u64)]) -> Value {
    json!({"count": count, "failed_trylocks": 0,
        "wait_ns": {"sum": wait, "max": wait, "mean": wait as f64 / count.max(1) as f64, "p99": wait,
            "buckets": buckets.iter().map(|b| [b.0, b.1]).collect::<Vec<_>>()},
        "hold_ns": {"sum": 0, "max": 0, "buckets": [[512, count]]}})
}

fn process(pid: u64, comm: &str, wait: u64, flame: bool) -> Value {
    let mut p = json!({"pid": pid, "comm": comm, "start_ticks": 5,
        "write": stats(10, wait, &[(1024, 6), (8192, 4)]), "read": stats(2, 10, &[(64, 2)]),
        "causes": [{"cause": "mprotect", "write": stats(7, wait, &[])},
                   {"cause": "munmap", "write": stats(3, 0, &[])}],
        "threads": [{"tid": pid, "role": "main", "comm": comm, "write": stats(4, 1, &[])},
                    {"tid": pid + 1, "role": "worker", "comm": "w", "write": stats(6, wait - 1, &[])}]});
    if flame {
        p["flame"] = json!([{"stack": "main;alloc;mmap", "count": 5},
                            {"stack": "main;\"quoted\" <fn>;munmap", "count": 2}]);
    }
    p
}

fn ndjson(lines: &[Value]) -> String {
    lines.iter().map(|l| l.to_string() + "\n").collect()
}

fn interval(end: &str, wait: u64) -> Value {
    json!({"type": "interval", "start": "2026-01-01T00:00:00.000Z", "end": end,
           "processes": [process(1, "node", wait, false)]})
}

fn summary(processes: Vec<Value>) -> Value {
    json!({"type": "summary", "start": "2026-01-01T00:00:00.000Z",
           "end": "2026-01-01T00:00:02.000Z", "duration_s": 2.0,
           "processes": processes, "lost": {"events": 0, "map_full": 0}})
}

fn charts(page: &str, name: &str) -> usize {
    page.matches(&format!("data-chart=\"{name}\"")).count()
}

#[test]
fn a_bad_line_is_named_by_its_number_and_an_empty_file_is_refused() {
    // A line, a blank line, a cut line: the third.
    let text = format!("{}\n{{\"type\":", ndjson(&[interval("x", 1)]));
    match RunLines::parse("run.json", &text) {
        Err(InputError::NotJson(name, 3, _)) => assert_eq!(name, "run.json"),
        other => panic!("{other:?}"),
    }
    let e = RunLines::parse("x.json", "{\"a\":1}\n").unwrap_err();
    assert!(matches!(e, InputError::Empty(_)));
    assert!(
        e.to_string()
            .starts_with("x.json: no mmaplock-prof report lines")
    );
}

#[test]
fn several_runs_and_demo_lines_each_give_a_summary() {
    let s = summary(vec![process(1, "node", 100, false)]);
    let demo = json!({"type": "demo", "runs": [{"report": s}, {"report": s}]});
    let r = RunLines::parse(
        "f",
        &ndjson(&[interval("x", 1), s.clone(), s.clone(), demo]),
    )
    .unwrap();
    assert_eq!(
        (r.intervals.len(), r.summaries.len(), r.other.len()),
        (1, 4, 1)
    );
    assert!(r.study().is_none());
}

#[test]
fn the_run_page_draws_every_chart_per_process_largest_wait_first() {
    let run = RunLines::parse(
        "run.json",
        &ndjson(&[
            interval("2026-01-01T00:00:01.000Z", 40),
            interval("2026-01-01T00:00:02.000Z", 60),
            summary(vec![
                process(1, "small", 100, false),
                process(2, "big", 5000, true),
            ]),
        ]),
    )
    .unwrap();
    let page = run_page("run.json", &run);
    for chart in [
        "wait-histogram",
        "hold-histogram",
        "writes-by-role",
        "wait-by-role",
        "writes-by-cause",
        "wait-by-cause",
        "write-wait-over-time",
        "mean-write-wait-over-time",
        "writes-over-time",
    ] {
        assert_eq!(charts(&page, chart), 2, "{chart}");
    }
    assert!(page.find("data-pid=\"2\"").unwrap() < page.find("data-pid=\"1\"").unwrap());
    // Two roles and two causes: a bar each.
    let section = &page[page.find("data-pid=\"1\"").unwrap()..];
    let roles = &section[section.find("data-chart=\"writes-by-role\"").unwrap()..];
    assert_eq!(
        roles[..roles.find("</svg>").unwrap()]
            .matches("class=\"bar\"")
            .count(),
        2
    );
    // The over-time lines exist only for the process in the interval lines (pid 1).
    assert_eq!(page.matches("class=\"line\"").count(), 3);
    // One flame graph, for the process with stacks, its document escaped into the attribute.
    assert_eq!(charts(&page, "flame-graph"), 1);
    let frame = &page[page.find("<iframe").unwrap()..];
    let frame = &frame[..frame.find("</iframe>").unwrap()];
    let srcdoc = &frame[frame.find("srcdoc=\"").unwrap() + 8..];
    assert_eq!(
        srcdoc.find('"'),
        Some(srcdoc.len() - 2),
        "one attribute, closed last"
    );
    assert!(srcdoc.contains("&lt;svg") && srcdoc.contains("alloc"));
    // Nothing outside the page, and the same bytes every time.
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
    assert_eq!(page, run_page("run.json", &run));
}

#[test]
fn a_run_without_summary_is_summed_from_its_interval_lines() {
    let run = RunLines::parse(
        "cut.json",
        &ndjson(&[
            interval("2026-01-01T00:00:01.000Z", 40),
            interval("2026-01-01T00:00:02.000Z", 60),
        ]),
    )
    .unwrap();
    let page = run_page("cut.json", &run);
    assert!(page.contains("No summary line"));
    // 10 writes in each line: 20 in all, and 100 ns of wait.
    assert!(
        page.contains("<b>20</b><span>write acquisitions</span>"),
        "{page}"
    );
    assert!(page.contains("<b>100ns</b><span>total write wait</span>"));
    assert_eq!(charts(&page, "wait-histogram"), 1);
}

fn study_run(scenario: &str, mode: &str, kib: f64, k: u64, ops: f64) -> Value {
    json!({"scenario": scenario, "mode": mode, "k": k, "file_kib": kib, "ops_per_s": ops,
           "write": stats(100, 5000, &[(1024, 90), (65536, 10)]), "report": summary(vec![])})
}

#[test]
fn the_study_page_draws_scenarios_beside_each_other_per_file_size_and_k() {
    // Runs not grouped by scenario: each scenario is still drawn once per chart.
    let study = json!({"type": "study", "schema_version": 1, "machine": {}, "runs": [
        study_run("default", "workers", 64.0, 2, 1000.0),
        study_run("reuse", "workers", 64.0, 2, 3000.0),
        study_run("default", "processes", 64.0, 2, 1500.0),
        study_run("reuse", "processes", 64.0, 2, 2500.0),
        study_run("default", "workers", 0.125, 1, 9000.0),
        // A second run of the cell: the bars draw the mean.
        study_run("reuse", "workers", 64.0, 2, 3400.0),
    ], "repeat": 2,
    "ranking": [{"file_kib": 64.0, "scenario": "reuse <best>", "throughput_ratio": 3.2, "writes_ratio": 0.2,
                 "throughput": {"mean": 3.2, "min": 3.0, "max": 3.4, "runs": 2}, "throughput_verdict": "changed",
                 "writes": {"mean": 0.2, "min": 0.2, "max": 0.2, "runs": 2}, "writes_verdict": "changed"},
                {"file_kib": 64.0, "scenario": "default", "throughput_ratio": 1.0, "writes_ratio": 1.0}],
    "claims": [{"scenario": "arena-1", "claim": "a marginal effect", "verdict": "within noise",
                "throughput": {"mean": 1.1, "min": 0.95, "max": 1.3, "runs": 2},
                "writes": {"mean": 0.5, "min": 0.4, "max": 0.6, "runs": 2}}]});
    let page = study_page(&study);
    assert_eq!(charts(&page, "throughput-64000-2"), 1);
    assert_eq!(charts(&page, "throughput-125-1"), 1);
    let chart = &page[page.find("data-chart=\"throughput-64000-2\"").unwrap()..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    // Two scenarios x (workers, processes).
    assert_eq!(chart.matches("class=\"bar\"").count(), 4);
    assert_eq!(chart.matches(">reuse</text>").count(), 1);
    assert!(
        chart.contains(">3200/s</text>"),
        "the mean of 3000 and 3400: {chart}"
    );
    assert_eq!(charts(&page, "wait-histogram-reuse-64000-2"), 1);
    assert!(page.contains("128 B files, k = 1") && page.contains("64 KiB files, k = 2"));
    // The ranking and the claims are tables, with the runs' spread and the verdicts.
    assert!(page.contains("<td>reuse &lt;best&gt;</td><td>3.20x <small>(3.00-3.40)</small></td><td class=\"good\">changed</td>"), "{page}");
    assert!(page.contains("<td>default</td><td>1.00x</td>"));
    assert!(page.contains("<td>a marginal effect</td><td>1.10x <small>(0.95-1.30)</small></td><td>0.50x <small>(0.40-0.60)</small></td><td class=\"within\">within noise</td>"));
    assert!(!page.contains("<pre>"));
    // `report results.json --html` finds the study line.
    let run = RunLines::parse("results.json", &study.to_string()).unwrap();
    assert_eq!(run_page("results.json", &run), page);
}

#[test]
fn the_compare_page_pairs_before_and_after_per_role_and_cause() {
    let side = |waits: &[u64]| RunLines {
        summaries: waits
            .iter()
            .map(|&w| summary(vec![process(1, "node", w, false)]))
            .collect(),
        ..RunLines::default()
    };
    let c =
        crate::output::compare::compare(("b", &side(&[900, 1000])), ("a", &side(&[90, 100])), None);
    let page = super::compare::compare_page(&c);
    for chart in [
        "writes-by-role",
        "wait-by-role",
        "writes-by-cause",
        "wait-by-cause",
    ] {
        assert_eq!(charts(&page, chart), 1, "{chart}");
    }
    // Two roles, a before and an after bar each.
    let roles = &page[page.find("data-chart=\"wait-by-role\"").unwrap()..];
    assert_eq!(
        roles[..roles.find("</svg>").unwrap()]
            .matches("class=\"bar\"")
            .count(),
        4
    );
    // Wait cut tenfold beyond the runs' ranges: judged a change, and a good one; the range
    // of each side is shown.
    assert!(page.contains("<td class=\"good\">0.10x</td>"), "{page}");
    assert!(page.contains("<small>(900ns–1.0us)</small>"), "{page}");
    // 10 writes in every run: no range to show, within noise; the wait changed.
    assert!(!page.contains("(10–10)"));
    assert!(
        page.contains("<td>within noise</td><td>changed</td></tr>"),
        "{page}"
    );
    assert!(!page.contains("cannot be judged"));
}

#[test]
fn the_findings_come_first_on_a_run_page_with_what_to_change() {
    // Worker threads whose writes are mprotects (arena growth), 400 ms of wait in 4 s alive.
    let mut p = process(7, "node", 400_000_000, false);
    p["threads"][1]["write"] = stats(2000, 400_000_000, &[(1 << 20, 2000)]);
    p["threads"][1]["causes"] =
        json!([{"cause": "mprotect", "write": stats(2000, 400_000_000, &[])}]);
    p["write"] = stats(2004, 400_000_000, &[(1 << 20, 2004)]);
    p["time_share_by_role"] = json!([
        {"role": "worker", "wait_ns": 400_000_000u64, "alive_ns": 4_000_000_000u64, "wall": 0.1, "threads": 1},
        {"role": "main", "wait_ns": 1, "alive_ns": 4_000_000_000u64, "wall": 0.0, "threads": 1}]);
    p["time_share"] = json!({"wait_ns": 400_000_001u64, "alive_ns": 8_000_000_000u64, "wall": 0.05, "threads": 2});
    let run = RunLines::parse("run.json", &ndjson(&[summary(vec![p])])).unwrap();
    let page = run_page("run.json", &run);
    let finding = page
        .find("data-finding=\"arena-growth\"")
        .expect("the finding");
    assert!(
        finding < page.find("data-pid=\"7\"><h2>").unwrap(),
        "findings first"
    );
    assert!(page.contains("<span class=\"sev\">high</span>"));
    assert!(page.contains("MALLOC_ARENA_MAX=2"));
    // The process's time share, as a KPI and per role.
    assert!(
        page.contains("<b>5.0%</b><span>of its threads&#39; time waiting</span>"),
        "{page}"
    );
    assert!(page.contains("data-table=\"time-share\""));
    // A summary that carries its findings is shown as it is (`report` recomputes them).
    let mut s = summary(vec![process(8, "node", 10, false)]);
    s["findings"] = json!([{"id": "long-holds", "pid": 8, "comm": "node", "severity": "medium",
        "title": "thread 9 holds it", "wait_ns": 5, "share_of_wait": 0.5, "time_share": 0.03,
        "evidence": {"facts": ["a fact"]}, "advice": ["do this"], "source": "docs/findings.md#long-holds"}]);
    let page = run_page("x", &RunLines::parse("x", &ndjson(&[s])).unwrap());
    assert!(page.contains("data-finding=\"long-holds\"") && page.contains("<li>a fact</li>"));
}
