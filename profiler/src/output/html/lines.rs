//! What a run's page keeps of its lines, read one at a time: the last summary (or the runs of
//! a demo line, or a study's results), the interval lines summed while no summary has come,
//! and per process its figures over time, at most [`MAX_POINTS`] of them. Memory therefore
//! follows the processes and threads of the run, not the number of its lines.

use std::{borrow::Cow, collections::BTreeMap};

use crate::output::{
    findings::{self, Finding, StudyEffects},
    partial::Summed,
    reading::{Keep, Line, StudyLine},
    report::{Kind, Report},
};

/// Points a chart over time keeps per process (it is a few hundred pixels wide).
pub const MAX_POINTS: usize = 1000;

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
            self.series.entry((p.pid, p.start_ticks)).or_default().push(
                end,
                p.lock.write.wait_ns.sum,
                p.lock.write.count,
            );
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

/// A process's write wait and writes per interval line: one point per line, or past
/// [`MAX_POINTS`] lines one per run of consecutive lines (then showing their mean per line).
#[derive(Default)]
pub struct Series {
    points: Vec<Point>,
    /// Lines a full point stands for (a power of two).
    per_point: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The end of the last line of the point, in seconds since the epoch.
    pub end_s: f64,
    pub wait_ns: u64,
    pub writes: u64,
    /// Lines added into it.
    pub lines: u32,
}

impl Series {
    fn push(&mut self, end_s: f64, wait_ns: u64, writes: u64) {
        self.per_point = self.per_point.max(1);
        match self.points.last_mut() {
            Some(p) if p.lines < self.per_point => {
                p.end_s = end_s;
                p.wait_ns = p.wait_ns.saturating_add(wait_ns);
                p.writes = p.writes.saturating_add(writes);
                p.lines += 1;
            }
            _ => self.points.push(Point {
                end_s,
                wait_ns,
                writes,
                lines: 1,
            }),
        }
        if self.points.len() > MAX_POINTS {
            self.points = self
                .points
                .chunks(2)
                .map(|c| {
                    let last = c[c.len() - 1];
                    c[..c.len() - 1].iter().fold(last, |m, p| Point {
                        end_s: last.end_s,
                        wait_ns: m.wait_ns.saturating_add(p.wait_ns),
                        writes: m.writes.saturating_add(p.writes),
                        lines: m.lines + p.lines,
                    })
                })
                .collect();
            self.per_point *= 2;
        }
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_run_keeps_a_bounded_series_of_means_per_line() {
        let mut s = Series::default();
        for i in 0..10 * MAX_POINTS as u64 + 3 {
            // Every line: 2 writes and 10 ns of wait, but every 4th line 6 writes.
            let writes = if i % 4 == 3 { 6 } else { 2 };
            s.push(i as f64, 10, writes);
        }
        let p = s.points();
        assert!(
            p.len() <= MAX_POINTS && p.len() > MAX_POINTS / 2,
            "{}",
            p.len()
        );
        let lines: u32 = p.iter().map(|p| p.lines).sum();
        assert_eq!(lines as usize, 10 * MAX_POINTS + 3);
        // Full points stand for 16 lines: 4 of 6 writes and 12 of 2, 160 ns of wait.
        assert_eq!((p[0].lines, p[0].writes, p[0].wait_ns), (16, 48, 160));
        assert_eq!(p[0].end_s, 15.0);
        assert_eq!(p.last().unwrap().end_s, (10 * MAX_POINTS + 2) as f64);
        // A short run: a point per line, as drawn before.
        let mut short = Series::default();
        short.push(1.0, 40, 10);
        short.push(2.0, 60, 10);
        assert_eq!(short.points().len(), 2);
        assert_eq!(short.points()[1].lines, 1);
    }
}
