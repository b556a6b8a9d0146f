//! The comparison's page: per process, writes and write wait before and after, by role and by
//! cause, as paired bars, and the table with ratios and noise verdicts.

use std::fmt::Write as _;

use super::{
    page,
    svg::{Unit, bars, esc},
};
use crate::output::{
    compare::{Change, Comparison},
    text::fmt_ns,
};

fn cell(c: &Change, ns: bool) -> String {
    let v = |x: f64| {
        if ns {
            fmt_ns(x.round() as u64)
        } else {
            format!("{}", x.round() as u64)
        }
    };
    let spread = |s: &crate::output::compare::Spread| {
        if s.runs > 1 {
            format!(" <small>({}–{})</small>", v(s.min), v(s.max))
        } else {
            String::new()
        }
    };
    let ratio = c.ratio.map_or("-".into(), |r| format!("{r:.2}x"));
    let class = match (c.verdict, c.ratio) {
        ("changed", Some(r)) if r < 1.0 => "good",
        ("changed", Some(_)) => "bad",
        _ => "",
    };
    format!(
        "<td>{}{}</td><td>{}{}</td><td class=\"{class}\">{ratio}</td>",
        v(c.before.mean),
        spread(&c.before),
        v(c.after.mean),
        spread(&c.after)
    )
}

pub fn compare_page(c: &Comparison) -> String {
    let mut body = String::new();
    let mut processes: Vec<&str> = c.rows.iter().map(|r| r.process.as_str()).collect();
    processes.dedup();
    for name in processes {
        let rows: Vec<_> = c.rows.iter().filter(|r| r.process == name).collect();
        let _ = write!(body, r#"<section class="process"><h2>{}</h2>"#, esc(name));
        for group in ["role", "cause"] {
            let g: Vec<_> = rows.iter().filter(|r| r.group == group).collect();
            if g.is_empty() {
                continue;
            }
            let labels: Vec<String> = g.iter().map(|r| r.key.clone()).collect();
            let _ = write!(
                body,
                "<h3>Writes and write wait by {group}</h3><div class=\"grid\">"
            );
            body.push_str(&bars(
                &format!("writes-by-{group}"),
                &labels,
                &[
                    ("before", g.iter().map(|r| r.writes.before.mean).collect()),
                    ("after", g.iter().map(|r| r.writes.after.mean).collect()),
                ],
                Unit::Count,
            ));
            body.push_str(&bars(
                &format!("wait-by-{group}"),
                &labels,
                &[
                    ("before", g.iter().map(|r| r.wait_ns.before.mean).collect()),
                    ("after", g.iter().map(|r| r.wait_ns.after.mean).collect()),
                ],
                Unit::Ns,
            ));
            body.push_str("</div>");
        }
        body.push_str("<h3>Figures</h3><table><tr><th></th><th>writes</th><th>after</th><th>ratio</th><th>write wait</th><th>after</th><th>ratio</th><th>mean</th><th>after</th><th>ratio</th><th>p99</th><th>after</th><th>ratio</th><th>writes</th></tr>");
        for r in rows {
            let label = if r.group == "all" {
                "all".to_string()
            } else {
                format!("{} {}", r.group, r.key)
            };
            let _ = write!(
                body,
                "<tr><td>{}</td>{}{}{}{}<td>{}</td></tr>",
                esc(&label),
                cell(&r.writes, false),
                cell(&r.wait_ns, true),
                cell(&r.mean_wait_ns, true),
                cell(&r.p99_wait_ns, true),
                r.writes.verdict
            );
        }
        body.push_str("</table></section>");
    }
    if c.before.runs < 2 || c.after.runs < 2 {
        body.push_str(r#"<p class="note">One run per side: run-to-run noise cannot be judged. Concatenate several runs per side to have it judged.</p>"#);
    }
    page(
        "mmaplock-prof: before and after",
        &format!(
            "{} ({} runs) → {} ({} runs)",
            c.before.file, c.before.runs, c.after.file, c.after.runs
        ),
        &body,
    )
}
