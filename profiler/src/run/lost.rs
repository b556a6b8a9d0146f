//! A shortfall is said when it happens, not only in the summary: the first time a `lost`
//! reason becomes non-zero during a run (one-shot or agent), one line on standard error names
//! it, with the count so far and what to do: an option to set only where the user sets the
//! options ([`Advice`]; the demo sets its own).

use std::{collections::BTreeSet, sync::Mutex};

use crate::output::{lost_reasons, report::Lost};

/// The reasons already said (once per process: the demo's two runs say a reason once).
static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Who set the run's options, so that advice names only an option its user can set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Advice {
    /// The user, on the profiler's command line (the one-shot profiler, the agent).
    #[default]
    CommandLine,
    /// The command itself, for a workload it runs (the demo, the study): none to name.
    OwnWorkload,
}

/// What to do about a reason (docs/report-format.md, `lost`).
fn advice(reason: &str, who: Advice) -> &'static str {
    let own = who == Advice::OwnWorkload;
    match reason {
        "map_full" if own => "the kernel's statistics map is full",
        "map_full" => {
            "the kernel's statistics map is full: raise --max-threads (4 entries per thread)"
        }
        "stacks" if own => {
            "sampled stacks were dropped while the profiler fell behind (its backlog of stacks to unwind was full): the counts are exact, fewer writes are charged to code"
        }
        "stacks" => {
            "sampled stacks were dropped (the profiler fell behind): raise --stack-sample to sample fewer writes"
        }
        "output" => {
            "their reader (a pipe, a slow disk) fell behind and the queue of reports to write was full; the run's counts are all kept, and the summary is written whole"
        }
        "ring_full" => "a thread's pending ring was full while flushed",
        "holder_stacks" => {
            "the stacks of some writers that sampled waits began behind could not be taken: the waits are counted and charged to their holders all the same"
        }
        "no_state" => "the kernel could not allocate a thread's state (memory)",
        "nested" => "a thread took a third mm lock at once",
        "exit_flush" => "a freed thread's last acquisitions could not be reached",
        "skipped" => {
            "the kernel skipped the profiler's programs (preempted inside them on the same CPU): counts may fall short by as many"
        }
        _ => "see docs/report-format.md, `lost`",
    }
}

/// The line said of a reason the first time it is non-zero.
fn line(reason: &str, n: u64, who: Advice) -> String {
    let what = match reason {
        "stacks" => "sampled stacks",
        "skipped" => "events",
        "output" => "interval reports",
        "holder_stacks" => "holders' stacks",
        _ => "acquisitions",
    };
    format!(
        "mmaplock-prof: {n} {what} not counted so far (lost.{reason}): {}",
        advice(reason, who)
    )
}

/// Says each reason that is non-zero for the first time: called after each reading of the
/// kernel's counters, once more at the end of a run, and when the output drops a report.
pub fn check(lost: &Lost, who: Advice) {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    for (reason, n) in lost_reasons(lost) {
        if n > 0 && said.insert(reason.clone()) {
            eprintln!("{}", line(&reason, n, who));
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
        check(&lost, Advice::CommandLine);
        check(&lost, Advice::CommandLine);
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
            "holder_stacks",
        ] {
            assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
        }
        assert!(!reasons.iter().any(|x| x == "events"));
    }

    #[test]
    fn a_workload_the_command_runs_itself_is_advised_no_option() {
        let reasons: Vec<String> = lost_reasons(&Lost::default())
            .into_iter()
            .map(|r| r.0)
            .collect();
        for r in &reasons {
            let own = line(r, 401, Advice::OwnWorkload);
            assert!(!own.contains("--"), "{own}");
        }
        // The demo's line of issue 35, as it is now said.
        let demo = line("stacks", 401, Advice::OwnWorkload);
        assert!(
            demo.starts_with(
                "mmaplock-prof: 401 sampled stacks not counted so far (lost.stacks): "
            ),
            "{demo}"
        );
        assert!(demo.contains("backlog"), "{demo}");
        // The command line's user is told what to set.
        assert!(line("stacks", 401, Advice::CommandLine).contains("raise --stack-sample"));
        assert!(line("map_full", 1, Advice::CommandLine).contains("raise --max-threads"));
    }
}
