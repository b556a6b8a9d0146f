//! The mitigation study's page (`results.json` of `mmaplock-prof study`): throughput, writes
//! and mean/p99 write wait per scenario, Worker threads beside processes, per file size and
//! k, the pooled write-wait histograms, and the ranking.

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::Value;

use super::{
    buckets, page,
    svg::{Unit, bars, esc, histogram},
};

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

pub fn study_page(study: &Value) -> String {
    let runs: Vec<&Value> = study["runs"].as_array().into_iter().flatten().collect();
    // Groups: (file size, k), in order.
    let mut groups: BTreeMap<(u64, u64), Vec<&Value>> = BTreeMap::new();
    for r in &runs {
        let kib = (f(&r["file_kib"]) * 1000.0) as u64;
        groups
            .entry((kib, r["k"].as_u64().unwrap_or(0)))
            .or_default()
            .push(r);
    }
    let mut body = String::new();
    if let Some(md) = study["ranking_text"].as_str() {
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
            let s = r["scenario"].as_str().unwrap_or("?");
            if !scenarios.iter().any(|x| x == s) {
                scenarios.push(s.to_string());
            }
        }
        let get = |scenario: &str, mode: &str, field: &dyn Fn(&Value) -> f64| {
            rs.iter()
                .find(|r| r["scenario"] == scenario && r["mode"] == mode)
                .map_or(0.0, |r| field(r))
        };
        let series = |field: &dyn Fn(&Value) -> f64| -> Vec<(&str, Vec<f64>)> {
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
        let chart = |name: &str, field: &dyn Fn(&Value) -> f64, unit| {
            bars(
                &format!("{name}-{kib}-{k}"),
                &scenarios,
                &series(field),
                unit,
            )
        };
        body.push_str("<div><h3>Throughput (reads/s)</h3>");
        body.push_str(&chart(
            "throughput",
            &|r| f(&r["ops_per_s"]),
            Unit::PerSecond,
        ));
        body.push_str("</div><div><h3>Write acquisitions</h3>");
        body.push_str(&chart("writes", &|r| f(&r["write"]["count"]), Unit::Count));
        body.push_str("</div><div><h3>Mean write wait</h3>");
        body.push_str(&chart(
            "mean-wait",
            &|r| f(&r["write"]["wait_ns"]["mean"]),
            Unit::Ns,
        ));
        body.push_str("</div><div><h3>p99 write wait</h3>");
        body.push_str(&chart(
            "p99-wait",
            &|r| f(&r["write"]["wait_ns"]["p99"]),
            Unit::Ns,
        ));
        body.push_str("</div></div><h3>Write wait per acquisition, Worker threads (log2 buckets)</h3><div class=\"grid\">");
        for s in &scenarios {
            let Some(r) = rs
                .iter()
                .find(|r| r["scenario"] == s.as_str() && r["mode"] == "workers")
            else {
                continue;
            };
            let _ = write!(body, "<div><b>{}</b>", esc(s));
            body.push_str(&histogram(
                &format!("wait-histogram-{s}-{kib}-{k}"),
                &[("write wait", &buckets(&r["write"]["wait_ns"]))],
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
