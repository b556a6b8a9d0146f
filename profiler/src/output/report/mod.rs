//! The report model (JSON contract, `schema_version` 1, see docs/report-format.md), built by
//! a pure function of a window of activity and its attribution.
//!
//! The model is in three parts, re-exported here so that every type is `report::Type`: the
//! report line and its version (this file), one process's and thread's records
//! (`process.rs`), what a run lost, left uncounted and cost (`costs.rs`); building it from a
//! window is `build.rs`.

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, de};

use crate::vocab::Mode;

#[cfg(test)]
mod bounded;
pub mod budget;
mod build;
mod costs;
mod minor;
mod process;
mod roles;
mod samples;
mod selected;
#[cfg(test)]
mod tests;
pub mod thread_groups;
mod trigger;

pub use super::blockers::{BlockerReport, RoleBlock};
pub use super::share::{RoleShare, TimeShare};
pub use super::stats::{Dist, Stats};
pub use build::{add_stacks, build, dso_reports};
pub use costs::{Lost, Overhead, Uncounted};
pub use minor::{MinorProcesses, MinorTotals, group};
pub use process::{
    CauseReport, DsoReport, FlameStack, HolderFunctionReport, JsFramesReport, JsFunctionReport,
    LockReport, MAX_STACK_CUTS, ProcessReport, ProfilerShare, StackCutReport, StackReport,
    StackWork, ThreadReport,
};
pub use roles::role_totals;
pub use samples::{
    FrameReport, SampleCut, SampleReport, SampledStacks, sampled_stacks, sampled_stacks_by,
    stack_cuts,
};
pub use selected::{SelectedBy, SelectedHow};
pub use thread_groups::ThreadGroupReport;
pub use trigger::{
    CAPTURE, CROSSING, Trigger, TriggerFunction, TriggerMeasure, lines as trigger_lines,
    verdict_line,
};

/// The report format's major version. Fields are only ever added within one (readers ignore
/// those they do not know, and take those they know but a file lacks as absent); a file of
/// another version is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// `schema_version`, which must be this build's.
pub fn schema_version<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u64::deserialize(d)?;
    if v != u64::from(SCHEMA_VERSION) {
        return Err(de::Error::custom(unsupported_version(v)));
    }
    Ok(SCHEMA_VERSION)
}

/// What is said of a file of another major version.
pub fn unsupported_version(v: u64) -> String {
    format!(
        "version {v} of the report format is not supported: this build reads version {SCHEMA_VERSION}"
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Interval,
    Summary,
}

/// One line of the report. Read back (`report`, `compare`), fields of the base contract
/// (docs/cli-and-report.md) are required and every later one optional (absent or empty when a
/// file lacks it); fields a file has that this build does not know are ignored.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub kind: Kind,
    #[serde(deserialize_with = "schema_version")]
    pub schema_version: u32,
    /// What the run measured: every acquisition (`full`), or only contended waits
    /// (`contention`: counts and waits are those of the waits that went to the lock's slow
    /// path; holds are not measured). A line without it is full mode's.
    #[serde(default)]
    pub mode: Mode,
    pub start: String,
    pub end: String,
    pub interval_s: Option<f64>,
    pub duration_s: Option<f64>,
    /// Summary: the interval reports the run made, written or not (`lost.output`).
    pub intervals: Option<u64>,
    pub processes: Vec<ProcessReport>,
    pub lost: Lost,
    #[serde(default)]
    pub uncounted: Uncounted,
    /// Present when the kernel's BPF statistics are on (`--bpf-stats`, or
    /// `sysctl kernel.bpf_stats_enabled=1`).
    pub overhead: Option<Overhead>,
    /// With stack sampling: one in how many writes per thread had its stack taken.
    pub stack_sample: Option<u32>,
    /// Summary, with stack sampling: what the sampled stacks cost the profiler.
    pub stack_work: Option<StackWork>,
    /// Summary: the patterns recognised in it, what they cost and what to change
    /// (docs/findings.md). Never read back: derived from the rest of the summary, they are
    /// recomputed by whatever reads a file (`report`, `compare`), with this build's patterns.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub findings: Option<Vec<crate::output::findings::Finding>>,
    /// Summary: the processes not in `processes` (they did not wait materially, and others
    /// waited longer), grouped by command with their totals; absent when every process is
    /// listed (none to group, `--all-processes`, interval lines, older builds).
    pub minor_processes: Option<MinorProcesses>,
    /// An agent's capture: why it was taken (the window that crossed `--escalate-at`), and
    /// how the capture compares (docs/agent.md).
    pub trigger: Option<Box<Trigger>>,
    /// Not part of the report: whoever renders it was asked for every process
    /// (`--all-processes`), which the text and the page then show each in full.
    #[serde(skip)]
    pub show_all: bool,
    /// Not part of the report: it is no summary line but the sum of this many interval lines
    /// of a file without one (a run still going, or cut), which the text and the page say.
    #[serde(skip)]
    pub summed_lines: Option<usize>,
}

impl Report {
    /// A summary of nothing, for tests of what is built around reports.
    #[cfg(test)]
    pub fn empty_for_tests() -> Report {
        Report {
            kind: Kind::Summary,
            schema_version: SCHEMA_VERSION,
            mode: Mode::Full,
            start: String::new(),
            end: String::new(),
            interval_s: None,
            duration_s: Some(0.0),
            intervals: None,
            processes: Vec::new(),
            lost: Lost::default(),
            uncounted: Uncounted::default(),
            overhead: None,
            stack_sample: None,
            stack_work: None,
            findings: None,
            minor_processes: None,
            trigger: None,
            show_all: false,
            summed_lines: None,
        }
    }
}

impl Report {
    /// Contention mode measures no hold: every `hold_ns` goes, so that no zero reads as a
    /// measured hold.
    pub fn drop_unmeasured(&mut self) {
        if self.mode != Mode::Contention {
            return;
        }
        for p in &mut self.processes {
            p.lock.drop_holds();
            for t in &mut p.threads {
                t.lock.drop_holds();
            }
            for d in p.dsos.iter_mut().flatten() {
                d.write.hold_ns = None;
            }
            if let Some(o) = p.profiler.as_mut() {
                o.read.hold_ns = None;
                o.write.hold_ns = None;
            }
            if let Some(s) = p.samples.as_mut() {
                s.drop_holds();
            }
        }
    }
}

impl Report {
    /// Each process's `flame` from its `samples`, where the line has none (this build writes
    /// none: it is `samples` again): the page's flame graph and the findings read it.
    pub fn derive_flames(&mut self) {
        for p in &mut self.processes {
            if p.flame.is_none()
                && let Some(s) = &p.samples
            {
                p.flame = Some(s.folded_writes());
            }
        }
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// What a report covers besides the activity: its kind and time span, what was lost or left
/// uncounted, and the profiler's own cost.
pub struct Meta {
    pub kind: Kind,
    pub mode: Mode,
    pub start: SystemTime,
    pub end: SystemTime,
    pub lost: Lost,
    pub uncounted: Uncounted,
    pub overhead: Option<Overhead>,
}

#[cfg(test)]
pub fn to_json_line(r: &Report) -> String {
    serde_json::to_string(r).expect("reports contain only serialisable values")
}
