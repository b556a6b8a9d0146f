//! Reading reports back (`report`, `compare`): newline-delimited JSON, one line at a time,
//! into the report's own types.
//!
//! A file is data from anyone: each line is checked against the types (wrong types, values
//! out of range, missing fields of the base contract, bucket bounds that are not the kernel's,
//! another major `schema_version`) and the first problem ends the reading with one line naming
//! the file, the line and the field. Lines are read one at a time and handed on: what is kept
//! is up to the reader of the lines, so memory follows what an output needs, not the file's
//! size (a line itself may be up to [`MAX_LINE`] long).

use std::{
    io::{self, BufRead, BufReader, Read},
    path::Path,
};

use serde::{Deserialize, de::DeserializeOwned};

use super::{
    compare::Spread,
    report::{Report, SCHEMA_VERSION, Stats, unsupported_version},
};

/// The longest line read: far beyond any summary (tens of megabytes for ten thousand
/// threads), and a bound on what one line can cost.
pub const MAX_LINE: u64 = 1 << 30;

/// A file that is not what `report` or `compare` reads.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: io::Error,
    },
    /// `what` names the field and the problem, or says the line is not JSON.
    #[error("{file}:{line}: {what}")]
    Line {
        file: String,
        line: usize,
        what: String,
    },
    #[error("{0}: no mmaplock-prof report lines (interval, summary, demo or study)")]
    Empty(String),
}

/// One line of a file, by its `type`.
pub enum Line {
    Interval(Report),
    Summary(Report),
    Demo(DemoLine),
    Study(StudyLine),
}

/// `mmaplock-prof demo --format json`: a summary per run.
#[derive(Deserialize)]
pub struct DemoLine {
    pub runs: Vec<DemoRun>,
}

#[derive(Deserialize)]
pub struct DemoRun {
    pub report: Report,
}

/// A study's `results.json`, as far as its page draws it and the findings quote it.
#[derive(Deserialize)]
pub struct StudyLine {
    pub runs: Vec<StudyRun>,
    #[serde(default)]
    pub ranking_text: Option<String>,
    /// The study's host.
    #[serde(default)]
    pub machine: StudyMachine,
    /// Runs of every cell (absent before repeats: one).
    #[serde(default)]
    pub repeat: Option<u32>,
    /// Each scenario against `default`, with Worker threads, per file size.
    #[serde(default)]
    pub ranking: Vec<StudyRanked>,
    /// The investigation's claims judged (absent from studies without repeats).
    #[serde(default)]
    pub claims: Option<Vec<StudyClaim>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub struct StudyMachine {
    pub kernel: String,
    pub node: String,
    pub cpus: u64,
}

/// One row of a study's ranking. Studies without repeats have the ratios alone.
#[derive(Deserialize)]
pub struct StudyRanked {
    pub file_kib: f64,
    pub scenario: String,
    pub throughput_ratio: f64,
    pub writes_ratio: f64,
    #[serde(default)]
    pub throughput: Option<Spread>,
    #[serde(default)]
    pub writes: Option<Spread>,
    #[serde(default)]
    pub throughput_verdict: Option<String>,
    #[serde(default)]
    pub writes_verdict: Option<String>,
}

/// One of the investigation's claims, judged on the study's runs.
#[derive(Deserialize)]
pub struct StudyClaim {
    pub scenario: String,
    pub claim: String,
    pub verdict: String,
    #[serde(default)]
    pub throughput: Option<Spread>,
    #[serde(default)]
    pub writes: Option<Spread>,
}

#[derive(Deserialize)]
pub struct StudyRun {
    pub scenario: String,
    pub mode: String,
    pub k: u32,
    pub file_kib: f64,
    pub ops_per_s: f64,
    /// Write acquisitions pooled over the run's processes.
    pub write: Stats,
}

/// What every line says first: its type and format version.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    schema_version: Option<u64>,
}

/// What an output keeps of the lines it is handed, one at a time.
pub trait Keep: Default {
    fn add(&mut self, line: Line);

    /// What it keeps of a file.
    fn read_file(path: &Path) -> Result<Self, InputError> {
        let mut k = Self::default();
        read_file(path, |l| k.add(l))?;
        Ok(k)
    }

    /// What it keeps of newline-delimited JSON; `name` names it in errors.
    #[cfg(test)]
    fn parse(name: &str, text: &str) -> Result<Self, InputError> {
        let mut k = Self::default();
        read(name, text.as_bytes(), |l| k.add(l))?;
        Ok(k)
    }
}

/// Reads a file, handing each report line to `each`; a file without any is refused.
pub fn read_file(path: &Path, each: impl FnMut(Line)) -> Result<(), InputError> {
    let file = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| InputError::Read {
        file: file.clone(),
        source,
    })?;
    read(&file, BufReader::with_capacity(1 << 16, f), each)
}

/// Reads newline-delimited JSON; `file` names it in errors.
pub fn read(
    file: &str,
    mut input: impl BufRead,
    mut each: impl FnMut(Line),
) -> Result<(), InputError> {
    let mut buf = Vec::new();
    let (mut number, mut reports) = (0usize, 0usize);
    loop {
        buf.clear();
        let got = (&mut input)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| InputError::Read {
                file: file.to_string(),
                source,
            })?;
        if got == 0 {
            break;
        }
        number += 1;
        let bad = |what: String| InputError::Line {
            file: file.to_string(),
            line: number,
            what,
        };
        if buf.len() as u64 > MAX_LINE {
            return Err(bad("a line longer than 1 GiB: not a report line".into()));
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some(line) = parse_line(&buf).map_err(bad)? {
            reports += 1;
            each(line);
        }
        // A long line's buffer is not kept beside what the reader keeps of it.
        if buf.capacity() > 1 << 20 {
            buf = Vec::new();
        }
    }
    if reports == 0 {
        return Err(InputError::Empty(file.to_string()));
    }
    Ok(())
}

/// One line: None for a line of a type this build does not know (a later addition).
fn parse_line(bytes: &[u8]) -> Result<Option<Line>, String> {
    // serde would also take a struct's fields as an array, in order.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        let _: serde::de::IgnoredAny = typed(bytes)?;
        return Err("not a report line: expected a JSON object".into());
    }
    let head: Head = typed(bytes)?;
    let Some(kind) = head.kind else {
        return Ok(None);
    };
    if !matches!(kind.as_str(), "interval" | "summary" | "demo" | "study") {
        return Ok(None);
    }
    match head.schema_version {
        None => return Err("schema_version: missing".into()),
        Some(v) if v != u64::from(SCHEMA_VERSION) => {
            return Err(format!("schema_version: {}", unsupported_version(v)));
        }
        Some(_) => {}
    }
    Ok(Some(match kind.as_str() {
        "interval" => Line::Interval(typed(bytes)?),
        "summary" => Line::Summary(typed(bytes)?),
        "demo" => Line::Demo(typed(bytes)?),
        _ => Line::Study(typed(bytes)?),
    }))
}

/// A whole line as `T`, or what is wrong with it and where.
fn typed<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| explain(&e))?;
    de.end()
        .map_err(|e| format!("not JSON: {} (column {})", message(&e), e.column()))?;
    Ok(value)
}

/// serde_json's message without its position (the line is named apart, and is always 1).
fn message(e: &serde_json::Error) -> String {
    let m = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    m.strip_suffix(&at).unwrap_or(&m).to_string()
}

/// `path: problem`, in words for people.
fn explain(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let (path, inner) = (e.path().to_string(), e.inner());
    let msg = message(inner);
    let at = |field: &str| {
        if path == "." {
            field.to_string()
        } else {
            format!("{path}.{field}")
        }
    };
    if msg.starts_with("number out of range") {
        return format!("{path}: a number out of range");
    }
    if inner.is_syntax() || inner.is_eof() {
        return format!("not JSON: {msg} (column {})", inner.column());
    }
    if let Some(field) = msg
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        return format!("{}: missing", at(field));
    }
    let plain = plain(&msg);
    if path == "." {
        return format!("not a report line: {plain}");
    }
    format!("{path}: {plain}")
}

/// serde's "invalid type: X, expected Y" as "expected Y, found X", in JSON's words.
fn plain(msg: &str) -> String {
    let Some((found, expected)) = ["invalid type: ", "invalid value: "]
        .iter()
        .find_map(|p| msg.strip_prefix(p))
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return msg.to_string();
    };
    let expected = match expected {
        "u64" => "an unsigned integer",
        "u32" => "an unsigned integer below 2^32",
        "f64" => "a number",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "an object",
        e => e,
    };
    let found = match found {
        "map" => "an object".to_string(),
        "sequence" => "an array".to_string(),
        f => match f
            .strip_prefix("floating point `")
            .and_then(|v| v.strip_suffix('`')?.parse::<f64>().ok())
        {
            // serde writes every digit of 1e308.
            Some(v) if v.abs() >= 1e15 => format!("{v:e}"),
            Some(v) => v.to_string(),
            None => ["integer `", "boolean `"]
                .iter()
                .find_map(|p| f.strip_prefix(p)?.strip_suffix('`'))
                .map_or_else(|| f.to_string(), str::to_string),
        },
    };
    format!("expected {expected}, found {found}")
}

#[cfg(test)]
mod tests {
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
        assert!(r.processes[0].causes.is_empty() && r.processes[0].dsos.is_none());
        assert_eq!(r.processes[0].write.count, 3);
        // Nothing a report reads.
        let e = read("x.json", "{\"a\":1}\n".as_bytes(), |_| {}).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.json: no mmaplock-prof report lines (interval, summary, demo or study)"
        );
    }
}
