//! The flame graph of a process's sampled writes on a run's page.

use super::svg::esc;
use crate::output::report::FlameStack;

/// The flame graph of a process's sampled writes, drawn by inferno, in a frame of its own
/// (None without stacks).
///
/// Inferno's script (zoom, search, fluid width) finds its elements by id and takes the
/// document's first `<svg>` as its own: inline beside our charts it stripped the first chart's
/// size and drew the frames at that chart's width, and a second flame graph on the page would
/// drive the first. An `<iframe srcdoc>` gives each graph a document to itself; it is part of
/// the page, so still nothing is fetched.
pub fn flame_graph(title: &str, flame: &[FlameStack]) -> Option<String> {
    let lines: Vec<String> = flame
        .iter()
        .map(|f| format!("{} {}", f.stack, f.count))
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
