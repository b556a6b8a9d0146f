use super::*;
use crate::output::fixtures::{self, summary_line};

/// What reading one line (after a good one) says.
fn error_of(line: &str) -> String {
    let text = format!("{}\n{line}\n", summary_line());
    match read("run.json", text.as_bytes(), |_| {}) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("accepted: {line}"),
    }
}

/// The good summary line with `from` replaced by `to` (which must occur once).
fn edited(from: &str, to: &str) -> String {
    let s = summary_line();
    assert_eq!(s.matches(from).count(), 1, "{from} in {s}");
    s.replacen(from, to, 1)
}

/// The error of the summary line with `from` replaced by `to`: one line, starting with
/// `want`.
fn check(from: &str, to: &str, want: &str) {
    let e = error_of(&edited(from, to));
    assert!(e.starts_with(want), "{e}\n  wanted {want}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn each_malformed_value_is_named_by_file_line_and_field() {
    let count = format!("{}\"count\":10", fixtures::WRITE_JSON_START);
    for (bad, found) in [
        ("-1", "-1"),
        ("1e308", "1e308"),
        ("18446744073709551616", "1.8446744073709552e19"),
        ("\"10\"", "string \"10\""),
    ] {
        check(
            &count,
            &count.replace("10", bad),
            &format!(
                "run.json:2: processes[0].write.count: expected an unsigned integer, found {found}"
            ),
        );
    }
    for (from, to, want) in [
        (
            "\"pid\":1,",
            "\"pid\":4294967296,",
            "run.json:2: processes[0].pid: expected an unsigned integer below 2^32, found 4294967296",
        ),
        (
            "\"duration_s\":2.0",
            "\"duration_s\":1e999",
            "run.json:2: duration_s: a number out of range",
        ),
        (
            "[[1024,6],",
            "[[18446744073709551615,6],",
            "run.json:2: processes[0].write.wait_ns.buckets[0]: 18446744073709551615 is not the upper bound of a log2 bucket (1, 2, 4, ... 2^39 ns)",
        ),
        (
            "[[1024,6],",
            "[[1099511627776,6],",
            "run.json:2: processes[0].write.wait_ns.buckets[0]: 1099511627776 is not the upper bound",
        ),
        (
            "[[1024,6],",
            "[[1024,-6],",
            "run.json:2: processes[0].write.wait_ns.buckets[0][1]: expected an unsigned integer, found -6",
        ),
        (
            "[[1024,6],",
            "[[1024,288230376151711744],",
            "run.json:2: processes[0].write.wait_ns.buckets[0]: count 288230376151711744 is out of range",
        ),
        (
            "\"max\":5000,",
            "\"max\":3,",
            "run.json:2: processes[0].write.wait_ns: max 3 is below its highest bucket (upper bound 8192 ns, from 4096 ns)",
        ),
        (
            "\"schema_version\":1,",
            "\"schema_version\":2,",
            "run.json:2: schema_version: version 2 of the report format is not supported: this build reads version 1",
        ),
        (
            "\"schema_version\":1,",
            "",
            "run.json:2: schema_version: missing",
        ),
        (
            "\"role\":\"main\"",
            "\"role\":7",
            "run.json:2: processes[0].threads[0].role: expected",
        ),
        (
            "\"role\":\"main\",\"comm\":\"node\",\"write\":{\"count\":4,",
            "\"role\":\"main\",\"comm\":\"node\",\"write\":{\"count\":-4,",
            "run.json:2: processes[0].threads[0].write.count: expected an unsigned integer, found -4",
        ),
    ] {
        check(from, to, want);
    }
}

#[test]
fn wrong_shapes_and_missing_fields_are_named() {
    let s = summary_line();
    // `processes` as an object.
    let start = s.find("\"processes\":[").unwrap() + "\"processes\":".len();
    let end = s.find(",\"lost\"").unwrap();
    let object = format!(
        "{}{{\"a\":{}}}{}",
        &s[..start],
        &s[start + 1..end - 1],
        &s[end..]
    );
    assert_eq!(
        error_of(&object),
        "run.json:2: processes: expected an array, found an object"
    );
    // A process without `write`.
    let w = fixtures::WRITE_JSON_START;
    let at = s.find(w).unwrap();
    let stats_end = at + s[at..].find("},\"read\"").unwrap() + 2;
    let no_write = format!("{}{}", &s[..at], &s[stats_end..]);
    assert_eq!(
        error_of(&no_write),
        "run.json:2: processes[0].write: missing"
    );
    assert_eq!(
        error_of("[\"summary\",1]"),
        "run.json:2: not a report line: expected a JSON object"
    );
    assert!(error_of("{\"type\":\"summary\",").starts_with("run.json:2: not JSON: EOF"));
    assert!(error_of(&format!("{s} x")).starts_with("run.json:2: not JSON: trailing"));
}

#[test]
fn later_additions_load_and_unknown_lines_are_passed_over() {
    let only_summary = |text: &str| {
        let mut got = Vec::new();
        read("f.json", text.as_bytes(), |l| got.push(l)).unwrap();
        match got.pop() {
            Some(Line::Summary(r)) if got.is_empty() => r,
            _ => panic!("not one summary"),
        }
    };
    // A newer minor version: fields and line types this build does not know.
    let s = summary_line().replacen("{", "{\"findings\":[{\"new\":1}],", 1);
    let s = s.replace("\"role\":\"main\"", "\"role\":\"gc\",\"wait_share\":0.5");
    let r = only_summary(&format!(
        "{{\"type\":\"later\",\"schema_version\":1}}\n\n{s}\n"
    ));
    assert_eq!(
        r.processes[0].threads[0].role,
        crate::registry::roles::Role::Other
    );
    // An older file: none of the fields added since version 1 began.
    let r = only_summary(&fixtures::base_contract_line());
    assert!(r.processes[0].lock.causes.is_empty() && r.processes[0].dsos.is_none());
    assert_eq!(r.processes[0].lock.write.count, 3);
    // Nothing a report reads.
    let e = read("x.json", "{\"a\":1}\n".as_bytes(), |_| {}).unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.json: no mmaplock-prof report lines (interval, summary, demo or study)"
    );
}
