//! The pages from synthetic runs: what is parsed, what is drawn, and that it is drawn the same
//! way every time.

use super::{RunLines, run_page, study::study_page_of};
use crate::output::{
    compare::{Runs, compare},
    fixtures::{interval, ndjson, process, stats, summary},
    reading::{InputError, Keep, Line},
    report::Report,
};

fn charts(page: &str, name: &str) -> usize {
    page.matches(&format!("data-chart=\"{name}\"")).count()
}

#[test]
fn a_bad_line_is_named_by_its_number_and_an_empty_file_is_refused() {
    // A line, a blank line, a cut line: the third.
    let text = format!("{}\n{{\"type\":", ndjson(&[&interval("x", 1)]));
    match RunLines::parse("run.json", &text) {
        Err(InputError::Line {
            file,
            line: 3,
            what,
        }) => {
            assert_eq!(file, "run.json");
            assert!(what.starts_with("not JSON: EOF"), "{what}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }
    let Err(e) = RunLines::parse("x.json", "{\"a\":1}\n") else {
        panic!("accepted")
    };
    assert!(matches!(e, InputError::Empty(_)));
    assert!(
        e.to_string()
            .starts_with("x.json: no mmaplock-prof report lines")
    );
}

#[test]
fn several_runs_and_demo_lines_each_give_a_summary() {
    let s = summary(vec![process(1, "node", 100, false)]);
    let demo = format!(
        "{{\"type\":\"demo\",\"schema_version\":1,\"runs\":[{{\"report\":{j}}},{{\"report\":{j}}}]}}\n",
        j = serde_json::to_string(&s).unwrap()
    );
    let text = ndjson(&[&interval("2026-01-01T00:00:01.000Z", 1), &s, &s]) + &demo;
    let r = RunLines::parse("f", &text).unwrap();
    assert_eq!((r.intervals, r.demo.len()), (1, 2));
    assert!(r.summary.is_some() && r.study.is_none());
    // compare takes each summary as a run, and each run of a demo line.
    let runs = Runs::parse("f", &text).unwrap();
    assert_eq!(
        compare(("f", &runs), ("f", &runs), None)
            .unwrap()
            .before
            .runs,
        4
    );
}

/// A run of two interval lines (the first second's 40 ns of wait, the second's 60), then
/// `rest`.
fn two_seconds_then(rest: &[&Report]) -> RunLines {
    let mut lines = vec![
        interval("2026-01-01T00:00:01.000Z", 40),
        interval("2026-01-01T00:00:02.000Z", 60),
    ];
    lines.extend(rest.iter().map(|r| (*r).clone()));
    RunLines::parse("run.json", &ndjson(&lines.iter().collect::<Vec<_>>())).unwrap()
}

#[test]
fn the_run_page_draws_every_chart_per_process_largest_wait_first() {
    let run = two_seconds_then(&[&summary(vec![
        process(1, "small", 100, false),
        process(2, "big", 5000, true),
    ])]);
    let page = run_page("run.json", &run);
    for chart in [
        "wait-histogram",
        "hold-histogram",
        "writes-by-role",
        "wait-by-role",
        "writes-by-cause",
        "wait-by-cause",
        "wait-over-time",
        "mean-wait-over-time",
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
    // The over-time lines exist only for the process in the interval lines (pid 1): write
    // and read wait, their means, writes.
    assert_eq!(page.matches("class=\"line\"").count(), 5);
    // Wait by role: the reads' beside the writes', a bar per role and side.
    let wait = &section[section.find("data-chart=\"wait-by-role\"").unwrap()..];
    let wait = &wait[..wait.find("</svg>").unwrap()];
    assert!(
        wait.contains(">read wait<") && wait.contains(">write wait<"),
        "{wait}"
    );
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
    let run = two_seconds_then(&[]);
    let page = run_page("run.json", &run);
    assert!(
        page.contains(
            "no summary yet: 2 interval lines over 2.0 s; the run is still going or was cut"
        ),
        "{page}"
    );
    // The text too, with the lines' span (not 0.0 s) and their sums.
    let text = crate::output::text::to_text(&run.shown()[0]);
    assert!(
        text.starts_with("═══ mmaplock-prof summary: 2026-01-01T00:00:00.000Z to 2026-01-01T00:00:02.000Z (2.0s) ═══\nno summary yet: 2 interval lines over 2.0 s;"),
        "{text}"
    );
    assert!(text.contains("  write             20 "), "{text}");
    // 10 writes in each line: 20 in all, and 100 ns of wait.
    assert!(
        page.contains("<b>20</b><span>write acquisitions</span>"),
        "{page}"
    );
    assert!(page.contains("<b>100ns</b><span>total write wait</span>"));
    assert_eq!(charts(&page, "wait-histogram"), 1);
}

fn study_run(scenario: &str, mode: &str, kib: f64, k: u64, ops: f64) -> String {
    format!(
        r#"{{"scenario":"{scenario}","mode":"{mode}","k":{k},"file_kib":{kib},"ops_per_s":{ops},"write":{},"report":{}}}"#,
        serde_json::to_string(&stats(100, 5000, 70_000, &[(1024, 90), (131072, 10)])).unwrap(),
        serde_json::to_string(&summary(vec![])).unwrap()
    )
}

#[test]
fn the_study_page_draws_scenarios_beside_each_other_per_file_size_and_k() {
    // Runs not grouped by scenario: each scenario is still drawn once per chart.
    let runs = [
        study_run("default", "workers", 64.0, 2, 1000.0),
        study_run("reuse", "workers", 64.0, 2, 3000.0),
        study_run("default", "processes", 64.0, 2, 1500.0),
        study_run("reuse", "processes", 64.0, 2, 2500.0),
        study_run("default", "workers", 0.125, 1, 9000.0),
        // A second run of the cell: the bars draw the mean.
        study_run("reuse", "workers", 64.0, 2, 3400.0),
    ];
    let study = format!(
        r#"{{"type":"study","schema_version":1,"machine":{{}},"runs":[{}],"repeat":2,{}}}"#,
        runs.join(","),
        r#""ranking": [{"file_kib": 64.0, "scenario": "reuse <best>", "throughput_ratio": 3.2, "writes_ratio": 0.2,
                 "throughput": {"mean": 3.2, "min": 3.0, "max": 3.4, "runs": 2}, "throughput_verdict": "changed",
                 "writes": {"mean": 0.2, "min": 0.2, "max": 0.2, "runs": 2}, "writes_verdict": "changed"},
                {"file_kib": 64.0, "scenario": "default", "throughput_ratio": 1.0, "writes_ratio": 1.0}],
    "claims": [{"scenario": "arena-1", "claim": "a marginal effect", "verdict": "within noise",
                "throughput": {"mean": 1.1, "min": 0.95, "max": 1.3, "runs": 2},
                "writes": {"mean": 0.5, "min": 0.4, "max": 0.6, "runs": 2}}]"#
    )
    .replace('\n', " ");
    let page = study_page_of("results.json", &study).unwrap();
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
    let run = RunLines::parse("results.json", &study).unwrap();
    assert_eq!(run_page("results.json", &run), page);
}

#[test]
fn the_compare_page_pairs_before_and_after_per_role_and_cause() {
    let side = |waits: &[u64]| {
        let mut r = Runs::default();
        for &w in waits {
            r.add(Line::Summary(summary(vec![process(1, "node", w, false)])));
        }
        r
    };
    let c = compare(("b", &side(&[900, 1000])), ("a", &side(&[90, 100])), None).unwrap();
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
    assert!(page.contains("b (2 runs) → a (2 runs)"), "{page}");
    let one = compare(("b", &side(&[900])), ("a", &side(&[90])), None).unwrap();
    assert!(super::compare::compare_page(&one).contains("b (1 run) → a (1 run)"));
}

/// One write-wait distribution whose maximum (4.74 ms) lies below the middle of its highest
/// bucket ([4.19, 8.39) ms), as mremap's did: the p99 is the same in the summary, the page
/// (whole or summed from interval lines) and compare, and never above the maximum.
#[test]
fn report_compare_and_the_page_give_one_p99_never_above_the_maximum() {
    let write = stats(920, 100_000_000, 4_740_000, &[(1024, 900), (1 << 23, 20)]);
    let with = |mut r: Report| {
        r.processes[0].lock.write = write.clone();
        r
    };
    let s = with(summary(vec![process(1, "node", 0, false)]));
    let p99 = s.processes[0].lock.write.wait_ns.p99;
    assert_eq!(p99, 4_740_000, "the top bucket counts at the maximum");
    // The p99 of the page's KPI and of compare's row of a file.
    let p99_of = |name: &str, text: &str| {
        let page = run_page(name, &RunLines::parse(name, text).unwrap());
        let at = page.find("<span>p99 write wait</span>").unwrap();
        let b = page[..at].rfind("<b>").unwrap();
        let runs = Runs::parse(name, text).unwrap();
        let c = compare((name, &runs), (name, &runs), None).unwrap();
        let all = c.rows.iter().find(|r| r.group == "all").unwrap();
        (page[b + 3..at - 4].to_string(), all.p99_wait_ns.before.mean)
    };
    let want = (crate::output::text::fmt_ns(p99), p99 as f64);
    assert_eq!(p99_of("run.json", &ndjson(&[&s])), want);
    // The same waits in two interval lines, the run cut before its summary.
    let mut a = with(interval("2026-01-01T00:00:01.000Z", 0));
    let mut b = with(interval("2026-01-01T00:00:02.000Z", 0));
    a.processes[0].lock.write = stats(460, 50_000_000, 4_740_000, &[(1024, 450), (1 << 23, 10)]);
    b.processes[0].lock.write = stats(460, 50_000_000, 4_500_000, &[(1024, 450), (1 << 23, 10)]);
    assert_eq!(p99_of("cut.json", &ndjson(&[&a, &b])), want);
}

#[test]
fn the_findings_come_first_on_a_run_page_with_what_to_change() {
    use crate::output::fixtures::time_share as share;
    use crate::{
        output::{
            findings::{Finding, Severity},
            report::{CauseReport, RoleShare},
        },
        registry::roles::Role,
    };
    // Worker threads whose writes are mprotects (arena growth), 400 ms of wait in 4 s alive.
    let mut p = process(7, "node", 400_000_000, false);
    let mprotects = stats(2000, 400_000_000, 600_000, &[(1 << 20, 2000)]);
    p.threads[1].lock.write = mprotects.clone();
    p.threads[1].lock.causes = vec![CauseReport {
        cause: "mprotect".into(),
        write: mprotects,
    }];
    p.lock.write = stats(2004, 400_000_000, 600_000, &[(1 << 20, 2004)]);
    p.time_share_by_role = Some(vec![
        RoleShare {
            role: Role::Worker,
            share: share(400_000_000, 4_000_000_000, 1),
        },
        RoleShare {
            role: Role::Main,
            share: share(1, 4_000_000_000, 1),
        },
    ]);
    p.time_share = Some(share(400_000_001, 8_000_000_000, 2));
    // Read back from its file, as `report` reads it.
    let run = RunLines::parse("run.json", &ndjson(&[&summary(vec![p])])).unwrap();
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
    // A summary the profiler made, carrying its findings (with its --study), is shown as it
    // is; a file's findings are not read, but recomputed.
    let mut s = summary(vec![process(8, "node", 10, false)]);
    s.findings = Some(vec![Finding {
        id: "long-holds".into(),
        pid: 8,
        comm: "node".into(),
        severity: Severity::Medium,
        title: "thread 9 holds it".into(),
        writes: None,
        wait_ns: 5,
        share_of_wait: 0.5,
        time_share: Some(0.03),
        time_share_bound: None,
        evidence: crate::output::findings::Evidence {
            facts: vec!["a fact".into()],
            ..Default::default()
        },
        impact: None,
        advice: vec!["do this".into()],
        measured: Vec::new(),
        measured_on: None,
        source: "docs/findings.md#long-holds".into(),
        window: None,
    }]);
    let mut recorded = RunLines::default();
    recorded.add_report(&s);
    let page = run_page("x", &recorded);
    assert!(page.contains("data-finding=\"long-holds\"") && page.contains("<li>a fact</li>"));
    let page = run_page("x", &RunLines::parse("x", &ndjson(&[&s])).unwrap());
    assert!(!page.contains("data-finding=\"long-holds\""), "{page}");
}

/// Wait over CPU time is a ratio, not a share: a mostly idle main thread that waited 17.62
/// times what it ran reads "17.6 s" of wait per CPU-second, never "1762.0%" of anything.
#[test]
fn wait_over_cpu_time_is_a_ratio_per_cpu_second() {
    use crate::output::fixtures::time_share as share;
    use crate::{output::report::RoleShare, registry::roles::Role};
    let mut p = process(7, "node", 1_762_000, false);
    let mut main = share(1_762_000, 4_000_000_000, 1);
    (main.cpu_ns, main.cpu) = (Some(100_000), Some(17.62));
    p.time_share_by_role = Some(vec![RoleShare {
        role: Role::Main,
        share: main.clone(),
    }]);
    p.time_share = Some(main);
    let page = run_page(
        "x",
        &RunLines::parse("x", &ndjson(&[&summary(vec![p.clone()])])).unwrap(),
    );
    let table = &page[page.find("data-table=\"time-share\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert!(table.contains(">wait per CPU-second</th>"), "{table}");
    assert!(table.contains("<td>17.6 s</td>"), "{table}");
    assert!(
        !page.contains("1762.0%") && !page.contains("of CPU time"),
        "{page}"
    );
    let text = crate::output::text::to_text(&summary(vec![p]));
    assert!(text.contains("(17.6 s of wait per CPU-second)"), "{text}");
    assert!(!text.contains("1762.0%"), "{text}");
}

/// A contention-mode run's page says what its numbers are before any of them, and draws no
/// hold (none was measured); a full-mode run's page says nothing of the kind.
#[test]
fn a_contention_run_page_says_its_mode_and_draws_no_hold() {
    let full = summary(vec![process(1, "node", 5000, false)]);
    let mut cont = full.clone();
    cont.mode = crate::vocab::Mode::Contention;
    cont.drop_unmeasured();
    let page = |r: &Report| {
        let run = RunLines::parse("run.json", &ndjson(&[r])).unwrap();
        run_page("run.json", &run)
    };
    let (f, c) = (page(&full), page(&cont));
    assert!(c.contains("contention mode: counts and waits are the contended waits only"));
    assert_eq!(charts(&c, "hold-histogram"), 0);
    assert!(charts(&c, "wait-histogram") > 0);
    assert!(!f.contains("contention mode"));
    assert!(charts(&f, "hold-histogram") > 0);
}

/// One finding, one content: every field of a finding (title, severity and what removing it
/// gives back, cost, evidence, victims, code, JavaScript, change, measured) is in the text
/// view, the JSON and the page alike, and in the same order in the text and the page.
#[test]
fn a_finding_says_the_same_in_text_json_and_page() {
    use crate::output::findings::{
        self, Effect, Evidence, Finding, Severity, VictimRef,
        impact::{Impact, ImpactKind},
        study::Ratio,
    };
    let ratio = |mean| Ratio {
        mean,
        min: mean,
        max: mean,
        runs: 1,
    };
    let f = Finding {
        id: "thread-stacks".into(),
        pid: 8,
        comm: "node".into(),
        // Info: the text once left out an info finding's evidence and advice.
        severity: Severity::Info,
        title: "hash_lanes (lanes.node) starts and joins threads (libuv threads): 882 writes map, guard & unmap <stacks>".into(),
        writes: Some(882),
        wait_ns: 3_070_000_000,
        share_of_wait: 0.498,
        time_share: Some(0.076),
        time_share_bound: None,
        evidence: Evidence {
            roles: vec!["libuv".into()],
            causes: vec!["mmap".into(), "munmap".into()],
            code: vec!["hash_lanes (lanes.node)".into()],
            js_functions: vec!["login (/srv/app.js:13:15) (20 of 221 sampled stacks)".into()],
            threads: Vec::new(),
            victims: vec![VictimRef {
                role: "addon".into(),
                wait_ns: 2_200_000_000,
                write_wait_ns: 0,
            }],
            facts: vec![
                "who waited behind them: addon threads 2.20s (reading: page faults)".into(),
                "their holds lasted 3.89ms in all".into(),
            ],
        },
        impact: Some(Impact {
            kind: ImpactKind::Latency,
            throughput_gain: 0.002,
            cpu_ns: 1_830_000_000,
            queued_ns: Some(27_730_000_000),
            cpus: Some(1.0),
            cpu_use: Some(0.547),
        }),
        window: None,
        advice: vec![
            "Reuse threads".into(),
            "GLIBC_TUNABLES=glibc.pthread.stack_cache_size=N".into(),
        ],
        measured: vec![Effect {
            scenario: "reuse".into(),
            file_kib: 64.0,
            throughput: ratio(1.2),
            writes: ratio(0.1),
            verdict: "changed".into(),
        }],
        measured_on: Some("Linux 6.18".into()),
        source: "docs/findings.md#mechanisms".into(),
    };
    let text = findings::to_text(std::slice::from_ref(&f));
    let json = serde_json::to_value(&f).unwrap();
    let page = super::verdict::findings_section(std::slice::from_ref(&f));
    let esc = super::svg::esc;
    // Every line of the text but the section's heading, in the page in the same order.
    let mut at = 0;
    for line in text.lines().skip(2) {
        let content = line.trim_start();
        let content = content
            .split_once("]")
            .filter(|_| content.starts_with('['))
            .map_or(content, |(_, rest)| rest.trim_start());
        let content = ["cost: ", "evidence: ", "change: ", "measured here: "]
            .iter()
            .find_map(|l| content.strip_prefix(l))
            .unwrap_or(content);
        let found = page[at..]
            .find(&esc(content))
            .unwrap_or_else(|| panic!("{content:?} is not in the page after {at}:\n{page}"));
        at += found;
    }
    // Every field of the JSON, in the text and in the page.
    let mut fields: Vec<String> = vec![
        json["title"].as_str().unwrap().into(),
        findings::severity_text(&f),
        findings::cost_text(&f),
    ];
    for k in ["facts", "code", "js_functions"] {
        fields.extend(
            json["evidence"][k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string()),
        );
    }
    fields.extend(
        json["advice"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string()),
    );
    fields.push(findings::effect_text(&f.measured[0]));
    for v in json["evidence"]["victims"].as_array().unwrap() {
        fields.push(format!(
            "{} threads {}",
            v["role"].as_str().unwrap(),
            crate::output::text::fmt_ns(v["wait_ns"].as_u64().unwrap())
        ));
    }
    let kind = json["impact"]["kind"].as_str().unwrap();
    assert!(findings::severity_text(&f).contains(kind));
    for field in &fields {
        assert!(
            text.contains(field.as_str()),
            "{field:?} not in the text:\n{text}"
        );
        assert!(
            page.contains(&esc(field)),
            "{field:?} not in the page:\n{page}"
        );
    }
}
