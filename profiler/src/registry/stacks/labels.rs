//! How sampled frames are named and charged: the DSO a write is charged to, a frame's label,
//! and where its JavaScript name came from.

use std::path::Path;

use crate::registry::{
    perfmap::{JitName, JsFunction},
    unwind::Frame,
    v8::Resolved,
};

use super::JsFrameCounts;

/// The C and C++ runtimes: frames in them are skipped when charging a write.
fn is_runtime(dso: &Path) -> bool {
    let Some(name) = dso.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    [
        "libc.so",
        "libc-",
        "ld-linux",
        "ld-",
        "libstdc++",
        "libgcc_s",
        "libpthread",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// A frame's JavaScript function: read from the heap, else from the perf map.
pub(super) fn js_of(f: &Frame) -> Option<&JsFunction> {
    match (&f.v8, &f.jit) {
        (Some(Resolved::Named(js)), _) => Some(js),
        (_, Some(JitName::Js(js))) => Some(js),
        _ => None,
    }
}

/// How a frame is shown (see [`SampledFrame::label`](super::SampledFrame::label)).
#[cfg(test)]
pub(super) fn frame_label(f: &Frame) -> String {
    super::SampledFrame::of(f).label()
}

/// The DSO a write is charged to (see the module doc).
pub fn charge(frames: &[Frame]) -> String {
    for f in frames {
        match &f.dso {
            Some(d) if is_runtime(d) => continue,
            Some(d) => return d.display().to_string(),
            None => return "[jit]".to_string(),
        }
    }
    "[unknown]".to_string()
}

/// Counts a frame's JavaScript name by its source(s).
pub(super) fn count_js_frame(c: &mut JsFrameCounts, f: &Frame, n: u64) {
    let perf = match &f.jit {
        Some(JitName::Js(js)) => Some(js),
        _ => None,
    };
    match (&f.v8, perf) {
        (Some(Resolved::Named(a)), Some(b)) if a == b => c.agree += n,
        (Some(Resolved::Named(_)), Some(_)) => c.disagree += n,
        (Some(Resolved::Named(_)), None) => c.v8 += n,
        (_, Some(_)) => c.perf_map += n,
        (Some(Resolved::Unknown), None) => c.unknown += n,
        (None, None) => {}
    }
}
