//! What the agent makes of an interval's sampled stacks: each process's aggregate for the
//! `/debug/pprof/mmaplock` ring, labelled as its metrics are, and the interval line's sampled
//! writes (`dsos`), against which a scrape's totals can be checked.

use std::collections::BTreeMap;

use crate::{
    aggregation::{Attribution, ThreadAgg, Window},
    output::report::{self, ProcessReport, Report},
    registry::{
        roles::{Role, comm_str},
        stacks::OwnerStacks,
    },
    vocab::ids::{ProcId, ThreadId},
};

/// Each process's sampled stacks of the interval (the threads' roles and names as the window
/// knows them), with the labels `labels` gives it.
pub(super) fn interval_samples(
    owners: &BTreeMap<ProcId, OwnerStacks>,
    window: &Window,
    attribution: &Attribution,
    mut labels: impl FnMut(ProcId) -> Vec<(&'static str, String)>,
) -> Vec<super::profiles::ProcessSampled> {
    (owners.iter())
        .filter(|(_, o)| !o.samples.is_empty())
        .map(|(&p, o)| {
            let threads = window.processes.get(&p);
            let s = report::sampled_stacks_by(o, |tid| thread_of(p, tid, threads, attribution));
            (p, labels(p), s)
        })
        .collect()
}

/// A sampled thread's role and name, as the window knows it (`other` when it does not).
fn thread_of(
    p: ProcId,
    tid: u32,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    attribution: &Attribution,
) -> (Role, String) {
    let found = threads.and_then(|m| m.iter().rev().find(|(t, _)| t.tid == tid));
    match found {
        Some((&t, agg)) => (attribution.role(p, t, agg), comm_str(&agg.comm)),
        None => (Role::Other, String::new()),
    }
}

/// An interval line's sampled writes by code (`dsos`), so that what a scrape of
/// `/debug/pprof/mmaplock` counts can be checked against the agent's NDJSON; a process whose
/// samples came without any acquisition in the interval gets an entry of its own.
pub(super) fn add_sampled_writes(
    r: &mut Report,
    owners: &BTreeMap<ProcId, OwnerStacks>,
    mut name: impl FnMut(ProcId) -> String,
) {
    for p in &mut r.processes {
        let o = owners.get(&ProcId::new(p.pid, p.start_ticks));
        p.dsos = Some(report::dso_reports(o));
    }
    for (&id, o) in owners {
        let listed = (r.processes.iter()).any(|p| ProcId::new(p.pid, p.start_ticks) == id);
        if !listed && !o.dsos.is_empty() {
            r.processes.push(ProcessReport {
                pid: id.pid,
                start_ticks: id.start,
                comm: name(id),
                dsos: Some(report::dso_reports(Some(o))),
                ..ProcessReport::default()
            });
        }
    }
}
