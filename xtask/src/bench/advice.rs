//! What a finding's advice gives back, against what the finding predicted: the lanes fixture
//! (tests/src/lanes.rs: `tests/fixtures/addon/lanes.c` as a Node addon behind
//! `hashserver.js`, loaded by the closed-loop `loadgen.js`) in the story's two shapes
//! (tests/tests/story.rs). A profiled run of each shape gives the headline finding's impact
//! (its kind, and the throughput it says removing its wait could give back at most), and a
//! profiled run with its advice applied what the advice leaves of the mechanism's writes and
//! wait. Then interleaved rounds with no profiler, each the base, the advice applied and the
//! base again (the A/A), the order rotating: the advice's measured gain in requests per second
//! beside the machine's noise. Nothing asserts: each shape is printed with its verdict.

mod lanes;

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{
    capture::{last_line, started, wait},
    stats::{Spread, json_of},
};
use lanes::{SHAPES, Server, Shape, build_addon, cannot_shape, load, throughput};

/// What the profiled runs said: the finding's impact, and its writes and wait before and with
/// the advice (none left when the finding is gone).
#[derive(Clone, Debug)]
pub struct Predicted {
    pub kind: String,
    pub gain: f64,
    pub writes: [u64; 2],
    pub wait_ns: [u64; 2],
    /// No such finding with the advice (its writes and wait after are 0).
    pub gone: bool,
}

/// A round of one shape: requests per second of the base, the advice applied, the base again.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub base: f64,
    pub tuned: f64,
    pub base2: f64,
}

pub struct ShapeRun {
    pub shape: &'static Shape,
    /// Err: why there is no prediction (the finding absent from the base run).
    pub predicted: std::result::Result<Predicted, String>,
    pub rounds: Vec<Round>,
}

/// The section's runs and the load average (`/proc/loadavg`) before and after them, or why it
/// could not run here.
pub type Outcome = std::result::Result<(Vec<ShapeRun>, [String; 2]), String>;

fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// One profiled run (`-p PID -i 0 --blockers --stack-sample 4`, SIGINT once the client is
/// done): the summary's finding `s.finding`, if any.
fn profiled(prof: &Path, addon: &Path, s: &Shape, advice: bool, dir: &Path) -> Result<Value> {
    let server = Server::start(addon, s, advice)?;
    let out = dir.join(format!("advice-{}-{advice}.json", s.finding));
    let mut cmd = Command::new(prof);
    cmd.args([
        "-p",
        &server.child.0.id().to_string(),
        "-i",
        "0",
        "--blockers",
    ])
    .args(["--stack-sample", "4", "-f", "json", "-o"])
    .arg(&out);
    let mut p = started(cmd, "attached in")?;
    load(s, &server)?;
    // SAFETY: a signal to our own child; it writes its summary and ends.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGINT) };
    wait(&mut p, Duration::from_secs(120))?;
    server.stop(s)?;
    let summary = last_line(&out)?;
    if summary["type"] != "summary" {
        bail!("{}: no summary in {}", s.name, out.display());
    }
    let found =
        (summary["findings"].as_array().into_iter().flatten()).find(|f| f["id"] == s.finding);
    Ok(found.cloned().unwrap_or(Value::Null))
}

fn predict(prof: &Path, addon: &Path, s: &'static Shape, dir: &Path) -> Result<ShapeRun> {
    let before = profiled(prof, addon, s, false, dir)?;
    let after = profiled(prof, addon, s, true, dir)?;
    let n = |f: &Value, k: &str| f[k].as_u64().unwrap_or(0);
    let predicted = match (
        before["impact"]["kind"].as_str(),
        before["impact"]["throughput_gain"].as_f64(),
    ) {
        (Some(kind), Some(gain)) => Ok(Predicted {
            kind: kind.to_string(),
            gain,
            writes: [n(&before, "writes"), n(&after, "writes")],
            wait_ns: [n(&before, "wait_ns"), n(&after, "wait_ns")],
            gone: after.is_null(),
        }),
        _ if before.is_null() => Err(format!("no {} finding in the profiled run", s.finding)),
        _ => Err(format!("the {} finding has no impact", s.finding)),
    };
    eprintln!("advice, {}: predicted {predicted:?}", s.name);
    Ok(ShapeRun {
        shape: s,
        predicted,
        rounds: Vec::new(),
    })
}

/// The profiled runs of each shape, then `rounds` interleaved rounds of both.
pub fn run(rounds: usize, prof: &Path, dir: &Path) -> Result<Outcome> {
    if let Some(why) = cannot_shape() {
        eprintln!("advice: skipped: {why}");
        return Ok(Err(why));
    }
    let addon = build_addon(dir)?;
    let load_before = loadavg();
    let mut runs = Vec::new();
    for s in &SHAPES {
        runs.push(predict(prof, &addon, s, dir)?);
    }
    for round in 0..rounds {
        for r in &mut runs {
            // The base, the advice, the base again (0, 1, 2): rotating from round to round.
            let mut per_s = [0.0; 3];
            for k in 0..3 {
                let which = (round + k) % 3;
                per_s[which] = throughput(&addon, r.shape, which == 1)?;
            }
            let [base, tuned, base2] = per_s;
            eprintln!(
                "advice round {}/{rounds}, {}: base {base:.1}, advice {tuned:.1}, base again {base2:.1} requests/s",
                round + 1,
                r.shape.name
            );
            r.rounds.push(Round { base, tuned, base2 });
        }
    }
    Ok(Ok((runs, [load_before, loadavg()])))
}

/// The verdict of a prediction `p` against a measured gain `g` (median), `noise` the largest
/// A/A deviation from 0: the bound holds when g <= p + noise; a throughput finding whose
/// bound stands above the noise also says a gain shows (g > noise); a latency finding, that
/// nothing is lost (g >= -noise).
fn verdict(kind: &str, p: f64, g: f64, noise: f64) -> String {
    let pct = |x: f64| format!("{:+.1}%", x * 100.0);
    let within = format!("within the noise, ±{:.1}%", noise * 100.0);
    if g > p + noise {
        return format!(
            "NOT matched: gains {} beyond the bound and the noise",
            pct(g - p - noise)
        );
    }
    if g < -noise {
        return format!("NOT matched: loses {} beyond the noise", pct(g + noise));
    }
    if kind == "throughput" && p > noise && g <= noise {
        return "NOT matched: no gain beyond the noise, where throughput was promised".into();
    }
    if kind == "throughput" && p <= noise {
        return format!("matches ({within}, the bound too: the kind is not told apart)");
    }
    format!("matches ({within})")
}

pub fn summarize(outcome: &Outcome) -> (Value, String) {
    let mut md = String::from("## What a finding's advice gives back, against its prediction\n\n");
    let (runs, load) = match outcome {
        Err(why) => {
            md.push_str(&format!("Skipped: {why}.\n"));
            return (json!({ "skipped": why }), md);
        }
        Ok((runs, load)) => (runs, load),
    };
    let rounds = runs.first().map_or(0, |r| r.rounds.len());
    md.push_str(&format!(
        "The lanes fixture (tests/src/lanes.rs) in the story's shapes (tests/tests/story.rs). \
         Predicted: a profiled run (`-p PID -i 0 --blockers --stack-sample 4`) of the base, its \
         headline finding's impact (`kind`, and `throughput_gain`: at most that much more work \
         per second); the same with the advice applied, what it leaves of the finding's writes \
         and wait. Measured: {rounds} interleaved rounds with no profiler, each the base, the \
         advice applied and the base again, the order rotating; per round, gain = advice / base \
         - 1 and A/A = base again / base - 1 in requests per second: median (min - max). \
         Verdict: with noise the largest A/A deviation from 0, the bound holds when the median \
         gain is at most the prediction plus the noise, and nothing is lost when it is at least \
         minus the noise; a throughput finding whose bound stands above the noise also needs a \
         gain above the noise. Load average (1, 5, 15 min) before the runs: {}; after: {}.\n\n\
         | shape | finding, advice | predicted: kind, gain at most | measured gain | A/A | writes before -> after | wait before -> after (ms) | verdict |\n\
         |---|---|---|---|---|---|---|---|\n",
        load[0], load[1]
    ));
    let pct = |s: Option<Spread>| s.map_or("-".into(), |s| s.show_pct());
    let mut shapes = Vec::new();
    for r in runs {
        let gain = Spread::of(r.rounds.iter().map(|x| x.tuned / x.base - 1.0));
        let aa = Spread::of(r.rounds.iter().map(|x| x.base2 / x.base - 1.0));
        let noise = aa.map(|a| a.min.abs().max(a.max.abs()));
        let verdict = match (&r.predicted, gain, noise) {
            (Ok(p), Some(g), Some(n)) => verdict(&p.kind, p.gain, g.median, n),
            (Err(why), ..) => format!("no prediction: {why}"),
            _ => "not measured".into(),
        };
        let (kind, writes, wait) = match &r.predicted {
            Ok(p) => (
                format!("{}, {:+.1}%", p.kind, p.gain * 100.0),
                format!(
                    "{} -> {}{}",
                    p.writes[0],
                    p.writes[1],
                    if p.gone { " (no finding)" } else { "" }
                ),
                format!(
                    "{:.1} -> {:.1}",
                    p.wait_ns[0] as f64 / 1e6,
                    p.wait_ns[1] as f64 / 1e6
                ),
            ),
            Err(_) => ("-".into(), "-".into(), "-".into()),
        };
        md.push_str(&format!(
            "| {} | {}, `{}={}` | {kind} | {} | {} | {writes} | {wait} | {verdict} |\n",
            r.shape.name,
            r.shape.finding,
            r.shape.advice.0,
            r.shape.advice.1,
            pct(gain),
            pct(aa),
        ));
        shapes.push(json!({
            "shape": r.shape.name,
            "finding": r.shape.finding,
            "advice": format!("{}={}", r.shape.advice.0, r.shape.advice.1),
            "predicted": match &r.predicted {
                Ok(p) => json!({
                    "kind": p.kind, "throughput_gain": p.gain,
                    "writes_before": p.writes[0], "writes_after": p.writes[1],
                    "wait_ns_before": p.wait_ns[0], "wait_ns_after": p.wait_ns[1],
                    "gone_after": p.gone,
                }),
                Err(why) => json!({ "missing": why }),
            },
            "gain": json_of(gain, 4),
            "aa": json_of(aa, 4),
            "verdict": verdict,
            "rounds": r.rounds.iter().map(|x| json!({
                "base_per_s": x.base, "advice_per_s": x.tuned, "base_again_per_s": x.base2,
            })).collect::<Vec<_>>(),
        }));
    }
    let loadavg = json!({ "before": load[0], "after": load[1] });
    (
        json!({ "rounds": rounds, "loadavg": loadavg, "shapes": shapes }),
        md,
    )
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn verdicts() {
        // Latency, +0.2% at most: no move beyond the noise matches; a gain or a loss beyond it
        // does not.
        assert_eq!(
            verdict("latency", 0.002, 0.01, 0.03),
            "matches (within the noise, ±3.0%)"
        );
        assert!(verdict("latency", 0.002, 0.05, 0.03).starts_with("NOT matched: gains +1.8%"));
        assert!(verdict("latency", 0.002, -0.05, 0.03).starts_with("NOT matched: loses -2.0%"));
        // Throughput, +9% at most: a gain above the noise within the bound matches; none
        // does not; a bound within the noise cannot tell the kind.
        assert!(verdict("throughput", 0.09, 0.06, 0.02).starts_with("matches"));
        assert!(verdict("throughput", 0.09, 0.01, 0.02).contains("no gain"));
        assert!(verdict("throughput", 0.01, 0.0, 0.02).contains("not told apart"));
    }
}
