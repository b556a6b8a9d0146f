//! Plain inline SVG charts: nothing to fetch, nothing to run, the same bytes for the same
//! input. Every chart is an `<svg class="chart" data-chart="NAME">` whose marks are
//! `<rect class="bar">` or `<polyline class="line">`, each with a `<title>` for its value.

use std::fmt::Write as _;

use crate::output::text::fmt_ns;

/// Colours of the series, in order.
pub const PALETTE: [&str; 6] = [
    "#3b6fb6", "#e07b39", "#4f9d69", "#b8475d", "#7d62b3", "#8c8c8c",
];

/// Text escaped for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// How a value is shown on an axis and in a tooltip.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    Count,
    Ns,
    PerSecond,
}

impl Unit {
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Count => {
                if v >= 1e6 {
                    format!("{:.1}M", v / 1e6)
                } else if v >= 1e4 {
                    format!("{:.1}k", v / 1e3)
                } else {
                    format!("{}", v.round() as u64)
                }
            }
            Unit::Ns => fmt_ns(v.max(0.0).round() as u64),
            Unit::PerSecond => format!("{}/s", Unit::Count.show(v)),
        }
    }
}

/// Horizontal bars, one group per label and one bar per series in it (a legend when there is
/// more than one series).
pub fn bars(name: &str, labels: &[String], series: &[(&str, Vec<f64>)], unit: Unit) -> String {
    let (label_w, bar_w, row_h) = (170.0, 300.0, 16.0);
    let n_series = series.len().max(1);
    let group_h = row_h * n_series as f64 + 8.0;
    let legend_h = if series.len() > 1 { 20.0 } else { 0.0 };
    let height = legend_h + group_h * labels.len() as f64 + 4.0;
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let width = label_w + bar_w + 80.0;
    let mut s = chart_start(name, width, height);
    if series.len() > 1 {
        legend(&mut s, series.iter().map(|(n, _)| *n), label_w);
    }
    for (i, label) in labels.iter().enumerate() {
        let y0 = legend_h + group_h * i as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" class="label" text-anchor="end">{}</text>"#,
            label_w - 6.0,
            y0 + group_h / 2.0 + 2.0,
            esc(&shorten(label, 30))
        );
        for (j, (sname, values)) in series.iter().enumerate() {
            let v = values.get(i).copied().unwrap_or(0.0);
            let w = (v / max * bar_w).max(if v > 0.0 { 1.0 } else { 0.0 });
            let y = y0 + row_h * j as f64 + 2.0;
            let _ = write!(
                s,
                r#"<rect class="bar" x="{label_w}" y="{y}" width="{w:.1}" height="{}" fill="{}"><title>{}: {}</title></rect><text x="{}" y="{}" class="value">{}</text>"#,
                row_h - 3.0,
                PALETTE[j % PALETTE.len()],
                esc(&format!("{label} {sname}")),
                esc(&unit.show(v)),
                label_w + w + 4.0,
                y + row_h - 5.0,
                esc(&unit.show(v))
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// A chart's opening tag: `<svg class="chart" data-chart="NAME">` of this size.
fn chart_start(name: &str, width: f64, height: f64) -> String {
    format!(
        r#"<svg class="chart" data-chart="{}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#,
        esc(name)
    )
}

fn legend<'a>(s: &mut String, names: impl Iterator<Item = &'a str>, x0: f64) {
    let mut x = x0;
    for (j, n) in names.enumerate() {
        let _ = write!(
            s,
            r#"<rect x="{x}" y="4" width="10" height="10" fill="{}"/><text x="{}" y="13" class="legend">{}</text>"#,
            PALETTE[j % PALETTE.len()],
            x + 14.0,
            esc(n)
        );
        x += 24.0 + 7.0 * n.chars().count() as f64;
    }
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let tail: String = s
        .chars()
        .rev()
        .take(max - 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}

/// A log2 histogram: one vertical bar per bucket `[upper_bound_ns, count]` from the lowest
/// to the highest non-empty bucket of all the series (so that several line up).
pub fn histogram(name: &str, series: &[(&str, &[(u64, u64)])]) -> String {
    let bounds: Vec<u64> = series
        .iter()
        .flat_map(|(_, b)| b.iter().map(|x| x.0))
        .collect();
    let (Some(&lo), Some(&hi)) = (bounds.iter().min(), bounds.iter().max()) else {
        return format!(r#"<p class="empty" data-chart="{}">no data</p>"#, esc(name));
    };
    let mut rows = Vec::new();
    let mut ub = lo;
    while ub <= hi && ub != 0 {
        rows.push(ub);
        ub = ub.saturating_mul(2);
    }
    let (left, plot_h, col_w) = (50.0, 160.0, 22.0);
    let n_series = series.len().max(1) as f64;
    let width = left + col_w * rows.len() as f64 + 20.0;
    let legend_h = if series.len() > 1 { 20.0 } else { 0.0 };
    let height = legend_h + plot_h + 70.0;
    let max = series
        .iter()
        .flat_map(|(_, b)| b.iter().map(|x| x.1))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut s = chart_start(name, width, height);
    if series.len() > 1 {
        legend(&mut s, series.iter().map(|(n, _)| *n), left);
    }
    let base = legend_h + plot_h + 4.0;
    let _ = write!(
        s,
        r#"<line x1="{left}" y1="{base}" x2="{}" y2="{base}" class="axis"/><text x="{}" y="{}" class="value" text-anchor="end">{}</text>"#,
        width - 10.0,
        left - 4.0,
        legend_h + 12.0,
        Unit::Count.show(max)
    );
    for (i, &ub) in rows.iter().enumerate() {
        let x0 = left + col_w * i as f64;
        for (j, (sname, buckets)) in series.iter().enumerate() {
            let n = buckets.iter().find(|b| b.0 == ub).map_or(0, |b| b.1);
            if n == 0 {
                continue;
            }
            // Square-root scale: the tail's few counts stay visible beside the bulk.
            let h = ((n as f64).sqrt() / max.sqrt() * plot_h).max(1.0);
            let w = (col_w - 3.0) / n_series;
            let _ = write!(
                s,
                r#"<rect class="bar" x="{:.1}" y="{:.1}" width="{w:.1}" height="{h:.1}" fill="{}"><title>{} &lt;{}: {n}</title></rect>"#,
                x0 + w * j as f64,
                base - h,
                PALETTE[j % PALETTE.len()],
                esc(sname),
                esc(&fmt_ns(ub))
            );
        }
        let _ = write!(
            s,
            r#"<text class="tick" transform="translate({:.1},{:.1}) rotate(-60)" text-anchor="end">&lt;{}</text>"#,
            x0 + col_w / 2.0,
            base + 10.0,
            esc(&fmt_ns(ub))
        );
    }
    s.push_str("</svg>");
    s
}

/// Lines over time: `xs` in seconds from the start, one polyline per series.
pub fn lines(name: &str, xs: &[f64], series: &[(&str, Vec<f64>)], unit: Unit) -> String {
    if xs.is_empty() {
        return format!(
            r#"<p class="empty" data-chart="{}">no interval lines (run with -i)</p>"#,
            esc(name)
        );
    }
    let (left, top, plot_w, plot_h) = (62.0, 24.0, 280.0, 150.0);
    let width = left + plot_w + 20.0;
    let height = top + plot_h + 40.0;
    let xmax = xs.iter().copied().fold(0.0f64, f64::max).max(1e-9);
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut s = chart_start(name, width, height);
    legend(&mut s, series.iter().map(|(n, _)| *n), left);
    let base = top + plot_h;
    let _ = write!(
        s,
        r#"<line x1="{left}" y1="{base}" x2="{}" y2="{base}" class="axis"/><line x1="{left}" y1="{top}" x2="{left}" y2="{base}" class="axis"/><text x="{}" y="{}" class="value" text-anchor="end">{}</text><text x="{}" y="{}" class="value" text-anchor="end">0</text><text x="{}" y="{}" class="value" text-anchor="end">{:.1} s</text>"#,
        left + plot_w,
        left - 4.0,
        top + 8.0,
        esc(&unit.show(ymax)),
        left - 4.0,
        base,
        left + plot_w,
        base + 16.0,
        xmax
    );
    for (j, (sname, values)) in series.iter().enumerate() {
        let pts: Vec<String> = xs
            .iter()
            .zip(values)
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    left + x / xmax * plot_w,
                    base - y / ymax * plot_h
                )
            })
            .collect();
        let _ = write!(
            s,
            r#"<polyline class="line" fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            PALETTE[j % PALETTE.len()],
            pts.join(" "),
            esc(sname)
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_have_one_mark_per_value_and_escape_text() {
        let b = bars(
            "by-role",
            &["worker".into(), "<v8>".into()],
            &[("writes", vec![10.0, 0.0])],
            Unit::Count,
        );
        assert_eq!(b.matches(r#"class="bar""#).count(), 2);
        assert!(b.contains("&lt;v8&gt;") && !b.contains("<v8>"));
        let h = histogram("wait", &[("write", &[(256, 3), (1024, 1)][..])]);
        // Buckets 256, 512, 1024: two non-empty bars, three ticks.
        assert_eq!(h.matches(r#"class="bar""#).count(), 2);
        assert_eq!(h.matches(r#"class="tick""#).count(), 3);
        let l = lines(
            "over-time",
            &[0.0, 1.0],
            &[("wait", vec![1.0, 2.0])],
            Unit::Ns,
        );
        assert_eq!(l.matches(r#"class="line""#).count(), 1);
        assert!(lines("x", &[], &[], Unit::Ns).contains("no interval lines"));
        assert!(histogram("x", &[("w", &[][..])]).contains("no data"));
    }
}
