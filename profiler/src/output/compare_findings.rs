//! `compare`, per finding: did the after-run remove it? Each run's findings are recomputed
//! from its summary; a finding is followed by its process's group (`--by`) and pattern, its
//! share of the threads' time compared over the runs of each side as `compare` compares any
//! figure.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::output::{
    compare::{Change, Spread},
    findings::{self, Effect, Finding, StudyEffects},
    report::Report,
    text::fmt_share,
};

/// One side's view of a finding.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Presence {
    /// Runs in which it was found, of `runs`.
    pub present: usize,
    pub runs: usize,
    /// Its share of the threads' time (0 in a run without it), over the runs.
    pub share: Spread,
    /// Its severity in the most severe run, when present.
    pub severity: Option<findings::Severity>,
}

impl Presence {
    /// Its mean share of the threads' time, as shown; None when it was in no run.
    pub fn mean_share(&self) -> Option<String> {
        (self.present > 0).then(|| fmt_share(self.share.mean))
    }
}

/// A finding before and after.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FindingChange {
    /// The group of the processes it was found in (`--by`).
    pub process: String,
    pub id: String,
    /// The finding's title, from the last run that had it (before, else after).
    pub title: String,
    pub before: Presence,
    pub after: Presence,
    /// `removed` (in no after-run), `reduced` or `worse` (its share changed beyond the
    /// runs' noise, or by a quarter with one run a side), `unchanged`, `within noise`, or
    /// `new` (in no before-run).
    pub verdict: &'static str,
    /// With `--study`: what the advice measured on the study's host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<Effect>,
}

/// The share a finding is compared by: of the threads' time, else its lower bound, else
/// of the process's wait (reports of older builds).
fn share(f: &Finding) -> f64 {
    f.time_share
        .or(f.time_share_bound)
        .unwrap_or(f.share_of_wait)
}

type Key = (String, String);

/// A run's findings per (group, pattern): of the processes of one group, the one whose share
/// is largest. Kept per run by `compare` as it reads (not the summaries).
pub type RunFindings = BTreeMap<Key, Finding>;

/// The findings of one run's summary, each in the group `group` gives its process.
pub fn per_run(summary: &Report, group: &dyn Fn(&Finding) -> String) -> RunFindings {
    let mut m = RunFindings::new();
    for f in findings::find(summary, None) {
        let k = (group(&f), f.id.clone());
        if m.get(&k).is_none_or(|g| share(g) < share(&f)) {
            m.insert(k, f);
        }
    }
    m
}

fn presence(runs: &[BTreeMap<Key, Finding>], k: &Key) -> (Presence, Vec<f64>) {
    let shares: Vec<f64> = runs.iter().map(|m| m.get(k).map_or(0.0, share)).collect();
    let found: Vec<&Finding> = runs.iter().filter_map(|m| m.get(k)).collect();
    (
        Presence {
            present: found.len(),
            runs: runs.len(),
            share: Spread::of(&shares),
            severity: found.iter().map(|f| f.severity).max(),
        },
        shares,
    )
}

/// The findings of both sides' runs, before against after (with a study, each quotes what
/// its advice measured on the study's host).
pub fn changes(
    b: &[RunFindings],
    a: &[RunFindings],
    study: Option<&StudyEffects>,
) -> Vec<FindingChange> {
    let mut keys: Vec<&Key> = b.iter().chain(a).flat_map(|m| m.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            let (pb, sb) = presence(b, k);
            let (pa, sa) = presence(a, k);
            let change = Change::of(&sb, &sa);
            let verdict = if pa.present == 0 {
                "removed"
            } else if pb.present == 0 {
                "new"
            } else {
                match (change.verdict, change.ratio) {
                    ("changed", Some(r)) if r < 1.0 => "reduced",
                    ("changed", _) => "worse",
                    ("one run", Some(r)) if r <= 0.75 => "reduced",
                    ("one run", Some(r)) if r >= 1.25 => "worse",
                    ("one run", _) => "unchanged",
                    _ => "within noise",
                }
            };
            let last =
                |runs: &[BTreeMap<Key, Finding>]| runs.iter().rev().find_map(|m| m.get(k)).cloned();
            let mut f = last(b).or_else(|| last(a));
            if let Some(f) = f.as_mut() {
                f.add_measured(study);
            }
            FindingChange {
                process: k.0.clone(),
                id: k.1.clone(),
                title: f.as_ref().map_or(String::new(), |f| f.title.clone()),
                measured: f.map(|f| f.measured).unwrap_or_default(),
                before: pb,
                after: pa,
                verdict,
            }
        })
        .collect()
}

/// The findings' changes as text, after the figures.
pub fn to_text(changes: &[FindingChange]) -> String {
    if changes.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n  findings (docs/findings.md), share of the threads' time before -> after:\n",
    );
    for c in changes {
        let side = |p: &Presence| match p.mean_share() {
            None => "-".to_string(),
            Some(share) => format!("{share} ({}/{} runs)", p.present, p.runs),
        };
        out.push_str(&format!(
            "  {:<12} {:<20} {:>20} -> {:<20} {}\n",
            c.process,
            c.id,
            side(&c.before),
            side(&c.after),
            c.verdict
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregation::{DurationHist, SideStats},
        output::{
            fixtures,
            report::{CauseReport, Stats},
            share::RoleShare,
        },
        registry::roles::Role,
    };

    /// A summary whose Worker threads made `mprotects` arena-growth writes that waited
    /// `wait_ns`, in 4 s of their time.
    fn run(mprotects: u64, wait_ns: u64) -> RunFindings {
        let stats = Stats::new(&SideStats {
            count: mprotects,
            failed: 0,
            wait: DurationHist::from_upper_bounds(wait_ns, wait_ns, [(1 << 20, mprotects)]),
            hold: DurationHist::default(),
        });
        let share = fixtures::time_share(wait_ns, 4_000_000_000, 1);
        let mut p = fixtures::process(1, "node", 0, false);
        p.lock.write = stats.clone();
        p.lock.read = Stats::default();
        p.lock.causes = Vec::new();
        p.threads.truncate(1);
        p.threads[0].role = Role::Worker;
        p.threads[0].lock.write = stats.clone();
        p.threads[0].lock.causes = vec![CauseReport {
            cause: "mprotect".into(),
            write: stats,
        }];
        p.time_share_by_role = Some(vec![RoleShare {
            role: Role::Worker,
            share: share.clone(),
        }]);
        p.time_share = Some(share);
        per_run(&fixtures::summary(vec![p]), &|f| f.comm.clone())
    }

    fn verdict(before: &[(u64, u64)], after: &[(u64, u64)]) -> FindingChange {
        let side = |v: &[(u64, u64)]| v.iter().map(|&(n, w)| run(n, w)).collect::<Vec<_>>();
        let c = changes(&side(before), &side(after), None);
        c.into_iter()
            .find(|c| c.id == "arena-growth")
            .expect("arena-growth on one side")
    }

    #[test]
    fn a_finding_is_removed_reduced_unchanged_or_new() {
        // 400 ms of 4 s (10%) before; after, too few writes to be a finding.
        let c = verdict(&[(2000, 400_000_000)], &[(5, 1_000)]);
        assert_eq!(c.verdict, "removed");
        assert_eq!((c.before.present, c.after.present), (1, 0));
        assert_eq!(c.before.share.mean, 0.1);
        assert_eq!(c.before.severity, Some(findings::Severity::High));
        assert_eq!(c.after.share.mean, 0.0);
        // Still there at a third of the share.
        assert_eq!(
            verdict(&[(2000, 400_000_000)], &[(900, 120_000_000)]).verdict,
            "reduced"
        );
        assert_eq!(
            verdict(&[(2000, 400_000_000)], &[(2100, 390_000_000)]).verdict,
            "unchanged"
        );
        // Repeated runs: judged against their spread.
        let noisy = verdict(
            &[(2000, 400_000_000), (2000, 200_000_000)],
            &[(2000, 300_000_000), (2000, 250_000_000)],
        );
        assert_eq!(noisy.verdict, "within noise");
        let better = verdict(
            &[(2000, 400_000_000), (2000, 380_000_000)],
            &[(2000, 100_000_000), (2000, 120_000_000)],
        );
        assert_eq!(better.verdict, "reduced");
        assert_eq!(
            verdict(&[(5, 1_000)], &[(2000, 400_000_000)]).verdict,
            "new"
        );
        let text = to_text(&[better]);
        assert!(
            text.contains("arena-growth") && text.contains("9.8% (2/2 runs)"),
            "{text}"
        );
    }
}
