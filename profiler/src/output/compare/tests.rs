use super::{text::to_text, *};
use crate::output::{
    fixtures::{self, stats},
    report::{CauseReport, Kind},
};

/// A summary of one process `comm` whose `writes` writes (all by a worker, all mmap)
/// waited `wait` in all, each in [512, 1024) ns.
fn summary(comm: &str, writes: u64, wait: u64) -> Report {
    let s = stats(writes, wait, 1000, &[(1024, writes)]);
    let mut p = fixtures::process(1, comm, wait, false);
    p.lock.write = s.clone();
    p.threads.truncate(1);
    p.threads[0].role = crate::registry::roles::Role::Worker;
    p.threads[0].lock.write = s.clone();
    p.lock.causes = vec![CauseReport {
        cause: "mmap".into(),
        write: s,
    }];
    fixtures::summary(vec![p])
}

fn runs(lines: impl IntoIterator<Item = Line>) -> Runs {
    runs_by(By::default(), lines)
}

pub(super) fn runs_by(by: By, lines: impl IntoIterator<Item = Line>) -> Runs {
    let mut r = Runs::new(by);
    lines.into_iter().for_each(|l| r.add(l));
    r
}

fn summaries(v: &[(u64, u64)]) -> Runs {
    runs(v.iter().map(|&(w, t)| Line::Summary(summary("node", w, t))))
}

#[test]
fn ratios_and_noise_verdicts() {
    let before = summaries(&[(1000, 5000), (1100, 5200)]);
    let after = summaries(&[(400, 900), (420, 1000)]);
    let c = compare(("b", &before), ("a", &after), None).unwrap();
    let all = c.rows.iter().find(|r| r.group == "all").unwrap();
    assert_eq!(all.writes.before.mean, 1050.0);
    assert_eq!(all.writes.verdict, "changed");
    assert!((all.writes.ratio.unwrap() - 410.0 / 1050.0).abs() < 1e-9);
    // In the [512, 1024) bucket, as the summary has it.
    let p99 = summary("node", 1000, 5000).processes[0]
        .lock
        .write
        .wait_ns
        .p99;
    assert!((512..1000).contains(&p99), "{p99}");
    assert_eq!(all.p99_wait_ns.before.mean, p99 as f64);
    // Overlapping ranges: noise.
    let same = compare(
        ("b", &before),
        ("a", &summaries(&[(1050, 5100), (990, 4900)])),
        None,
    )
    .unwrap();
    assert_eq!(same.rows[0].writes.verdict, "within noise");
    // One run each: not judged.
    let one = compare(
        ("b", &summaries(&[(10, 1)])),
        ("a", &summaries(&[(20, 1)])),
        None,
    )
    .unwrap();
    assert_eq!(one.rows[0].writes.verdict, "one run");
    assert!(to_text(&one).contains("cannot be judged"));
    // Roles and causes are rows of their own.
    assert!(
        c.rows
            .iter()
            .any(|r| r.group == "role" && r.key == "worker")
    );
    assert!(c.rows.iter().any(|r| r.group == "cause" && r.key == "mmap"));
}

#[test]
fn processes_of_one_name_are_pooled_and_a_missing_one_counts_zero() {
    let proc = |pid: u32, comm: &str, writes: u64, bucket: u64| {
        let mut p = fixtures::process(pid, comm, writes * 10, false);
        p.lock.write = stats(writes, writes * 10, bucket - 1, &[(bucket, writes)]);
        p.threads[0].lock.write = stats(1, 0, 0, &[(1, 1)]);
        p.threads[1].lock.write = stats(writes, 0, 0, &[(1, writes)]);
        p
    };
    let before = runs_by(
        By::Comm,
        [Line::Summary(fixtures::summary(vec![
            proc(1, "node", 100, 1024),
            proc(2, "node", 300, 1 << 20),
            proc(3, "gone", 5, 64),
        ]))],
    );
    let after = runs_by(
        By::Comm,
        [Line::Summary(fixtures::summary(vec![
            proc(4, "node", 40, 1024),
            proc(5, "new", 7, 64),
        ]))],
    );
    let c = compare(("b", &before), ("a", &after), None).unwrap();
    let row = |p: &str, g: &str, k: &str| {
        c.rows
            .iter()
            .find(|r| r.process == p && r.group == g && r.key == k)
            .unwrap_or_else(|| panic!("{p} {g} {k}"))
    };
    let node = row("node", "all", "all");
    assert_eq!(
        (node.writes.before.mean, node.writes.after.mean),
        (400.0, 40.0)
    );
    assert_eq!(node.writes.ratio, Some(0.1));
    assert_eq!(node.mean_wait_ns.before.mean, 10.0);
    // The pooled buckets: 300 of 400 waits in the 1 MiB bucket, so the p99 is there (its
    // middle), and below the maximum; as the summary of the pooled waits has it.
    let pooled = crate::aggregation::DurationHist::from_upper_bounds(
        0,
        (1 << 20) - 1,
        [(1024, 100), (1 << 20, 300)],
    );
    let p99 = pooled.quantiles([0.99])[0];
    assert!(((1 << 19) + (1 << 18)..(1 << 20)).contains(&p99), "{p99}");
    assert_eq!(node.p99_wait_ns.before.mean, p99 as f64);
    assert_eq!(
        node.p99_wait_ns.after.mean,
        stats(1, 0, 1023, &[(1024, 1)]).wait_ns.p99 as f64
    );
    // Threads pooled by role across the processes.
    assert_eq!(row("node", "role", "main").writes.before.mean, 2.0);
    assert_eq!(row("node", "role", "worker").writes.before.mean, 400.0);
    // A process on one side only: zero on the other, no ratio from zero.
    assert_eq!(row("gone", "all", "all").writes.after.mean, 0.0);
    assert_eq!(row("gone", "all", "all").writes.ratio, Some(0.0));
    assert_eq!(row("new", "all", "all").writes.ratio, None);
    let text = to_text(&c);
    assert!(text.contains("0.10x") && text.contains("b (1 run) -> a (1 run)"));
    assert!(
        text.contains("grouped by command name (--by comm)"),
        "{text}"
    );
    assert!(text.contains("2 processes -> 1 process"), "{text}");
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["type"], "compare");
    assert_eq!(json["by"], "comm");
    assert_eq!(json["rows"][0]["writes"]["before"]["runs"], 1);
}

#[test]
fn a_file_without_summary_is_one_run_of_its_interval_lines() {
    let line = |writes: u64| {
        let mut s = summary("node", writes, writes);
        s.kind = Kind::Interval;
        Line::Interval(s)
    };
    let cut = runs([line(30), line(20)]);
    let c = compare(("cut", &cut), ("a", &summaries(&[(100, 1)])), None).unwrap();
    assert_eq!(c.before.runs, 1);
    assert_eq!(c.rows[0].writes.before.mean, 50.0);
    assert_eq!(c.rows[0].writes.ratio, Some(2.0));
    // Once a run's summary came, interval lines are that run's, already in it.
    let both = runs([line(30), Line::Summary(summary("node", 30, 30)), line(7)]);
    let c = compare(("b", &both), ("a", &summaries(&[(60, 1)])), None).unwrap();
    assert_eq!((c.before.runs, c.rows[0].writes.before.mean), (1, 30.0));
}

/// A contention-mode run, as the profiler writes it and as it reads back.
fn contention(writes: u64, wait: u64) -> Report {
    let mut r = summary("node", writes, wait);
    r.mode = Mode::Contention;
    r.drop_unmeasured();
    let line = serde_json::to_string(&r).unwrap();
    assert!(line.contains(r#""mode":"contention""#), "{line}");
    assert!(!line.contains("hold_ns"), "{line}");
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_two_modes_are_never_compared() {
    let full = summaries(&[(1000, 5000)]);
    let cont = runs([Line::Summary(contention(40, 4000))]);
    for (b, a) in [(&full, &cont), (&cont, &full)] {
        let e = compare(("before.json", b), ("after.json", a), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("full mode") && e.contains("contention mode"),
            "{e}"
        );
        assert!(e.contains("before.json") && e.contains("after.json"), "{e}");
    }
    // A file holding runs of both is refused too.
    let mixed = runs([
        Line::Summary(summary("node", 10, 10)),
        Line::Summary(contention(4, 10)),
    ]);
    assert!(compare(("m", &mixed), ("a", &full), None).is_err());
    // One mode on both sides: compared, and said.
    let c = compare(
        ("b", &cont),
        ("a", &runs([Line::Summary(contention(10, 500))])),
        None,
    )
    .unwrap();
    assert_eq!(c.mode, Mode::Contention);
    assert_eq!(c.rows[0].writes.before.mean, 40.0);
    assert!(to_text(&c).contains("contention mode: counts and waits are the contended waits only"));
    assert!(
        !to_text(&compare(("b", &full), ("a", &full), None).unwrap()).contains("contention mode")
    );
}

/// Reads have columns of their own, in the JSON, the text and the page: the process's and
/// each role's (a cause is the writes' and has none).
#[test]
fn reads_are_compared_beside_writes() {
    let with_reads = |reads: u64, wait: u64| {
        let mut s = summary("node", 100, 5000);
        let r = stats(reads, wait, wait, &[(1 << 20, reads)]);
        s.processes[0].lock.read = r.clone();
        s.processes[0].threads[0].lock.read = r;
        s
    };
    let c = compare(
        ("b", &runs([Line::Summary(with_reads(400, 8_000_000))])),
        ("a", &runs([Line::Summary(with_reads(100, 1_000_000))])),
        None,
    )
    .unwrap();
    let row = |group: &str| c.rows.iter().find(|r| r.group == group).unwrap();
    for group in ["all", "role"] {
        let r = row(group).reads.as_ref().expect("read figures");
        assert_eq!((r.reads.before.mean, r.reads.after.mean), (400.0, 100.0));
        assert_eq!(r.read_wait_ns.ratio, Some(0.125));
        assert_eq!(r.mean_read_wait_ns.before.mean, 20_000.0);
    }
    assert!(row("cause").reads.is_none());
    let json = serde_json::to_value(&c).unwrap();
    let all = &json["rows"][0];
    assert_eq!(all["reads"]["read_wait_ns"]["before"]["mean"], 8_000_000.0);
    let text = to_text(&c);
    assert!(text.contains("verdict: reads / wait"), "{text}");
    let reads_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("role worker") && l.contains("8.00ms"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(reads_line.contains("1.00ms"), "{reads_line}");
    let page = crate::output::html::compare::compare_page(&c);
    assert!(
        page.contains("data-table=\"reads\"") && page.contains("data-chart=\"read-wait-by-role\"")
    );
}
