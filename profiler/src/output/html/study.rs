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
    let mut body = ranking_section(study);
    for ((kib, k), rs) in groups {
        // In the order of first appearance, each once (the runs need not be grouped).
        let mut scenarios: Vec<String> = Vec::new();
        for r in &rs {
            let s = r["scenario"].as_str().unwrap_or("?");
            if !scenarios.iter().any(|x| x == s) {
                scenarios.push(s.to_string());
            }
        }
        // The mean over the cell's repeated runs.
        let get = |scenario: &str, mode: &str, field: &dyn Fn(&Value) -> f64| {
            let v: Vec<f64> = rs
                .iter()
                .filter(|r| r["scenario"] == scenario && r["mode"] == mode)
                .map(|r| field(r))
                .collect();
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
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
            // The cell's runs pooled.
            let mut pooled: BTreeMap<u64, u64> = BTreeMap::new();
            for r in rs
                .iter()
                .filter(|r| r["scenario"] == s.as_str() && r["mode"] == "workers")
            {
                for (ub, n) in buckets(&r["write"]["wait_ns"]) {
                    *pooled.entry(ub).or_default() += n;
                }
            }
            if pooled.is_empty() {
                continue;
            }
            let _ = write!(body, "<div><b>{}</b>", esc(s));
            body.push_str(&histogram(
                &format!("wait-histogram-{s}-{kib}-{k}"),
                &[("write wait", &pooled.into_iter().collect::<Vec<_>>())],
            ));
            body.push_str("</div>");
        }
        body.push_str("</div></section>");
    }
    let repeat = study["repeat"].as_u64().unwrap_or(1);
    page(
        "mmaplock-prof study: mitigations of mmap_lock contention",
        &format!(
            "{} runs ({repeat} per cell), Worker threads against processes",
            runs.len()
        ),
        &body,
    )
}

/// `1.24x <small>(1.10-1.31)</small>`.
fn ratio_cell(r: &Value, spread: &str, mean: &str) -> String {
    let m = r[spread]["mean"]
        .as_f64()
        .or(r[mean].as_f64())
        .unwrap_or(0.0);
    match (r[spread]["min"].as_f64(), r[spread]["max"].as_f64()) {
        (Some(lo), Some(hi)) if r[spread]["runs"].as_u64().unwrap_or(1) > 1 => {
            format!("{m:.2}x <small>({lo:.2}-{hi:.2})</small>")
        }
        _ => format!("{m:.2}x"),
    }
}

fn verdict_cell(v: &Value) -> String {
    let v = v.as_str().unwrap_or("-");
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
fn ranking_section(study: &Value) -> String {
    let mut out =
        String::from(r#"<section class="process" id="ranking"><h2>Ranking on this machine</h2>"#);
    let ranking: Vec<&Value> = study["ranking"].as_array().into_iter().flatten().collect();
    let mut sizes: Vec<f64> = ranking
        .iter()
        .filter_map(|r| r["file_kib"].as_f64())
        .collect();
    sizes.dedup();
    for kib in sizes {
        let _ = write!(
            out,
            "<h3>Worker threads, {} files</h3><table data-table=\"ranking\"><tr><th>scenario</th><th>throughput vs default</th><th></th><th>writes vs default</th><th></th></tr>",
            esc(&crate::study::size_name(kib))
        );
        for r in ranking
            .iter()
            .filter(|r| r["file_kib"].as_f64() == Some(kib))
        {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td>{}<td>{}</td>{}</tr>",
                esc(r["scenario"].as_str().unwrap_or("?")),
                ratio_cell(r, "throughput", "throughput_ratio"),
                verdict_cell(&r["throughput_verdict"]),
                ratio_cell(r, "writes", "writes_ratio"),
                verdict_cell(&r["writes_verdict"]),
            );
        }
        out.push_str("</table>");
    }
    match study["claims"].as_array() {
        Some(claims) => {
            out.push_str("<h3>Against the investigation (64 KiB, Worker threads)</h3><table data-table=\"claims\"><tr><th>scenario</th><th>the investigation found</th><th>throughput here</th><th>writes here</th><th>verdict</th></tr>");
            for c in claims {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
                    esc(c["scenario"].as_str().unwrap_or("?")),
                    esc(c["claim"].as_str().unwrap_or("")),
                    ratio_cell(c, "throughput", ""),
                    ratio_cell(c, "writes", ""),
                    verdict_cell(&c["verdict"]),
                );
            }
            out.push_str("</table>");
        }
        // An older study: its claims as it wrote them.
        None => {
            if let Some(t) = study["ranking_text"].as_str()
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
