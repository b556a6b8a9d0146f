//! A process's waits over time, as a short table: its interval lines merged into at most
//! [`ROWS`] rows, writes and reads side by side (a process may wait most on reads).

use std::fmt::Write as _;

use super::fmt_ns;
use crate::output::series::Series;

/// Rows of the table, whatever the number of interval lines.
const ROWS: usize = 12;

/// The table, or nothing for a series of fewer than two points (one line says nothing of
/// time that the totals do not).
pub fn over_time_text(series: &Series) -> String {
    let points = series.points();
    if points.len() < 2 {
        return String::new();
    }
    let rows = series.rows(ROWS);
    let lines: u32 = points.iter().map(|p| p.lines).sum();
    let per_row = rows.first().map_or(1, |r| r.lines);
    let mut out = format!(
        "\n  wait over time ({lines} interval lines{}):\n  {:>9} {:>9} {:>10} {:>9} {:>10}\n",
        if per_row > 1 {
            format!(", {per_row} a row")
        } else {
            String::new()
        },
        "until",
        "writes",
        "write wait",
        "reads",
        "read wait"
    );
    // Seconds from the end of the series' first line less one line's length, near enough the
    // run's start for a table: the first row ends one of its lines' length after it.
    let t0 = points[0].end_s - line_seconds(series);
    for r in rows {
        let _ = writeln!(
            out,
            "  {:>8.1}s {:>9} {:>10} {:>9} {:>10}",
            r.end_s - t0,
            r.writes,
            fmt_ns(r.wait_ns),
            r.reads,
            fmt_ns(r.read_wait_ns)
        );
    }
    out
}

/// One interval line's length, seconds, as the series' first two points say.
fn line_seconds(series: &Series) -> f64 {
    let p = series.points();
    match p {
        [a, b, ..] if b.lines > 0 => (b.end_s - a.end_s) / f64::from(b.lines),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{fixtures::stats, report::LockReport};

    #[test]
    fn waits_over_time_are_tabulated_in_a_few_rows_reads_beside_writes() {
        let mut s = Series::default();
        for i in 0..30u64 {
            let lock = LockReport {
                write: stats(2, 1000, 600, &[]),
                read: stats(10, 2_000_000 * (i % 3), 1_000_000, &[]),
                ..LockReport::default()
            };
            s.push(100.0 + 0.5 * i as f64, &lock);
        }
        let text = over_time_text(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "  wait over time (30 interval lines, 3 a row):");
        assert_eq!(lines.len(), 3 + 10, "{text}");
        // Three lines a row: 6 writes, 3.0us, 30 reads and 6.00ms of read wait each, the
        // first until 1.5 s.
        let row = format!(
            "  {:>8.1}s {:>9} {:>10} {:>9} {:>10}",
            1.5, 6, "3.0us", 30, "6.00ms"
        );
        assert_eq!(lines[3], row, "{text}");
        let mut one = Series::default();
        one.push(1.0, &LockReport::default());
        assert_eq!(over_time_text(&one), "");
    }
}
