//! The pieces every text view is built of (reports, compare, the demo, the study): durations,
//! shares and sizes as people say them, log2 histograms side by side, names cut to a column.

use crate::output::report::Dist;

/// Human-readable duration: `850ns`, `12.3us`, `4.56ms`, `1.20s`.
pub fn fmt_ns(ns: u64) -> String {
    let n = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", n / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", n / 1e6)
    } else {
        format!("{:.2}s", n / 1e9)
    }
}

pub(super) fn fmt_f(ns: f64) -> String {
    fmt_ns(ns.round() as u64)
}

/// Width of a histogram row's bar, in characters.
pub(super) const BAR_WIDTH: usize = 24;

/// Log2 histogram lines `  <2.0us ████       1234`, over the same bucket range for every
/// histogram passed so that they can stand side by side. Zero-length waits (trylocks) get a
/// row of their own instead of stretching the range down to 1 ns.
pub fn histogram_lines(dists: &[&Dist]) -> Vec<Vec<String>> {
    let bounds: Vec<u64> = dists
        .iter()
        .flat_map(|d| d.buckets.iter().map(|b| b.0))
        .collect();
    let zero_row = bounds.contains(&1);
    let nonzero = bounds.iter().filter(|&&b| b > 1);
    let range = nonzero.clone().min().zip(nonzero.max());
    if !zero_row && range.is_none() {
        return dists.iter().map(|_| Vec::new()).collect();
    }
    let mut rows: Vec<(String, u64)> = Vec::new();
    if zero_row {
        rows.push(("0".into(), 1));
    }
    if let Some((&lo, &hi)) = range {
        let mut ub = lo;
        while ub <= hi && ub != 0 {
            rows.push((format!("<{}", fmt_ns(ub)), ub));
            ub = ub.saturating_mul(2);
        }
    }
    dists
        .iter()
        .map(|d| {
            let peak = d.buckets.iter().map(|b| b.1).max().unwrap_or(0).max(1);
            rows.iter()
                .map(|(label, ub)| {
                    let n = d.buckets.iter().find(|b| b.0 == *ub).map_or(0, |b| b.1);
                    let filled = ((n as f64 / peak as f64) * BAR_WIDTH as f64).ceil() as usize;
                    format!(
                        "{label:>8} {}{} {n:>8}",
                        "█".repeat(filled),
                        " ".repeat(BAR_WIDTH - filled),
                    )
                })
                .collect()
        })
        .collect()
}

/// Columns of text side by side, each padded to `width` characters.
pub fn side_by_side(cols: &[Vec<String>], width: usize) -> String {
    let rows = cols.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = String::new();
    for r in 0..rows {
        let mut line = String::new();
        for c in cols {
            let cell = c.get(r).map(String::as_str).unwrap_or("");
            let pad = width.saturating_sub(cell.chars().count());
            line.push_str("  ");
            line.push_str(cell);
            line.push_str(&" ".repeat(pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `s` in at most `width` characters: cut with an ellipsis when longer, so that the columns
/// after it stay where the header puts them.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A share as people read it: `6.1%`, `0.042%` (small ones keep two significant digits).
pub fn fmt_share(x: f64) -> String {
    let pct = x * 100.0;
    if pct == 0.0 || pct >= 0.1 {
        format!("{pct:.1}%")
    } else {
        let digits = (1 - pct.log10().floor() as i32).clamp(2, 6) as usize;
        format!("{pct:.digits$}%")
    }
}

/// Wait over CPU time, a ratio (not a share: a thread that waits is off CPU, so it exceeds 1
/// whenever the threads waited longer than they ran), as seconds of wait per CPU-second, to
/// three significant digits: `0.180 s`, `17.6 s`.
pub fn fmt_per_cpu(ratio: f64) -> String {
    if ratio <= 0.0 || !ratio.is_finite() {
        return "0 s".to_string();
    }
    let digits = (2 - ratio.log10().floor() as i32).clamp(0, 6) as usize;
    format!("{ratio:.digits$} s")
}

/// A count with its noun, singular or plural as the count asks: `1 process`, `3 processes`,
/// `0 threads`.
pub fn count_of(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A file size given in KiB, in the unit a person would say it in: `128 B`, `64 KiB`, `1 MiB`.
pub fn size_name(kib: f64) -> String {
    if kib < 1.0 {
        format!("{} B", (kib * 1024.0).round())
    } else if kib >= 1024.0 {
        format!("{} MiB", kib / 1024.0)
    } else {
        format!("{kib} KiB")
    }
}
