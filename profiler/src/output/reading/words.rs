//! What is wrong with a line, in words for people: serde's errors, with the field's path.

use serde_path_to_error::{Error, Segment};

use crate::output::report::LockReport;

type PathError = Error<serde_json::Error>;

/// Where in a thread's or process's [`LockReport`] a wrong value is: serde reads a flattened
/// part from a buffer and loses its path (serde-rs/serde#1183), so the record the error names
/// is read again as that part alone. None when the error lies elsewhere.
fn in_lock_report(bytes: &[u8], e: &PathError) -> Option<(String, serde_json::Error)> {
    let segments: Vec<&Segment> = e.path().iter().collect();
    let [.., Segment::Map { key }, Segment::Seq { .. }] = segments[..] else {
        return None;
    };
    if key != "processes" && key != "threads" {
        return None;
    }
    let line: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut record = &line;
    for segment in segments {
        record = match segment {
            Segment::Seq { index } => record.get(index)?,
            Segment::Map { key } => record.get(key)?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    if !record.is_object() {
        return None;
    }
    let inner = serde_path_to_error::deserialize::<_, LockReport>(record).err()?;
    // The record's path is never the root (it ends in an index).
    let (outer, part) = (e.path().to_string(), inner.path().to_string());
    let path = if part == "." {
        outer
    } else {
        format!("{outer}.{part}")
    };
    Some((path, inner.into_inner()))
}

/// serde_json's message without its position (the line is named apart, and is always 1).
pub(super) fn message(e: &serde_json::Error) -> String {
    let m = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    m.strip_suffix(&at).unwrap_or(&m).to_string()
}

/// `path: problem`, in words for people; `bytes` is the line.
pub(super) fn explain(bytes: &[u8], e: &PathError) -> String {
    let refined = in_lock_report(bytes, e);
    let (path, inner) = match &refined {
        Some((path, inner)) => (path.clone(), inner),
        None => (e.path().to_string(), e.inner()),
    };
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
