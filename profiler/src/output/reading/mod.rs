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

use super::report::{Report, SCHEMA_VERSION, unsupported_version};
pub use lines::{DemoLine, StudyLine, StudyRun};
use words::{explain, message};

mod lines;
mod words;

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
        "summary" => {
            let mut r: Report = typed(bytes)?;
            r.derive_flames();
            Line::Summary(r)
        }
        "demo" => {
            let mut d: DemoLine = typed(bytes)?;
            d.runs.iter_mut().for_each(|r| r.report.derive_flames());
            Line::Demo(d)
        }
        _ => Line::Study(typed(bytes)?),
    }))
}

/// A whole line as `T`, or what is wrong with it and where.
fn typed<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| explain(bytes, &e))?;
    de.end()
        .map_err(|e| format!("not JSON: {} (column {})", message(&e), e.column()))?;
    Ok(value)
}

#[cfg(test)]
mod tests;
