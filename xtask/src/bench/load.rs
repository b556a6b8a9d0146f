//! mmaplock-prof's attach as it accounts for it itself, over the rounds.

use super::stats::Spread;

/// mmaplock-prof's own account of its attach (its summary's `overhead.load`): total, each
/// step, and each program's verification (instructions, ms), over the rounds.
#[derive(Clone, Debug, Default)]
pub(super) struct LoadFigures {
    pub(super) total_ms: Option<Spread>,
    pub(super) steps: Vec<(String, Option<Spread>)>,
    pub(super) programs: Vec<(String, Option<Spread>, Option<Spread>)>,
}

/// The medians of the summaries' `overhead.load` over the rounds.
pub(super) fn load_figures(loads: &[&serde_json::Value]) -> Option<LoadFigures> {
    let first = loads.first()?;
    let names = |key: &str, field: &str| -> Vec<String> {
        first[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| {
                        if field.is_empty() {
                            x[0].as_str()
                        } else {
                            x[field].as_str()
                        }
                        .map(String::from)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let step_ms = |name: &str| {
        Spread::of(
            loads
                .iter()
                .filter_map(|l| l["steps"].as_array()?.iter().find(|x| x[0] == name)?[1].as_f64()),
        )
    };
    let prog = |name: &str, field: &str| {
        Spread::of(loads.iter().filter_map(|l| {
            l["programs"]
                .as_array()?
                .iter()
                .find(|x| x["name"] == name)?[field]
                .as_f64()
        }))
    };
    Some(LoadFigures {
        total_ms: Spread::of(loads.iter().filter_map(|l| l["total_ms"].as_f64())),
        steps: names("steps", "")
            .into_iter()
            .map(|n| {
                let s = step_ms(&n);
                (n, s)
            })
            .collect(),
        programs: names("programs", "name")
            .into_iter()
            .map(|n| {
                let (i, m) = (prog(&n, "verified_insns"), prog(&n, "ms"));
                (n, i, m)
            })
            .collect(),
    })
}
