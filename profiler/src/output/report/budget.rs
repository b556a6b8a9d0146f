//! A summary line at most [`MAX_PROCESS_BYTES`] per process, whatever its threads and
//! stacks: a process whose entry is larger is cut, the least telling parts first (its
//! sampled stacks that waited least, into `samples.cut`; then its listed threads that
//! waited least, into `thread_groups`; then its JavaScript functions and holders' functions
//! that waited least), and what was cut is counted in its `trimmed` (and said by the text
//! and the page). Nothing is dropped without a count: the process's own figures (`write`,
//! `read`, causes, roles, the groups' totals) are whole.

use serde::{Deserialize, Serialize};

use super::{HolderFunctionReport, JsFunctionReport, ProcessReport, Report};

/// At most this many bytes of JSON per process in a summary.
pub const MAX_PROCESS_BYTES: usize = 1 << 20;

/// Rows of a table cut: how many, and what they held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowsCut {
    pub rows: u64,
    /// Their sampled acquisitions (writes or waits) and their wait.
    pub count: u64,
    pub wait_ns_sum: u64,
}

/// What a process's entry lost to [`MAX_PROCESS_BYTES`].
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trimmed {
    /// Its entry's size before, bytes.
    pub bytes: u64,
    /// Sampled stacks moved into `samples.cut`.
    pub samples: Option<u64>,
    /// Listed threads moved into `thread_groups` (`past_listed`).
    pub threads: Option<u64>,
    /// `js_functions` and `holder_functions` rows cut.
    pub js_functions: Option<RowsCut>,
    pub holder_functions: Option<RowsCut>,
}

/// Bytes of `p` as JSON, counted without being kept.
fn size(p: &ProcessReport) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, p);
    c.0
}

/// The `keep` first rows of a table, the rest counted.
fn cut_rows<T>(rows: &mut Vec<T>, keep: usize, of: impl Fn(&T) -> (u64, u64)) -> Option<RowsCut> {
    if rows.len() <= keep {
        return None;
    }
    let mut c = RowsCut::default();
    for r in rows.drain(keep..) {
        let (n, w) = of(&r);
        c.rows += 1;
        c.count += n;
        c.wait_ns_sum += w;
    }
    Some(c)
}

fn add(into: &mut Option<RowsCut>, c: Option<RowsCut>) {
    if let Some(c) = c {
        let e = into.get_or_insert_default();
        e.rows += c.rows;
        e.count += c.count;
        e.wait_ns_sum += c.wait_ns_sum;
    }
}

/// Cuts `p` down to `max` bytes of JSON, if it is larger (see the module's doc).
pub fn bound_process(p: &mut ProcessReport, max: usize) {
    let before = size(p);
    if before <= max {
        return;
    }
    let mut t = Trimmed {
        bytes: before as u64,
        ..Trimmed::default()
    };
    let mut now = before;
    // Each step keeps about the share of its part that fits, at least halving it.
    let keep =
        |n: usize, now: usize| ((n as f64 * max as f64 / now as f64 * 0.9) as usize).min(n / 2);
    while now > max {
        let stacks = p.samples.as_ref().map_or(0, |s| s.stacks.len());
        let listed = p.threads.len();
        let js = p.js_functions.as_ref().map_or(0, Vec::len);
        let held = p.holder_functions.as_ref().map_or(0, Vec::len);
        if stacks > 0 {
            let k = keep(stacks, now);
            if let Some(s) = p.samples.as_mut() {
                s.keep_first(k);
            }
            *t.samples.get_or_insert(0) += (stacks - k) as u64;
        } else if listed > 1 {
            let k = keep(listed, now).max(1);
            super::thread_groups::regroup(p, k);
            *t.threads.get_or_insert(0) += (listed - k) as u64;
        } else if js + held > 1 {
            let of_js = |f: &JsFunctionReport| (f.writes, f.wait_ns_sum);
            let of_held = |f: &HolderFunctionReport| (f.waits, f.wait_ns_sum);
            if let Some(rows) = p.js_functions.as_mut() {
                add(&mut t.js_functions, cut_rows(rows, keep(js, now), of_js));
            }
            if let Some(rows) = p.holder_functions.as_mut() {
                add(
                    &mut t.holder_functions,
                    cut_rows(rows, keep(held, now), of_held),
                );
            }
        } else {
            // Nothing left to cut but the process's own figures.
            break;
        }
        now = size(p);
    }
    // The flame graph's stacks are what is left of the samples, as a reader derives them.
    if t.samples.is_some() {
        p.flame = p.samples.as_ref().map(super::SampledStacks::folded_writes);
    }
    p.trimmed = Some(t);
}

/// Every process of a summary within [`MAX_PROCESS_BYTES`].
pub fn bound(r: &mut Report) {
    for p in &mut r.processes {
        bound_process(p, MAX_PROCESS_BYTES);
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
