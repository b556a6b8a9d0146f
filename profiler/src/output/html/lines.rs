//! What a run's page keeps of its lines, read one at a time: the last summary (or the runs of
//! a demo line, or a study's results), the interval lines summed while no summary has come,
//! and per process its figures over time, at most `series::MAX_POINTS` of them. Memory therefore
//! follows the processes and threads of the run, not the number of its lines.

use std::{borrow::Cow, collections::BTreeMap};

pub use crate::output::series::Series;
use crate::output::{
    findings::{self, Finding, StudyEffects},
    partial::Summed,
    reading::{Keep, Line, StudyLine},
    report::{Kind, Report},
};

/// The lines of a run, as far as its page needs them. A file may hold several runs one after
/// the other (each ends with its summary): the last summary is drawn.
#[derive(Default)]
pub struct RunLines {
    /// The last summary line.
    pub summary: Option<Report>,
    /// The runs of demo lines, each drawn.
    pub demo: Vec<Report>,
    pub study: Option<StudyLine>,
    /// Interval lines read, the first's start and the last's end.
    pub intervals: usize,
    pub first_start: Option<String>,
    pub last_end: Option<String>,
    /// By (pid, start_ticks).
    series: BTreeMap<(u32, u64), Series>,
    /// The interval lines summed, until a summary comes.
    summed: Summed,
}

impl Keep for RunLines {
    fn add(&mut self, line: Line) {
        match line {
            Line::Interval(r) => self.add_report(&r),
            Line::Summary(r) => self.summary = Some(r),
            Line::Demo(d) => self.demo.extend(d.runs.into_iter().map(|r| r.report)),
            Line::Study(s) => {
                self.study.get_or_insert(s);
            }
        }
    }
}

impl RunLines {
    /// Adds a report as the profiler writes it (`--html`): a summary is kept whole, an
    /// interval line only as far as the page needs it.
    pub fn add_report(&mut self, r: &Report) {
        if r.kind == Kind::Summary {
            self.summary = Some(r.clone());
            return;
        }
        self.intervals += 1;
        self.first_start.get_or_insert_with(|| r.start.clone());
        self.last_end = Some(r.end.clone());
        if self.summary.is_none() {
            self.summed.add(r);
        }
        let Some(end) = seconds_of(&r.end) else {
            return;
        };
        for p in &r.processes {
            self.series
                .entry((p.pid, p.start_ticks))
                .or_default()
                .push(end, &p.lock);
        }
    }

    /// A process's figures over time.
    pub fn series(&self, pid: u32, start_ticks: u64) -> Option<&Series> {
        self.series.get(&(pid, start_ticks))
    }

    /// The interval lines summed into a summary, when no summary line came.
    pub fn summed(&self) -> Option<Report> {
        (self.summary.is_none() && self.summed.lines() > 0).then(|| self.summed.report())
    }

    /// The summaries a page draws and `report` finds patterns in: a demo's runs (and a
    /// summary line, if the file has one too), else the last summary, else the interval lines
    /// summed.
    pub fn shown(&self) -> Vec<Cow<'_, Report>> {
        if !self.demo.is_empty() {
            return self
                .demo
                .iter()
                .chain(&self.summary)
                .map(Cow::Borrowed)
                .collect();
        }
        match &self.summary {
            Some(s) => vec![Cow::Borrowed(s)],
            None => self.summed().map(Cow::Owned).into_iter().collect(),
        }
    }

    /// The findings of the summaries shown: those a summary carries (the profiler's own, with
    /// its `--study`; never a file's, which are not read), else recomputed with `study`.
    pub fn findings(&self, study: Option<&StudyEffects>) -> Vec<Finding> {
        self.shown()
            .iter()
            .flat_map(|s| match &s.findings {
                Some(f) => f.clone(),
                None => findings::find(s, study),
            })
            .collect()
    }
}

/// Seconds since the epoch of an RFC 3339 time.
pub fn seconds_of(t: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(t).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}
