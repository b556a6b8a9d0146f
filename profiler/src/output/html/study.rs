//! The mitigation study's page (`results.json` of `mmaplock-prof study`): throughput, writes
//! and mean/p99 write wait per scenario, Worker threads beside processes, per file size and
//! k, the pooled write-wait histograms, and the ranking.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    page,
    svg::{Unit, bars, esc, histogram},
};
use crate::{
    aggregation::DurationHist,
    output::{
        compare::Spread,
        reading::{self, InputError, Line, StudyLine, StudyRun},
    },
};

/// The page of a study's `results.json` (its text), read as `report` reads it.
pub fn study_page_of(name: &str, results: &str) -> Result<String, InputError> {
    let mut study = None;
    reading::read(name, results.as_bytes(), |l| {
        if let Line::Study(s) = l {
            study.get_or_insert(s);
        }
    })?;
    study
        .map(|s| study_page(&s))
        .ok_or_else(|| InputError::Empty(name.to_string()))
}

pub fn study_page(study: &StudyLine) -> String {
    let runs = &study.runs;
    // Groups: (file size, k), in order.
    let mut groups: BTreeMap<(u64, u32), Vec<&StudyRun>> = BTreeMap::new();
    for r in runs {
        let kib = (r.file_kib * 1000.0) as u64;
        groups.entry((kib, r.k)).or_default().push(r);
    }
    let mut body = ranking_section(study);
    for ((kib, k), rs) in groups {
        // In the order of first appearance, each once (the runs need not be grouped).
        let mut scenarios: Vec<String> = Vec::new();
        for r in &rs {
            if !scenarios.contains(&r.scenario) {
                scenarios.push(r.scenario.clone());
            }
        }
        // The mean over the cell's repeated runs.
        let get = |scenario: &str, mode: &str, field: &dyn Fn(&StudyRun) -> f64| {
            let v: Vec<f64> = rs
                .iter()
                .filter(|r| r.scenario == scenario && r.mode == mode)
                .map(|r| field(r))
                .collect();
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let series = |field: &dyn Fn(&StudyRun) -> f64| -> Vec<(&str, Vec<f64>)> {
            ["workers", "processes"]
                .into_iter()
                .map(|m| (m, scenarios.iter().map(|s| get(s, m, field)).collect()))
                .collect()
        };
        let size = if kib < 1000 {
            format!("{} B", kib * 1024 / 1000)
        } else {
            format!("{} KiB", kib / 1000)
        };
        let _ = write!(
            body,
            r#"<section class="process"><h2>{size} files, k = {k}</h2><div class="grid">"#
        );
        let chart = |name: &str, field: &dyn Fn(&StudyRun) -> f64, unit| {
            bars(
                &format!("{name}-{kib}-{k}"),
                &scenarios,
                &series(field),
                unit,
            )
        };
        body.push_str("<div><h3>Throughput (reads/s)</h3>");
        body.push_str(&chart("throughput", &|r| r.ops_per_s, Unit::PerSecond));
        body.push_str("</div><div><h3>Write acquisitions</h3>");
        body.push_str(&chart("writes", &|r| r.write.count as f64, Unit::Count));
        body.push_str("</div><div><h3>Mean write wait</h3>");
        body.push_str(&chart("mean-wait", &|r| r.write.wait_ns.mean, Unit::Ns));
        body.push_str("</div><div><h3>p99 write wait</h3>");
        body.push_str(&chart(
            "p99-wait",
            &|r| r.write.wait_ns.p99 as f64,
            Unit::Ns,
        ));
        body.push_str("</div></div><h3>Write wait per acquisition, Worker threads (log2 buckets)</h3><div class=\"grid\">");
        for s in &scenarios {
            // The cell's runs pooled.
            let mut pooled = DurationHist::default();
            for r in rs
                .iter()
                .filter(|r| r.scenario == *s && r.mode == "workers")
            {
                pooled.merge(&r.write.wait_ns.hist());
            }
            if pooled.count() == 0 {
                continue;
            }
            let _ = write!(body, "<div><b>{}</b>", esc(s));
            body.push_str(&histogram(
                &format!("wait-histogram-{s}-{kib}-{k}"),
                &[("write wait", &pooled.upper_bounds().collect::<Vec<_>>())],
            ));
            body.push_str("</div>");
        }
        body.push_str("</div></section>");
    }
    let repeat = study.repeat.unwrap_or(1);
    page(
        "mmaplock-prof study: mitigations of mmap_lock contention",
        &format!(
            "{} runs ({repeat} per cell), Worker threads against processes",
            runs.len()
        ),
        &body,
    )
}

/// `1.24x <small>(1.10-1.31)</small>`: the mean over the runs, with their range when there
/// were several (from studies without repeats, `mean` alone).
fn ratio_cell(spread: Option<&Spread>, mean: f64) -> String {
    match spread {
        Some(s) if s.runs > 1 => {
            format!("{:.2}x <small>({:.2}-{:.2})</small>", s.mean, s.min, s.max)
        }
        Some(s) => format!("{:.2}x", s.mean),
        None => format!("{mean:.2}x"),
    }
}

fn verdict_cell(v: Option<&str>) -> String {
    let v = v.unwrap_or("-");
    let class = match v {
        "changed" | "agrees" => "good",
        "disagrees" => "bad",
        "within noise" => "within",
        _ => "",
    };
    format!(r#"<td class="{class}">{}</td>"#, esc(v))
}

/// The ranking with Worker threads as a table per file size, each scenario against
/// `default` with its range over the repeated runs and the verdict, then the investigation's
/// claims judged.
fn ranking_section(study: &StudyLine) -> String {
    let mut out =
        String::from(r#"<section class="process" id="ranking"><h2>Ranking on this machine</h2>"#);
    let mut sizes: Vec<f64> = study.ranking.iter().map(|r| r.file_kib).collect();
    sizes.dedup();
    for kib in sizes {
        let _ = write!(
            out,
            "<h3>Worker threads, {} files</h3><table data-table=\"ranking\"><tr><th>scenario</th><th>throughput vs default</th><th></th><th>writes vs default</th><th></th></tr>",
            esc(&crate::output::text::size_name(kib))
        );
        for r in study.ranking.iter().filter(|r| r.file_kib == kib) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td>{}<td>{}</td>{}</tr>",
                esc(&r.scenario),
                ratio_cell(r.throughput.as_ref(), r.throughput_ratio),
                verdict_cell(r.throughput_verdict.as_deref()),
                ratio_cell(r.writes.as_ref(), r.writes_ratio),
                verdict_cell(r.writes_verdict.as_deref()),
            );
        }
        out.push_str("</table>");
    }
    match &study.claims {
        Some(claims) => {
            out.push_str("<h3>Against the investigation (64 KiB, Worker threads)</h3><table data-table=\"claims\"><tr><th>scenario</th><th>the investigation found</th><th>throughput here</th><th>writes here</th><th>verdict</th></tr>");
            // A claim not measured has no figures.
            let cell = |s: Option<&Spread>| s.map_or("-".into(), |s| ratio_cell(Some(s), s.mean));
            for c in claims {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
                    esc(&c.scenario),
                    esc(&c.claim),
                    cell(c.throughput.as_ref()),
                    cell(c.writes.as_ref()),
                    verdict_cell(Some(&c.verdict)),
                );
            }
            out.push_str("</table>");
        }
        // An older study: its claims as it wrote them.
        None => {
            if let Some(t) = &study.ranking_text
                && let Some(i) = t.find("Against the investigation")
            {
                let items: Vec<String> = t[i..]
                    .lines()
                    .skip(1)
                    .map(|l| format!("<li>{}</li>", esc(l.trim_start_matches("- "))))
                    .collect();
                let _ = write!(
                    out,
                    "<h3>Against the investigation</h3><ul>{}</ul>",
                    items.join("")
                );
            }
        }
    }
    out.push_str("</section>");
    out
}
