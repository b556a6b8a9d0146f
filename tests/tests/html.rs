//! ROOT-ONLY: the HTML report and the before/after comparison, against runs of the
//! ground-truth helper, rendered in a real headless browser (Debian's chromium, which
//! `cargo xtask test` installs) with every network request made to fail: the plots must be in
//! the rendered page, and the page must need nothing from outside.

use std::path::{Path, PathBuf};

use integration_tests::{
    Profiler, Workload, assert_charts, bpf_test, charts, page_requests, process, profile_workload,
    read_lines, rendered_charts, report_html, run_json, run_ok, run_profiler,
};
use serde_json::Value;

fn run_helper(threads: u32, n: u32, extra: &[&str], out: &Path) -> (u32, Vec<Value>) {
    let mut w = Workload::helper("mmap-churn", [threads, n]);
    let mut args = vec!["-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    profile_workload(&mut w, &args);
    (w.pid, read_lines(out))
}

/// `compare BEFORE AFTER --by comm [ARGS] -f json` (rows per process name), which must
/// succeed.
fn compare(before: &Path, after: &Path, args: &[&str]) -> Value {
    let mut all = vec![
        "compare",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--by",
        "comm",
    ];
    all.extend_from_slice(args);
    run_json(all)
}

/// The comparison's row of the helper's process in `group` for `key`.
fn row<'a>(c: &'a Value, group: &str, key: &str) -> &'a Value {
    c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["process"] == "mmap-churn" && r["group"] == group && r["key"] == key)
        .unwrap_or_else(|| panic!("no row {group} {key}: {c}"))
}

#[test]
fn the_html_report_renders_its_plots_and_fetches_nothing() {
    let Some(dir) = bpf_test() else { return };
    let (json, live) = (dir.path().join("run.json"), dir.path().join("live.html"));
    let (pid, lines) = run_helper(
        3,
        20_000,
        &[
            "-i",
            "0.2",
            "--stack-sample",
            "4",
            "--blockers",
            "--html",
            live.to_str().unwrap(),
        ],
        &json,
    );
    let summary = lines.last().unwrap();
    assert!(process(summary, pid).is_some());
    // The same page from the file, by `report`.
    let page = dir.path().join("page.html");
    report_html(&json, &page);
    let (a, b) = (
        std::fs::read_to_string(&live).unwrap(),
        std::fs::read_to_string(&page).unwrap(),
    );
    // Only the title (the file's name) differs.
    assert_eq!(
        a[a.find("</header>").unwrap()..],
        b[b.find("</header>").unwrap()..]
    );
    // Cut short (no summary line): the page sums the interval lines, which partition the run,
    // so it shows the summary's write count.
    let cut = dir.path().join("cut.json");
    let text = std::fs::read_to_string(&json).unwrap();
    let without_summary: String = text
        .lines()
        .filter(|l| !l.contains("\"type\":\"summary\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(without_summary.len() < text.len());
    std::fs::write(&cut, without_summary).unwrap();
    let cut_page = dir.path().join("cut.html");
    report_html(&cut, &cut_page);
    let c = std::fs::read_to_string(&cut_page).unwrap();
    assert!(
        c.contains("no summary yet: "),
        "the page says it is no summary"
    );
    // And the text, with the lines' span.
    let text = run_ok(["report", cut.to_str().unwrap(), "-f", "text"]);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("no summary yet: ")
                && l.contains("the run is still going or was cut")),
        "{text}"
    );
    assert!(!text.lines().next().unwrap().contains("(0.0s)"), "{text}");
    let writes = process(summary, pid).unwrap()["write"]["count"]
        .as_u64()
        .unwrap();
    assert!(
        c.contains(&format!("<b>{writes}</b><span>write acquisitions</span>")),
        "the summed page does not show the summary's {writes} writes"
    );
    let Some((dom, found)) = rendered_charts(&page) else {
        return;
    };
    assert_charts(
        &found,
        &[
            "wait-histogram",
            "hold-histogram",
            "wait-over-time",
            "writes-over-time",
            "writes-by-role",
            "wait-by-role",
            "writes-by-cause",
            "wait-by-cause",
        ],
    );
    // Marks drawn: bars for the histograms and groups, a line per time chart (the run had
    // interval lines every 0.2 s), and inferno's flame graph of the sampled writes.
    assert!(dom.matches("class=\"bar\"").count() >= 10);
    assert!(dom.matches("class=\"line\"").count() >= 2);
    // Our charts keep their size once the page's scripts ran (inferno's script, inline, once
    // took the first chart for its own and stripped it).
    for svg in dom.match_indices("<svg class=\"chart\"") {
        let tag = &dom[svg.0..];
        let tag = &tag[..tag.find('>').unwrap()];
        assert!(
            tag.contains(" width=") && tag.contains(" viewBox="),
            "{tag}"
        );
    }
    // The flame graph in its own frame (its document is in the srcdoc attribute).
    assert_charts(&found, &["flame-graph"]);
    assert!(
        dom.contains("Flame graph of the sampled writes") && dom.contains("id=&quot;frames&quot;")
    );
    assert!(
        dom.contains("mmap (libc.so.6)"),
        "the flame graph names the frames"
    );
    assert!(dom.contains("Who made whom wait"));
}

/// Two runs of the helper with 1 and 3 threads: `compare` reports the difference in writes
/// that the helper guarantees (2 x N per thread), and its page renders.
#[test]
fn compare_reports_the_known_difference_in_writes() {
    let Some(dir) = bpf_test() else { return };
    let n = 5_000u64;
    let (before, after): (PathBuf, PathBuf) =
        (dir.path().join("b.json"), dir.path().join("a.json"));
    let (pid, lines) = run_helper(1, n as u32, &["-i", "0"], &before);
    run_helper(3, n as u32, &["-i", "0"], &after);
    let page = dir.path().join("compare.html");
    let c = compare(&before, &after, &["--html", page.to_str().unwrap()]);
    assert_eq!(c["type"], "compare");
    let mean = |r: &Value, f: &str, side: &str| r[f][side]["mean"].as_f64().unwrap() as u64;
    // mmap and munmap: exactly N per thread each.
    let mmap = row(&c, "cause", "mmap");
    assert_eq!(mean(mmap, "writes", "before"), n);
    assert_eq!(mean(mmap, "writes", "after"), 3 * n);
    let all = row(&c, "all", "all");
    let diff = mean(all, "writes", "after") - mean(all, "writes", "before");
    // 2 x N x 2 more threads, and a few writes of the threads' own (stacks, exit).
    assert!((4 * n..=4 * n + 10).contains(&diff), "difference {diff}");
    assert_eq!(all["writes"]["verdict"], "one run");
    // One p99 for one run's waits: compare's is the summary's, never above the maximum.
    let wait = &process(lines.last().unwrap(), pid).unwrap()["write"]["wait_ns"];
    let (p99, max) = (wait["p99"].as_u64().unwrap(), wait["max"].as_u64().unwrap());
    assert_eq!(
        all["p99_wait_ns"]["before"]["mean"].as_f64(),
        Some(p99 as f64)
    );
    assert!(p99 <= max, "p99 {p99} above max {max}");
    // Text too.
    let text = run_ok([
        "compare",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "-f",
        "text",
    ]);
    assert!(text.contains("cannot be judged"));
    let Some((dom, found)) = rendered_charts(&page) else {
        return;
    };
    assert_charts(&found, &["writes-by-cause"]);
    assert!(dom.matches("class=\"bar\"").count() >= 4);
}

/// `--html` is written when the run is interrupted too, from the same reports: the page shows
/// the summary's write count.
#[test]
fn the_html_page_is_written_after_sigint() {
    let Some(dir) = bpf_test() else { return };
    let page = dir.path().join("interrupted.html");
    // Far more work than the run lasts.
    let mut w = Workload::helper("mmap-churn", [1, 50_000_000]);
    let pid = w.pid.to_string();
    let prof = Profiler::start(&["--pid", &pid, "-i", "0.2", "--html", page.to_str().unwrap()]);
    w.go();
    // Some of the work done (scaled: a slow host does less in the same time).
    std::thread::sleep(integration_tests::scaled(std::time::Duration::from_millis(
        800,
    )));
    prof.signal(libc::SIGINT);
    let out = prof.finish();
    assert!(out.status.success(), "{}", out.stderr);
    let summary = out.lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let writes = process(summary, w.pid).unwrap()["write"]["count"]
        .as_u64()
        .unwrap();
    assert!(writes > 1000, "{writes} writes in 0.8 s");
    let html = std::fs::read_to_string(&page).expect("the page was written");
    assert!(html.contains(&format!("<b>{writes}</b><span>write acquisitions</span>")));
    assert_eq!(
        charts(&html)
            .iter()
            .filter(|c| *c == "wait-over-time")
            .count(),
        1
    );
    assert!(
        html.matches("class=\"line\"").count() >= 5,
        "interval lines drawn"
    );
}

/// Two runs per side (the files concatenated): each figure is the mean over the runs with
/// its range, and 1 thread against 3 is a change beyond run-to-run noise.
#[test]
fn compare_judges_noise_over_repeated_runs() {
    let Some(dir) = bpf_test() else { return };
    let n = 3_000u64;
    let side = |threads: u32, name: &str| {
        let mut all = String::new();
        for i in 0..2 {
            let one = dir.path().join(format!("{name}-{i}.json"));
            run_helper(threads, n as u32, &["-i", "0"], &one);
            all.push_str(&std::fs::read_to_string(&one).unwrap());
        }
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, all).unwrap();
        path
    };
    let (before, after) = (side(1, "before"), side(3, "after"));
    let c = compare(&before, &after, &[]);
    assert_eq!(
        (c["before"]["runs"].as_u64(), c["after"]["runs"].as_u64()),
        (Some(2), Some(2))
    );
    // Exactly N mmaps per thread in every run: no spread at all.
    let mmap = &row(&c, "cause", "mmap")["writes"];
    for (side, want) in [("before", n), ("after", 3 * n)] {
        assert_eq!(mmap[side]["runs"], 2);
        assert_eq!(mmap[side]["min"].as_f64(), Some(want as f64));
        assert_eq!(mmap[side]["max"].as_f64(), Some(want as f64));
    }
    assert_eq!(mmap["verdict"], "changed");
    let all = &row(&c, "all", "all")["writes"];
    assert_eq!(all["verdict"], "changed");
    let ratio = all["ratio"].as_f64().unwrap();
    assert!((2.9..3.01).contains(&ratio), "ratio {ratio}");
}

/// A summary line with the contract's base fields: process 9 (`node`) with 3 writes.
const GOOD: &str = r#"{"type":"summary","schema_version":1,"start":"2025-01-01T00:00:00.000Z","end":"2025-01-01T00:00:01.000Z","duration_s":1.0,"processes":[{"pid":9,"comm":"node","write":{"count":3,"failed_trylocks":0,"wait_ns":{"sum":2400,"max":900,"mean":800.0,"p50":768,"p90":900,"p99":900,"p999":900,"buckets":[[1024,3]]},"hold_ns":{"sum":0,"max":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"buckets":[[1,3]]}},"read":{"count":0,"failed_trylocks":0,"wait_ns":{"sum":0,"max":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"buckets":[]},"hold_ns":{"sum":0,"max":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"buckets":[]}},"threads":[]}],"lost":{"events":0,"map_full":0}}"#;

/// `report FILE` and `compare GOOD FILE` on a file of `text`: the exit code and stderr of each.
fn read_back(dir: &Path, text: &str) -> [(Option<i32>, String); 2] {
    let (file, good) = (dir.join("run.json"), dir.join("good.json"));
    std::fs::write(&file, text).unwrap();
    std::fs::write(&good, format!("{GOOD}\n")).unwrap();
    let page = dir.join("page.html");
    let [file, good, page] = [&file, &good, &page].map(|p| p.to_str().unwrap());
    let report = run_profiler(&["report", file, "--html", page]);
    let compare = run_profiler(&["compare", good, file]);
    [report, compare].map(|o| {
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    })
}

/// Every bad value of a report file is refused by `report` and `compare` with exit status 2
/// and one line naming the file, the line and the field; what a later minor version adds is
/// read. An absurd bucket bound is refused too, at once (it was a loop allocating without
/// end).
#[test]
fn report_and_compare_name_the_file_line_and_field_of_a_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.json").display().to_string();
    let write = "\"write\":{\"count\":3,";
    for (from, to, want) in [
        (
            write,
            "\"write\":{\"count\":-1,",
            "processes[0].write.count: expected an unsigned integer, found -1",
        ),
        (
            write,
            "\"write\":{\"count\":1e308,",
            "processes[0].write.count: expected an unsigned integer, found 1e308",
        ),
        (
            write,
            "\"write\":{\"count\":18446744073709551616,",
            "processes[0].write.count: expected an unsigned integer",
        ),
        (
            write,
            "\"write\":{\"count\":\"3\",",
            "processes[0].write.count: expected an unsigned integer, found string",
        ),
        (
            "[[1024,3]]",
            "[[18446744073709551615,3]]",
            "processes[0].write.wait_ns.buckets[0]: 18446744073709551615 is not the upper bound of a log2 bucket",
        ),
        (
            "\"processes\":[",
            "\"processes\":{\"a\":",
            "processes: expected an array, found an object",
        ),
        (
            "\"schema_version\":1",
            "\"schema_version\":2",
            "schema_version: version 2 of the report format is not supported",
        ),
        (
            "\"comm\":\"node\",\"write\"",
            "\"comm\":\"node\",\"w\"",
            "processes[0].write: missing",
        ),
    ] {
        assert_eq!(GOOD.matches(from).count(), 1, "{from}");
        let mut bad = GOOD.replacen(from, to, 1);
        if from.starts_with("\"processes\"") {
            // The array's closing bracket too.
            bad = bad.replacen("}],\"lost\"", "}},\"lost\"", 1);
        }
        // The bad line second: its number is named.
        for (code, err) in read_back(dir.path(), &format!("{GOOD}\n{bad}\n")) {
            assert_eq!(code, Some(2), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            let line = format!("mmaplock-prof: {file}:2: {want}");
            assert!(err.starts_with(&line), "{err}\nwanted {line}");
        }
    }
    // Not JSON.
    for (code, err) in read_back(dir.path(), &format!("{GOOD}\nnot json\n")) {
        assert_eq!((code, err.lines().count()), (Some(2), 1), "{err}");
        assert!(
            err.starts_with(&format!("mmaplock-prof: {file}:2: not JSON")),
            "{err}"
        );
    }
    // A later minor version: new fields, a new line type.
    let later = GOOD.replacen(
        "\"pid\":9,",
        "\"pid\":9,\"findings\":[{\"kind\":\"new\"}],",
        1,
    );
    for (code, err) in read_back(
        dir.path(),
        &format!("{{\"type\":\"later\",\"schema_version\":1}}\n{later}\n"),
    ) {
        assert_eq!(code, Some(0), "{err}");
    }
    let out = run_profiler(&["compare", "/nonexistent/a.json", &file]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/a.json"));
}

/// The network check itself: a page that does fetch is seen fetching (no root needed).
#[test]
fn a_page_that_fetches_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("fetches.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><head><link rel=\"stylesheet\" href=\"https://example.invalid/s.css\"></head>\
         <body><img src=\"http://example.invalid/x.png\"></body></html>",
    )
    .unwrap();
    let Some(requests) = page_requests(&page) else {
        return;
    };
    for url in [
        "https://example.invalid/s.css",
        "http://example.invalid/x.png",
    ] {
        assert!(
            requests.iter().any(|r| r == url),
            "{url} not in {requests:?}"
        );
    }
}
