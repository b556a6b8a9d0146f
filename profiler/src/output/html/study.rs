//! The mitigation study's page (`results.json` of `mmaplock-prof study`): throughput, writes
//! and mean/p99 write wait per scenario, Worker threads beside processes, per file size and
//! k, the pooled write-wait histograms, and the ranking.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    page,
    svg::{Unit, bars, esc, histogram},
};
use crate::output::reading::{self, InputError, Line, StudyLine, StudyRun};

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
    let mut body = String::new();
    if let Some(md) = &study.ranking_text {
        let _ = write!(
            body,
            r#"<section class="process"><h2>Ranking on this machine</h2><pre>{}</pre></section>"#,
            esc(md)
        );
    }
    for ((kib, k), rs) in groups {
        // In the order of first appearance, each once (the runs need not be grouped).
        let mut scenarios: Vec<String> = Vec::new();
        for r in &rs {
            if !scenarios.contains(&r.scenario) {
                scenarios.push(r.scenario.clone());
            }
        }
        let get = |scenario: &str, mode: &str, field: &dyn Fn(&StudyRun) -> f64| {
            rs.iter()
                .find(|r| r.scenario == scenario && r.mode == mode)
                .map_or(0.0, |r| field(r))
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
            let Some(r) = rs.iter().find(|r| r.scenario == *s && r.mode == "workers") else {
                continue;
            };
            let _ = write!(body, "<div><b>{}</b>", esc(s));
            body.push_str(&histogram(
                &format!("wait-histogram-{s}-{kib}-{k}"),
                &[("write wait", &r.write.wait_ns.buckets)],
            ));
            body.push_str("</div>");
        }
        body.push_str("</div></section>");
    }
    page(
        "mmaplock-prof study: mitigations of mmap_lock contention",
        &format!("{} runs, Worker threads against processes", runs.len()),
        &body,
    )
}
