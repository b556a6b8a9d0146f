//! A process's figures over time, from a run's interval lines: its writes and reads and their
//! wait per line, kept to at most [`MAX_POINTS`] points however long the run (the page draws
//! them, `report`'s text tabulates them).

use super::report::LockReport;

/// Points kept per process (a chart is a few hundred pixels wide).
pub const MAX_POINTS: usize = 1000;

/// A process's figures per interval line: one point per line, or past [`MAX_POINTS`] lines
/// one per run of consecutive lines (then read as their mean per line).
#[derive(Default)]
pub struct Series {
    points: Vec<Point>,
    /// Lines a full point stands for (a power of two).
    per_point: u32,
}

/// The lines of one point, added up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    /// The end of the last line of the point, in seconds since the epoch.
    pub end_s: f64,
    /// Write wait and writes.
    pub wait_ns: u64,
    pub writes: u64,
    /// Read wait and reads.
    pub read_wait_ns: u64,
    pub reads: u64,
    /// Lines added into it.
    pub lines: u32,
}

impl Point {
    fn of(end_s: f64, lock: &LockReport) -> Point {
        Point {
            end_s,
            wait_ns: lock.write.wait_ns.sum,
            writes: lock.write.count,
            read_wait_ns: lock.read.wait_ns.sum,
            reads: lock.read.count,
            lines: 1,
        }
    }

    /// `o` added to it, ending where `o` ends.
    pub fn merge(&mut self, o: &Point) {
        self.end_s = self.end_s.max(o.end_s);
        self.wait_ns = self.wait_ns.saturating_add(o.wait_ns);
        self.writes = self.writes.saturating_add(o.writes);
        self.read_wait_ns = self.read_wait_ns.saturating_add(o.read_wait_ns);
        self.reads = self.reads.saturating_add(o.reads);
        self.lines += o.lines;
    }
}

impl Series {
    /// A line that ended at `end_s` (seconds since the epoch), with this process's lock.
    pub fn push(&mut self, end_s: f64, lock: &LockReport) {
        self.per_point = self.per_point.max(1);
        let p = Point::of(end_s, lock);
        match self.points.last_mut() {
            Some(last) if last.lines < self.per_point => last.merge(&p),
            _ => self.points.push(p),
        }
        if self.points.len() > MAX_POINTS {
            self.points = self
                .points
                .chunks(2)
                .map(|c| {
                    let mut m = c[0];
                    c[1..].iter().for_each(|p| m.merge(p));
                    m
                })
                .collect();
            self.per_point *= 2;
        }
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The points merged into at most `rows`, consecutive ones together, as many in each
    /// (the last may have fewer).
    pub fn rows(&self, rows: usize) -> Vec<Point> {
        let per = self.points.len().div_ceil(rows.max(1)).max(1);
        self.points
            .chunks(per)
            .map(|c| {
                let mut m = c[0];
                c[1..].iter().for_each(|p| m.merge(p));
                m
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures::stats;

    fn lock(writes: u64, wait: u64, reads: u64, read_wait: u64) -> LockReport {
        LockReport {
            write: stats(writes, wait, wait, &[]),
            read: stats(reads, read_wait, read_wait, &[]),
            ..LockReport::default()
        }
    }

    #[test]
    fn a_long_run_keeps_a_bounded_series_of_means_per_line() {
        let mut s = Series::default();
        for i in 0..10 * MAX_POINTS as u64 + 3 {
            // Every line: 2 writes and 10 ns of wait, 1 read of 5 ns, but every 4th line 6
            // writes.
            let writes = if i % 4 == 3 { 6 } else { 2 };
            s.push(i as f64, &lock(writes, 10, 1, 5));
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
        assert_eq!((p[0].reads, p[0].read_wait_ns), (16, 80));
        assert_eq!(p[0].end_s, 15.0);
        assert_eq!(p.last().unwrap().end_s, (10 * MAX_POINTS + 2) as f64);
        // A short run: a point per line.
        let mut short = Series::default();
        short.push(1.0, &lock(10, 40, 0, 0));
        short.push(2.0, &lock(10, 60, 3, 7));
        assert_eq!(short.points().len(), 2);
        assert_eq!(short.points()[1].lines, 1);
        // Tabulated in at most 12 rows, consecutive points together, nothing lost.
        let rows = s.rows(12);
        assert!(rows.len() <= 12, "{}", rows.len());
        let sum = |f: fn(&Point) -> u64, v: &[Point]| v.iter().map(f).sum::<u64>();
        assert_eq!(sum(|p| p.writes, &rows), sum(|p| p.writes, p));
        assert_eq!(sum(|p| p.read_wait_ns, &rows), sum(|p| p.read_wait_ns, p));
        assert_eq!(short.rows(12).len(), 2);
    }
}
