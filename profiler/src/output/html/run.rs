//! The page of one run: per process, its numbers, wait and hold histograms, wait over time
//! (from the interval lines), writes and wait by role and by cause, who made whom wait, the
//! code that asked for memory and the flame graph of the sampled writes.

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::Value;

use super::{
    RunLines, buckets, kpi, page, partial,
    svg::{Unit, bars, esc, histogram, lines},
    u,
};
use crate::output::text::fmt_ns;

/// The flame graph of a process's sampled writes, drawn by inferno, in a frame of its own
/// (None without stacks).
///
/// Inferno's script (zoom, search, fluid width) finds its elements by id and takes the
/// document's first `<svg>` as its own: inline beside our charts it stripped the first chart's
/// size and drew the frames at that chart's width, and a second flame graph on the page would
/// drive the first. An `<iframe srcdoc>` gives each graph a document to itself; it is part of
/// the page, so still nothing is fetched.
fn flame_graph(title: &str, flame: &Value) -> Option<String> {
    let lines: Vec<String> = flame
        .as_array()?
        .iter()
        .filter_map(|f| Some(format!("{} {}", f["stack"].as_str()?, f["count"].as_u64()?)))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "sampled writes".to_string();
    opts.hash = true;
    opts.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg).ok()?;
    let svg = String::from_utf8(svg).ok()?;
    // Inside HTML: no XML prologue or doctype of its own.
    let svg = &svg[svg.find("<svg")?..];
    let height = svg_height(svg).unwrap_or(600.0);
    // The script keeps its zoom and search in the address (history.replaceState), which an
    // about:srcdoc frame refuses: there it would throw after each click.
    let doc = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>body{{margin:0}}svg{{width:100%}}</style>\
         <script>history.replaceState=function(){{}};</script></head><body>{svg}</body></html>"
    );
    Some(format!(
        r#"<iframe class="flame" data-chart="flame-graph" title="{}" style="height:{}px" srcdoc="{}"></iframe>"#,
        esc(title),
        height + 4.0,
        esc(&doc)
    ))
}

/// The `height` attribute of an `<svg ...>` start tag.
fn svg_height(svg: &str) -> Option<f64> {
    let tag = &svg[..svg.find('>')?];
    let rest = &tag[tag.find(" height=\"")? + 9..];
    rest[..rest.find('"')?].parse().ok()
}

/// A titled chart, laid out two to a row.
fn panel(out: &mut String, title: &str, chart: &str) {
    let _ = write!(
        out,
        r#"<div class="panel"><h3>{}</h3>{chart}</div>"#,
        esc(title)
    );
}

/// Per interval line in which the process appears: seconds from the start, write wait sum,
/// mean write wait, writes.
fn over_time(p: &Value, intervals: &[Value], t0: Option<f64>) -> [Vec<f64>; 4] {
    let mut v: [Vec<f64>; 4] = Default::default();
    for l in intervals {
        let Some(q) = l["processes"].as_array().and_then(|ps| {
            ps.iter()
                .find(|q| q["pid"] == p["pid"] && q["start_ticks"] == p["start_ticks"])
        }) else {
            continue;
        };
        let (Some(at), Some(t0)) = (seconds_of(&l["end"]), t0) else {
            continue;
        };
        let (sum, count) = (u(&q["write"]["wait_ns"]["sum"]), u(&q["write"]["count"]));
        v[0].push(at - t0);
        v[1].push(sum as f64);
        v[2].push(if count == 0 {
            0.0
        } else {
            sum as f64 / count as f64
        });
        v[3].push(count as f64);
    }
    v
}

/// One process's section of a run page.
fn process_section(p: &Value, intervals: &[Value], t0: Option<f64>) -> String {
    let mut out = String::new();
    let (pid, comm) = (u(&p["pid"]), p["comm"].as_str().unwrap_or("?"));
    let _ = write!(
        out,
        r#"<section class="process" data-pid="{pid}"><h2>{} <small>pid {pid}</small></h2><div class="kpis">"#,
        esc(comm)
    );
    let (w, r) = (&p["write"], &p["read"]);
    kpi(&mut out, "write acquisitions", &u(&w["count"]).to_string());
    kpi(
        &mut out,
        "total write wait",
        &fmt_ns(u(&w["wait_ns"]["sum"])),
    );
    kpi(
        &mut out,
        "mean write wait",
        &fmt_ns(w["wait_ns"]["mean"].as_f64().unwrap_or(0.0) as u64),
    );
    kpi(&mut out, "p99 write wait", &fmt_ns(u(&w["wait_ns"]["p99"])));
    kpi(&mut out, "read acquisitions", &u(&r["count"]).to_string());
    kpi(
        &mut out,
        "total read wait",
        &fmt_ns(u(&r["wait_ns"]["sum"])),
    );
    if let Some(b) = p["blocked_wait_ns"].as_u64() {
        kpi(&mut out, "wait charged to blockers", &fmt_ns(b));
    }
    if let Some(share) = p["time_share"]["wall"].as_f64() {
        kpi(
            &mut out,
            "of its threads' time waiting",
            &crate::output::text::fmt_share(share),
        );
    }
    out.push_str(r#"</div><div class="grid">"#);
    panel(
        &mut out,
        "Wait per acquisition (log2 buckets)",
        &histogram(
            "wait-histogram",
            &[
                ("write", &buckets(&w["wait_ns"])),
                ("read", &buckets(&r["wait_ns"])),
            ],
        ),
    );
    panel(
        &mut out,
        "Hold per acquisition (log2 buckets)",
        &histogram(
            "hold-histogram",
            &[
                ("write", &buckets(&w["hold_ns"])),
                ("read", &buckets(&r["hold_ns"])),
            ],
        ),
    );
    // The three over time in a row of their own.
    out.push_str(r#"</div><div class="grid">"#);
    let [xs, sum, mean, count] = over_time(p, intervals, t0);
    panel(
        &mut out,
        "Write wait over time",
        &lines(
            "write-wait-over-time",
            &xs,
            &[("write wait per interval", sum)],
            Unit::Ns,
        ),
    );
    panel(
        &mut out,
        "Mean write wait over time",
        &lines(
            "mean-write-wait-over-time",
            &xs,
            &[("mean write wait per interval", mean)],
            Unit::Ns,
        ),
    );
    panel(
        &mut out,
        "Writes over time",
        &lines(
            "writes-over-time",
            &xs,
            &[("writes per interval", count)],
            Unit::Count,
        ),
    );
    out.push_str("</div>");
    // By role (threads pooled) and by cause.
    let mut roles: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for t in p["threads"].as_array().into_iter().flatten() {
        let e = roles
            .entry(t["role"].as_str().unwrap_or("other").to_string())
            .or_default();
        e.0 += u(&t["write"]["count"]) as f64;
        e.1 += u(&t["write"]["wait_ns"]["sum"]) as f64;
    }
    let labels: Vec<String> = roles.keys().cloned().collect();
    out.push_str(r#"<div class="grid">"#);
    let writes_by_role = bars(
        "writes-by-role",
        &labels,
        &[("writes", roles.values().map(|v| v.0).collect())],
        Unit::Count,
    );
    panel(&mut out, "Writes by thread role", &writes_by_role);
    let wait_by_role = bars(
        "wait-by-role",
        &labels,
        &[("write wait", roles.values().map(|v| v.1).collect())],
        Unit::Ns,
    );
    panel(&mut out, "Write wait by thread role", &wait_by_role);
    let causes: Vec<&Value> = p["causes"].as_array().into_iter().flatten().collect();
    let labels: Vec<String> = causes
        .iter()
        .map(|c| c["cause"].as_str().unwrap_or("?").to_string())
        .collect();
    let of_causes = |f: &dyn Fn(&Value) -> u64| causes.iter().map(|c| f(c) as f64).collect();
    let writes_by_cause = bars(
        "writes-by-cause",
        &labels,
        &[("writes", of_causes(&|c| u(&c["write"]["count"])))],
        Unit::Count,
    );
    panel(&mut out, "Writes by cause", &writes_by_cause);
    let wait_by_cause = bars(
        "wait-by-cause",
        &labels,
        &[(
            "write wait",
            of_causes(&|c| u(&c["write"]["wait_ns"]["sum"])),
        )],
        Unit::Ns,
    );
    panel(&mut out, "Write wait by cause", &wait_by_cause);
    out.push_str("</div>");
    // Who made whom wait, by role and by holder, side by side.
    out.push_str(r#"<div class="grid">"#);
    if let Some(roles) = p["blocked_by_role"].as_array().filter(|r| !r.is_empty()) {
        out.push_str("<div class=\"panel\"><h3>Who made whom wait</h3><table><tr><th>waiter</th><th>holder</th><th>its hold</th><th>write wait</th><th>all wait</th></tr>");
        for r in roles.iter().take(12) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(r["waiter_role"].as_str().unwrap_or("")),
                esc(r["holder_role"].as_str().unwrap_or("")),
                esc(r["cause"].as_str().unwrap_or("")),
                fmt_ns(u(&r["write_wait_ns"])),
                fmt_ns(u(&r["wait_ns"]))
            );
        }
        out.push_str("</table></div>");
    }
    blockers_table(&mut out, p);
    out.push_str(&super::verdict::time_share_table(p));
    out.push_str("</div>");
    code_tables(&mut out, p);
    if let Some(frame) = flame_graph(&format!("Sampled writes of {comm} ({pid})"), &p["flame"]) {
        out.push_str("<h3>Flame graph of the sampled writes</h3>");
        out.push_str(&frame);
    }
    out.push_str("</section>");
    out
}

/// The threads whose holds made this process's threads wait (`--blockers`).
fn blockers_table(out: &mut String, p: &Value) {
    let Some(b) = p["blockers"].as_array().filter(|b| !b.is_empty()) else {
        return;
    };
    out.push_str("<div class=\"panel\"><h3>Blockers: the holds that made them wait</h3><table><tr><th>holder</th><th>tid</th><th>role</th><th>its hold</th><th>waits</th><th>wait charged</th></tr>");
    for x in b.iter().take(12) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(x["comm"].as_str().unwrap_or("")),
            u(&x["tid"]),
            esc(x["role"].as_str().unwrap_or("")),
            esc(x["cause"].as_str().unwrap_or("")),
            u(&x["waits"]),
            fmt_ns(u(&x["wait_ns"]))
        );
    }
    out.push_str("</table></div>");
}

/// Sampled writes by code and by JavaScript function.
fn code_tables(out: &mut String, p: &Value) {
    if let Some(d) = p["dsos"].as_array().filter(|d| !d.is_empty()) {
        out.push_str("<h3>Sampled writes by code</h3><table><tr><th>code</th><th>writes</th><th>wait</th></tr>");
        for x in d.iter().take(10) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(x["dso"].as_str().unwrap_or("")),
                u(&x["write"]["count"]),
                fmt_ns(u(&x["write"]["wait_ns"]["sum"]))
            );
        }
        out.push_str("</table>");
    }
    if let Some(js) = p["js_functions"].as_array().filter(|d| !d.is_empty()) {
        out.push_str("<h3>Sampled writes by JavaScript function</h3><table><tr><th>function</th><th>file</th><th>writes</th><th>wait</th></tr>");
        for f in js.iter().take(10) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(f["function"].as_str().unwrap_or("")),
                esc(f["file"].as_str().unwrap_or("")),
                u(&f["writes"]),
                fmt_ns(u(&f["wait_ns_sum"]))
            );
        }
        out.push_str("</table>");
    }
    if let Some(h) = p["js_hint"].as_str() {
        let _ = write!(out, r#"<p class="note">{}</p>"#, esc(h));
    }
}

fn seconds_of(v: &Value) -> Option<f64> {
    let t = humantime::parse_rfc3339(v.as_str()?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The page of a run: per process (the largest write wait first), from its last summary, and
/// its interval lines for the charts over time.
pub fn run_page(name: &str, run: &RunLines) -> String {
    if let Some(study) = run.study() {
        return super::study::study_page(study);
    }
    let mut body = String::new();
    let summary = run.summaries.last();
    let t0 = summary
        .and_then(|s| seconds_of(&s["start"]))
        .or_else(|| run.intervals.first().and_then(|l| seconds_of(&l["start"])));
    let summed;
    let source = match summary {
        Some(_) => summary,
        None if !run.intervals.is_empty() => {
            let _ = write!(
                body,
                r#"<p class="note partial">No summary line (the run was cut short): the figures below are the sums of its {} interval lines, percentiles at the resolution of the log2 buckets.</p>"#,
                run.intervals.len()
            );
            summed = partial::summed(&run.intervals);
            Some(&summed)
        }
        None => None,
    };
    // A demo line holds two runs (Worker threads, then processes): both are shown.
    let sources: Vec<&Value> = if run.other.iter().any(|v| v["type"] == "demo") {
        run.summaries.iter().collect()
    } else {
        source.into_iter().collect()
    };
    let mut procs: Vec<&Value> = sources
        .iter()
        .filter_map(|s| s["processes"].as_array())
        .flatten()
        .collect();
    procs.sort_by_key(|p| std::cmp::Reverse(u(&p["write"]["wait_ns"]["sum"])));
    // The verdict first: what was found and what to change.
    body.push_str(&super::verdict::findings_section(
        &super::verdict::findings_of(&sources),
    ));
    if procs.is_empty() {
        body.push_str(r#"<p class="note">No mmap_lock activity by the selected processes.</p>"#);
    }
    for p in procs {
        body.push_str(&process_section(p, &run.intervals, t0));
    }
    if let Some(s) = summary {
        let lost = u(&s["lost"]["events"]) + u(&s["lost"]["map_full"]);
        let _ = write!(
            body,
            r#"<p class="note">Lost acquisitions: {lost}. Report format: docs/report-format.md.</p>"#
        );
    }
    let sub = match (summary, run.intervals.first(), run.intervals.last()) {
        (Some(s), _, _) => format!(
            "{} to {} ({} s), {} interval lines",
            s["start"].as_str().unwrap_or(""),
            s["end"].as_str().unwrap_or(""),
            s["duration_s"],
            run.intervals.len()
        ),
        (None, Some(a), Some(b)) => format!(
            "{} to {}, {} interval lines, no summary",
            a["start"].as_str().unwrap_or(""),
            b["end"].as_str().unwrap_or(""),
            run.intervals.len()
        ),
        _ => String::new(),
    };
    page(&format!("mmaplock-prof: {name}"), &sub, &body)
}
