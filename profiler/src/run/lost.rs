//! A shortfall is said when it happens, not only in the summary: the first time a `lost`
//! reason becomes non-zero during a run (one-shot or agent), one line on standard error names
//! it, with the count so far and what to do.

use std::{collections::BTreeSet, sync::Mutex};

use crate::output::{lost_reasons, report::Lost};

/// The reasons already said (once per process: the demo's two runs say a reason once).
static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// What to do about a reason (docs/report-format.md, `lost`).
fn advice(reason: &str) -> &'static str {
    match reason {
        "map_full" => {
            "the kernel's statistics map is full: raise --max-threads (4 entries per thread)"
        }
        "stacks" => {
            "sampled stacks were dropped (the profiler fell behind): raise --stack-sample to sample fewer writes"
        }
        "ring_full" => "a thread's pending ring was full while flushed",
        "no_state" => "the kernel could not allocate a thread's state (memory)",
        "nested" => "a thread took a third mm lock at once",
        "exit_flush" => "a freed thread's last acquisitions could not be reached",
        "output" => {
            "their reader (a pipe, a slow disk) fell behind and the queue of reports to write was full; the run's counts are all kept, and the summary is written whole"
        }
        "skipped" => {
            "the kernel skipped the profiler's programs (preempted inside them on the same CPU): counts may fall short by as many"
        }
        _ => "see docs/report-format.md, `lost`",
    }
}

/// Says each reason that is non-zero for the first time: called after each reading of the
/// kernel's counters, once more at the end of a run, and when the output drops a report.
pub fn check(lost: &Lost) {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    for (reason, n) in lost_reasons(lost) {
        if n > 0 && said.insert(reason.clone()) {
            let what = match reason.as_str() {
                "stacks" => "sampled stacks",
                "skipped" => "events",
                "output" => "interval reports",
                _ => "acquisitions",
            };
            eprintln!(
                "mmaplock-prof: {n} {what} not counted so far (lost.{reason}): {}",
                advice(&reason)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_a_reason_once() {
        let lost = Lost {
            map_full: 3,
            ..Lost::default()
        };
        check(&lost);
        check(&lost);
        assert!(SAID.lock().unwrap().contains("map_full"));
        let reasons: Vec<String> = lost_reasons(&lost).into_iter().map(|r| r.0).collect();
        for r in [
            "map_full",
            "stacks",
            "nested",
            "no_state",
            "ring_full",
            "exit_flush",
            "exit_pending",
            "skipped",
            "output",
        ] {
            assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
        }
        assert!(!reasons.iter().any(|x| x == "events"));
    }
}
